"""Real workers end to end: an in-process burst HubWorker in the main thread, and `rsnotify
worker` subprocesses killed with SIGKILL or cut off from a restarted Redis; loopback
subscribers run in a background thread."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import redis as redis_lib
import redis.asyncio as redis_async
from rq import Queue

from rsnotify.hub import enqueue, keys, store
from rsnotify.hub.crypto import encrypt_secret, load_fernet
from rsnotify.hub.settings import HubSettings
from rsnotify.hub.worker import reconciler
from rsnotify.hub.worker.process import HubWorker
from rsnotify.hub.redis_server import start_redis_server
from rsnotify.websub import SEQUENCE_HEADER, SIGNATURE_HEADER, verify_signature
from rsnotify.hub.enqueue import make_queue
from tests.support import cli
from tests.support.ports import free_port
from tests.support.subscribers import hang
from tests.support.waiting import wait_until

TOPIC = "http://source.example.org/feed"


def body(n: int) -> bytes:
    return b"<urlset><url><loc>http://example.com/r%d</loc></url></urlset>" % n


def subscribe(settings: HubSettings, callback: str, secret: str | None = None, url: str | None = None) -> str:
    async def go() -> str:
        client = redis_async.Redis.from_url(url or settings.redis_url)
        try:
            sid, _ = await store.activate_subscription(client, TOPIC, callback, lease_seconds=3600, now=time.time(),
                                                       secret=encrypt_secret(load_fernet(settings), secret))
            return sid
        finally:
            await client.aclose()
    return asyncio.run(go())


def publish(settings: HubSettings, queue: Queue, bodies: list[bytes], url: str | None = None) -> list[bool]:
    """Append each body and ensure a fan-out, as the hub's handler does; True per queued job."""
    async def go() -> list[bool]:
        client = redis_async.Redis.from_url(url or settings.redis_url)
        queued = []
        try:
            for data in bodies:
                appended = await store.append_notification(client, TOPIC, data, content_type="application/xml",
                                                           now=time.time(), max_len=settings.log_max_len)
                queued.append(await enqueue.ensure_fan_out(queue, appended.topic_id, redis=client))
        finally:
            await client.aclose()
        return queued
    return asyncio.run(go())


def sequences(sink, path: str) -> list[int]:
    return [int(r.headers[SEQUENCE_HEADER]) for r in sink.deliveries(path)]


def assert_in_order_at_least_once(seqs: list[int], count: int) -> None:
    """Every notification 1..count arrived, first copies in order, and nothing ever skipped ahead."""
    high = 0
    firsts = []
    for seq in seqs:
        assert seq <= high + 1, f"sequence jumped from {high} to {seq}: {seqs}"
        if seq == high + 1:
            firsts.append(seq)
        high = max(high, seq)
    assert firsts == list(range(1, count + 1))


def test_burst_worker_delivers_publishes_in_order_and_bursts_queue_few_jobs(fanout_settings, redis, sink) -> None:
    queue = make_queue(fanout_settings.queue_name, redis)
    subscribe(fanout_settings, sink.url("/a?id=1"))
    subscribe(fanout_settings, sink.url("/b"), secret="sesame")
    queued = publish(fanout_settings, queue, [body(n) for n in range(25)])
    assert sum(queued) == 1 and len(queue) == 1                      # one job for the burst

    HubWorker([queue], connection=redis, settings=fanout_settings).work(burst=True)

    assert sink.bodies("/a") == sink.bodies("/b") == [body(n) for n in range(25)]
    signed = [(r.body, r.headers) for r in sink.deliveries("/b")]
    queries = {r.raw_query for r in sink.deliveries("/a")}
    assert all(verify_signature(data, "sesame", headers[SIGNATURE_HEADER]) for data, headers in signed)
    assert queries == {"id=1"}
    # the job cleared its flag: the next publish queues the next fan-out
    assert publish(fanout_settings, queue, [body(25)]) == [True]


def test_burst_worker_retries_a_failing_subscriber_alone(fanout_settings, redis, sink) -> None:
    # retries 0.1-0.4 s out; queue_due below hands each to a burst worker once it is due
    settings = fanout_settings.with_values(retry_base=0.2, retry_cap=0.4)
    queue = make_queue(settings.queue_name, redis)
    sink.on("/flaky", lambda request: 500 if sink.count("/flaky") <= 2 else 200)   # the first two fail
    subscribe(settings, sink.url("/flaky"))
    subscribe(settings, sink.url("/fine"))
    publish(settings, queue, [body(n) for n in range(10)])
    HubWorker([queue], connection=redis, settings=settings).work(burst=True)
    assert sink.bodies("/fine") == [body(n) for n in range(10)]
    deadline = time.monotonic() + 30
    while len(sink.bodies("/flaky")) < 12 and time.monotonic() < deadline:   # due retries become jobs
        time.sleep(0.05)
        if reconciler.queue_due(queue):
            HubWorker([queue], connection=redis, settings=settings).work(burst=True)
    assert sink.bodies("/flaky") == [body(0)] * 3 + [body(n) for n in range(1, 10)]


def test_reconciler_requeues_a_lagging_subscription_whose_claim_expired(fanout_settings, redis, sink) -> None:
    queue = make_queue(fanout_settings.queue_name, redis)
    sid = subscribe(fanout_settings, sink.url("/orphan"))
    publish(fanout_settings, queue, [body(n) for n in range(3)])
    queue.empty()                               # the fan-out job died with its worker
    redis.delete(keys.fanout_queued_key(keys.topic_id(TOPIC)))
    # claimed by a worker that dies now: its heartbeat ends in 300 ms, long before its 60 s lock
    redis.set(keys.sub_lock_key(sid), "dying-worker:1", px=60_000)
    redis.set(keys.worker_alive_key("dying-worker"), 1, px=300)
    settings = fanout_settings.with_values(reconcile_interval=0.1)
    assert reconciler.reconcile(queue, settings, now=time.time() + 1) == 0     # still claimed
    wait_until(lambda: not redis.exists(keys.worker_alive_key("dying-worker")), 5, "the dying worker's heartbeat to end")
    assert reconciler.reconcile(queue, settings, now=time.time() + 1) == 1
    HubWorker([queue], connection=redis, settings=settings).work(burst=True)
    assert sink.bodies("/orphan") == [body(n) for n in range(3)]
    settled: dict[str, str] = {}
    assert reconciler.reconcile(queue, settings, now=time.time() + 1, settled=settled) == 0
    assert settled                              # a caught-up topic is not read again


def test_log_is_trimmed_by_age(fanout_settings, redis) -> None:
    queue = make_queue(fanout_settings.queue_name, redis)
    publish(fanout_settings, queue, [body(n) for n in range(3)])
    key = keys.topic_log_key(keys.topic_id(TOPIC))
    reconciler.trim_logs(redis, fanout_settings.with_values(log_max_age=3600), now=time.time())
    assert redis.xlen(key) == 3
    reconciler.trim_logs(redis, fanout_settings.with_values(log_max_age=3600), now=time.time() + 7200)
    assert redis.xlen(key) == 0


# --- `rsnotify worker` subprocesses -----------------------------------------------------------

def start_worker(settings: HubSettings, tmp_path: Path, name: str, redis_url: str | None = None) -> subprocess.Popen:
    env = {**settings.to_env(), "RSNOTIFY_REDIS_URL": redis_url or settings.redis_url, "RSNOTIFY_LOG_LEVEL": "WARNING"}
    return cli.start("worker", "--name", name, log=tmp_path / f"{name}.log", env=env, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    cli.stop(process, signal.SIGTERM, timeout=15)


def test_worker_killed_mid_fan_out_loses_nothing(fanout_settings, redis, sink, tmp_path) -> None:
    settings = fanout_settings.with_values(lock_ttl=1, reconcile_interval=0.3, retry_base=0.05)
    queue = make_queue(settings.queue_name, redis)
    paths = ["/k1", "/k2", "/k3"]
    for path in paths:
        sink.on(path, hang(0.01))                           # ~10 ms per delivery: a long fan-out
        subscribe(settings, sink.url(path), secret="k" if path == "/k2" else None)
    first = start_worker(settings, tmp_path, "first")
    second = None
    try:
        publish(settings, queue, [body(n) for n in range(200)])
        wait_until(lambda: len(sink.bodies("/k1")) >= 40, 90, "the first deliveries", logs=tmp_path)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        delivered_when_killed = len(sink.bodies("/k1"))
        assert delivered_when_killed < 200
        second = start_worker(settings, tmp_path, "second")
        wait_until(lambda: all(len(set(sink.bodies(p))) == 200 for p in paths), 90, "every notification", logs=tmp_path)
    finally:
        stop(first)
        if second is not None:
            stop(second)
    for path in paths:
        assert_in_order_at_least_once(sequences(sink, path), 200)


def test_redis_restarted_from_its_aof_mid_stream_loses_nothing(fanout_settings, sink, tmp_path) -> None:
    port = free_port()       # the restart below binds it again
    server = start_redis_server(tmp_path / "redis", port=port, unix_socket=False)
    url = server.url
    settings = fanout_settings.with_values(redis_url=url, lock_ttl=1, reconcile_interval=0.3, retry_base=0.05)
    connection = redis_lib.Redis.from_url(url)
    queue = make_queue(settings.queue_name, connection)
    worker = None
    try:
        sink.on("/r1", hang(0.05))                          # so Redis stops mid-stream
        sink.on("/r2", hang(0.05))
        subscribe(settings, sink.url("/r1"), url=url)
        subscribe(settings, sink.url("/r2"), secret="s", url=url)
        worker = start_worker(settings, tmp_path, "survivor", redis_url=url)
        publish(settings, queue, [body(n) for n in range(40)], url=url)
        wait_until(lambda: len(sink.bodies("/r1")) >= 5, 90, "the first deliveries", logs=tmp_path)
        server.stop()                       # SIGTERM: Redis writes its AOF and exits
        connection.connection_pool.disconnect()
        server = start_redis_server(tmp_path / "redis", port=port, unix_socket=False)
        publish(settings, queue, [body(n) for n in range(40, 80)], url=url)
        wait_until(lambda: all(len(set(sink.bodies(p))) == 80 for p in ("/r1", "/r2")), 90, "every notification",
                   logs=tmp_path)
        assert worker.poll() is None, "the worker survived the Redis restart"
    finally:
        if worker is not None:
            stop(worker)
        connection.close()
        server.stop()
    for path in ("/r1", "/r2"):
        assert_in_order_at_least_once(sequences(sink, path), 80)


def test_waiting_verifications_get_a_job_again_when_theirs_was_lost(fanout_settings, redis) -> None:
    queue = make_queue(fanout_settings.queue_name, redis)
    assert not reconciler.requeue_verifications(queue)          # nothing waits
    redis.rpush(keys.verify_pending_key(), "challenge-1")
    redis.set(keys.verify_queued_key(), 1, ex=60)
    assert not reconciler.requeue_verifications(queue)          # its job is queued
    redis.delete(keys.verify_queued_key())                      # ...and was lost with its worker
    assert reconciler.requeue_verifications(queue)
    assert [job.func_name for job in queue.get_jobs()] == ["rsnotify.hub.worker.jobs.verify_pending"]


def test_a_stopping_worker_hands_back_a_subscription_stuck_on_a_hanging_callback(fanout_settings, redis, sink,
                                                                                   tmp_path) -> None:
    settings = fanout_settings.with_values(delivery_timeout=30.0, lock_ttl=60)
    queue = make_queue(settings.queue_name, redis)
    sink.on("/stuck", hang(20))
    sid = subscribe(settings, sink.url("/stuck"))
    worker = start_worker(settings, tmp_path, "stopping")
    try:
        publish(settings, queue, [body(0)])
        wait_until(lambda: len(sink.bodies("/stuck")) == 1, 90, "the hanging delivery", logs=tmp_path)
        assert redis.exists(keys.sub_lock_key(sid))
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(15)
        assert time.monotonic() - started < 9           # within docker's 10 s
    finally:
        stop(worker)
    assert not redis.exists(keys.sub_lock_key(sid))    # another worker may take it at once
    assert redis.hget(keys.sub_key(sid), "cursor_seq") == b"0"   # not confirmed: it will be sent again


def test_a_retry_already_due_when_its_run_lets_go_is_sent_at_once(fanout_settings, redis, sink, tmp_path) -> None:
    # A retry_base of a microsecond: the backoff has always passed by the time the failed run
    # lets go of the subscription. The retry must go out through the retry lane (a tick, 20 ms),
    # not wait for the reconciler, which looks at a topic only once its newest entry is older
    # than reconcile_interval (5 s by default) and so would resend it 5-10 s later.
    settings = fanout_settings.with_values(retry_base=0.000001, retry_cap=0.000002, reconcile_interval=5.0)
    queue = make_queue(settings.queue_name, redis)
    sink.on("/once", lambda request: 500 if sink.count("/once") == 1 else 200)     # the first attempt fails
    subscribe(settings, sink.url("/once"))
    worker = start_worker(settings, tmp_path, "quick-retry")
    try:
        publish(settings, queue, [body(0)])
        wait_until(lambda: len(sink.deliveries("/once")) == 2, 60, "the retry", logs=tmp_path)
    finally:
        stop(worker)
    failed, retried = sink.deliveries("/once")
    assert failed.body == retried.body == body(0)
    assert retried.at - failed.at < 2.0, f"the retry came {retried.at - failed.at:.2f} s after the failure"


def test_a_stopping_worker_makes_the_subscription_it_hands_back_due_at_once(fanout_settings, redis, sink,
                                                                             tmp_path) -> None:
    # reconcile_interval 60 s: only the retry lane can take the handed-back subscription up soon
    settings = fanout_settings.with_values(delivery_timeout=30.0, lock_ttl=60, reconcile_interval=60.0)
    queue = make_queue(settings.queue_name, redis)
    sink.on("/slow", lambda request: hang(20)(request) if sink.count("/slow") == 1 else 200)
    subscribe(settings, sink.url("/slow"))
    first = start_worker(settings, tmp_path, "leaving")
    second = None
    try:
        publish(settings, queue, [body(0)])
        wait_until(lambda: len(sink.bodies("/slow")) == 1, 90, "the hanging delivery", logs=tmp_path)
        first.send_signal(signal.SIGTERM)
        first.wait(15)
        stopped = time.monotonic()
        second = start_worker(settings, tmp_path, "staying")
        wait_until(lambda: len(sink.bodies("/slow")) == 2, 30, "the delivery again", logs=tmp_path)
        assert time.monotonic() - stopped < 20
    finally:
        stop(first)
        if second is not None:
            stop(second)
    assert sink.bodies("/slow") == [body(0), body(0)]


def test_a_worker_stopping_between_deliveries_hands_the_rest_to_another_at_once(fanout_settings, redis, sink,
                                                                                tmp_path) -> None:
    # the stop comes while a POST is in flight: it ends (within the grace), the run stops before
    # the next entry and lets go; reconcile_interval 60 s, so only a due entry brings it on soon
    settings = fanout_settings.with_values(delivery_timeout=10.0, lock_ttl=60, reconcile_interval=60.0)
    queue = make_queue(settings.queue_name, redis)
    sink.on("/steady", hang(1.0))
    subscribe(settings, sink.url("/steady"))
    first = start_worker(settings, tmp_path, "going")
    second = None
    try:
        publish(settings, queue, [body(n) for n in range(4)])
        wait_until(lambda: len(sink.bodies("/steady")) == 1, 90, "the first delivery", logs=tmp_path)
        first.send_signal(signal.SIGTERM)
        first.wait(15)
        stopped = time.monotonic()
        second = start_worker(settings, tmp_path, "taking-over")
        wait_until(lambda: len(set(sink.bodies("/steady"))) == 4, 40, "the rest", logs=tmp_path)
        assert time.monotonic() - stopped < 30
    finally:
        stop(first)
        if second is not None:
            stop(second)
    assert_in_order_at_least_once(sequences(sink, "/steady"), 4)

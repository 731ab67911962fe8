"""`rsnotify hub` with its own workers, as a new user runs it: a subscriber on localhost gets
verified, a submission reaches it, and after a restart on the same data dir the subscription is
still there and still served. Sync on purpose: the hub is a subprocess, the subscriber a thread."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web

from tests.support import cli
from tests.support.http import http, post_form
from tests.support.hubproc import HubProcess, start_hub
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTIFICATION = (FIXTURES / "change-notification-1.0.1" / "notification_ex_1.xml").read_bytes()
TOPIC = "http://publisher.example/dataset1/change/"


def start(tmp_path: Path, data_dir: Path) -> HubProcess:
    return start_hub(tmp_path, data_dir=data_dir, workers=1, env={"RSNOTIFY_LOG_LEVEL": "WARNING"})


def subscribe(hub_url: str, callback: str, **extra: str) -> int:
    return post_form(hub_url, {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": callback, **extra})[0]


def publish(hub_url: str) -> tuple[int, bytes]:
    return http("POST", hub_url, NOTIFICATION, {"Content-Type": "application/xml",
                                                "Link": f'<{TOPIC}>; rel="self", <{hub_url}>; rel="hub"'})


def subscriptions(hub: HubProcess) -> int:
    return hub.health()[1].get("subscriptions", -1)


@pytest.fixture
def subscriber():
    """A loopback callback in a thread: echoes challenges, records deliveries (answers 204)."""
    recorder = RecordingSubscriber(default_status=204)
    server = recorder.serve_in_thread()
    yield recorder
    server.stop()


CALLBACK = "/callback?owner=me"


def test_embedded_hub_verifies_delivers_and_keeps_subscriptions_across_a_restart(tmp_path, subscriber):
    data_dir = tmp_path / "data"
    hub = start(tmp_path, data_dir)
    try:
        assert subscribe(hub.url, subscriber.url(CALLBACK), **{"hub.secret": "shh", "hub.lease_seconds": "3600"}) == 202
        wait_until(lambda: subscriptions(hub) == 1, what="verified subscription")
        [verification] = subscriber.verifications()
        assert verification.query["owner"] == "me" and verification.query["hub.lease_seconds"] == "3600"
        assert publish(hub.url)[0] == 200
        wait_until(lambda: len(subscriber.deliveries()) == 1, what="the first delivery")
        delivery = subscriber.deliveries()[0]
        assert delivery.body == NOTIFICATION and delivery.headers["X-Hub-Signature"].startswith("sha256=")
    finally:
        assert hub.stop(signal.SIGINT) == 0
    hub = start(tmp_path, data_dir)
    try:
        assert subscriptions(hub) == 1
        assert publish(hub.url)[0] == 200
        wait_until(lambda: len(subscriber.deliveries()) == 2, what="a delivery after the restart")
        assert subscriber.deliveries()[1].body == NOTIFICATION
        assert len(subscriber.verifications()) == 1  # nothing had to be verified again
    finally:
        assert hub.stop(signal.SIGTERM) == 0


def test_refused_verification_creates_nothing_with_real_workers(tmp_path, subscriber):
    hub = start(tmp_path, tmp_path / "data")
    try:
        subscriber.on("/callback", lambda request: web.Response(text="no"), method="GET")
        assert subscribe(hub.url, subscriber.url(CALLBACK)) == 202
        wait_until(lambda: len(subscriber.verifications()) == 1, what="the verification request")
        time.sleep(0.3)  # the worker stores nothing after a refused echo; give it the chance to be wrong
        assert subscriptions(hub) == 0
        assert publish(hub.url)[0] == 200
        time.sleep(0.3)
        assert subscriber.deliveries() == []
    finally:
        assert hub.stop() == 0


def test_worker_command_serves_the_queue_in_burst_mode(redis_url, redis, tmp_path, subscriber):
    import asyncio

    import redis.asyncio as redis_async

    from rsnotify.hub import keys, records, store
    from rsnotify.hub.enqueue import make_queue
    from rsnotify.hub.crypto import encrypt_secret, load_fernet
    from rsnotify.hub.settings import HubSettings
    from rsnotify.hub.worker import jobs

    settings = HubSettings(redis_url=redis_url, data_dir=str(tmp_path / "data"))
    fernet = load_fernet(settings)  # the hub made the key; the worker must find the same one
    intent = records.Intent("subscribe", TOPIC, subscriber.url(CALLBACK), 600, encrypt_secret(fernet, "x"))

    async def keep_intent() -> None:
        client = redis_async.Redis.from_url(redis_url)
        await store.store_intent(client, "a-challenge-for-the-worker", intent, 60)
        await client.aclose()

    asyncio.run(keep_intent())
    make_queue(settings.queue_name, redis).enqueue(jobs.verify_intent, "a-challenge-for-the-worker")
    done = cli.run("worker", "--burst", "--redis-url", redis_url, "--data-dir", settings.data_dir, "--log-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert subscriber.verifications()[0].query["hub.challenge"] == "a-challenge-for-the-worker"
    assert redis.hget(keys.sub_key(keys.subscription_id(TOPIC, subscriber.url(CALLBACK))), "lease_seconds") == b"600"


def _children(pid: int, is_one: Callable[[bytes], bool] = lambda cmdline: b"main()\x00worker" in cmdline) -> list[int]:
    """The processes `pid` started whose command line (NUL-separated) `is_one` picks (by
    default its workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and is_one(cmdline):
                found.append(int(entry.name))
    return found


def test_workers_do_not_outlive_a_killed_hub(tmp_path):
    from rsnotify.hub.embedded import stop_stale_redis

    data_dir = tmp_path / "data"
    hub = start(tmp_path, data_dir)
    [worker_pid] = _children(hub.pid)
    hub.kill()  # SIGKILL: the hub cannot stop its workers itself
    try:
        wait_until(lambda: not Path(f"/proc/{worker_pid}").exists() or
                   (Path(f"/proc/{worker_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"),
                   timeout=15, what="the orphaned worker to stop")
    finally:
        stop_stale_redis(data_dir.resolve())  # the embedded Redis the killed hub left behind


def _threads_policies(pid: int) -> set[int]:
    return {os.sched_getscheduler(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_the_hubs_children_run_as_batch_and_its_web_process_does_not(tmp_path, subscriber):
    hub = start(tmp_path, tmp_path / "data")
    try:
        [worker_pid] = _children(hub.pid)
        # a delivery has gone through the worker's loop thread, which it started after the policy was set
        assert subscribe(hub.url, subscriber.url(CALLBACK)) == 202
        wait_until(lambda: subscriptions(hub) == 1, what="verified subscription")
        assert publish(hub.url)[0] == 200
        wait_until(lambda: len(subscriber.deliveries()) == 1, what="the delivery")
        assert len(os.listdir(f"/proc/{worker_pid}/task")) > 1
        assert _threads_policies(worker_pid) == {os.SCHED_BATCH}
        # redis-server or valkey-server (which rewrites its title: "<path>-server <address>")
        [redis_pid] = _children(hub.pid, lambda cmdline: b"-server" in cmdline.split(b"\x00")[0])
        assert _threads_policies(redis_pid) == {os.SCHED_BATCH}
        assert _threads_policies(hub.pid) == {os.SCHED_OTHER}
    finally:
        hub.stop()

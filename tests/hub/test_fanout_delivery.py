"""Fan-out's async core against real Redis and real loopback subscribers: what a subscriber
receives (bytes, headers, signature, order) and what each outcome does to the subscription."""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from aiohttp import web

from rsnotify.hub import keys, store
from rsnotify.hub.enqueue import make_queue
from rsnotify.hub.worker import fanout
from rsnotify.websub import (
    NOTIFICATION_ID_HEADER,
    SEQUENCE_HEADER,
    SIGNATURE_HEADER,
    links_by_rel,
    parse_link_header,
    verify_signature,
)
from tests.support.ports import free_port
from tests.support.waiting import eventually

T = TypeVar("T")

TOPIC = "http://source.example.org/changes/topic?format=rs"
RS = "http://source.example.org/capabilitylist.xml"
BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
        b' xmlns:rs="http://www.openarchives.org/rs/terms/">\r\n  <rs:md capability="notification"/>\n'
        b'  <url><loc>http://example.com/res1</loc><rs:md change="updated"/></url>\n</urlset>  \n')


def body(n: int) -> bytes:
    return BODY.replace(b"res1", b"res%d" % n)


# s of quiet after which a worker stops following a topic, in the tests that follow one: the
# test's next publish must come within it, so it leaves room for a loaded machine (0.5 s did not)
FOLLOW = 2.0


async def until(read: Callable[[], Awaitable[T]], wanted: T, what: str, timeout: float = 30.0) -> None:
    """Poll an async read (a Redis command) until it gives `wanted`; fail saying `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while (got := await read()) != wanted:
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what} (last read {got!r})"
        await asyncio.sleep(0.02)


async def test_relays_exact_bytes_with_every_header(fanout_hub, callback_server) -> None:
    callback = callback_server.url("/cb/one") + "?token=a%2Fb&x=1"
    await fanout_hub.subscribe(TOPIC, callback)
    appended = await fanout_hub.publish(TOPIC, BODY, content_type="application/xml; charset=utf-8", resourcesync=RS)
    await fanout_hub.fan_out(TOPIC)

    [got] = callback_server.seen("/cb/one")
    assert got.method == "POST" and got.raw_query == "token=a%2Fb&x=1"
    assert got.body == BODY
    assert got.headers["Content-Type"] == "application/xml; charset=utf-8"
    assert got.headers[NOTIFICATION_ID_HEADER] == appended.notification_id
    assert got.headers[SEQUENCE_HEADER] == str(appended.sequence) == "1"
    links = parse_link_header(got.headers["Link"])
    assert links_by_rel(links, "self") == [TOPIC]
    assert links_by_rel(links, "hub") == [fanout_hub.ctx.settings.hub_url]
    assert links_by_rel(links, "resourcesync") == [RS]
    assert "," in got.headers["Link"]          # one combined header
    assert SIGNATURE_HEADER not in got.headers  # no secret, no signature


@pytest.mark.parametrize("algorithm", ["sha1", "sha256", "sha384", "sha512"])
async def test_signature_verifies_with_each_algorithm(fanout_settings, clock, callback_server, algorithm) -> None:
    from rsnotify.hub.crypto import encrypt_secret
    from rsnotify.hub.worker import context as worker
    ctx = await worker.open_context(fanout_settings.with_values(signature_algorithm=algorithm), clock=clock)
    try:
        await store.activate_subscription(ctx.redis, TOPIC, callback_server.url("/signed"), lease_seconds=600,
                                          now=clock(), secret=encrypt_secret(ctx.fernet, "s3cr\u00e9t"))
        await store.append_notification(ctx.redis, TOPIC, BODY, content_type="application/xml", now=clock(),
                                        max_len=100)
        await fanout.fan_out(ctx, keys.topic_id(TOPIC))
    finally:
        await worker.close_context(ctx)
    [got] = callback_server.seen("/signed")
    header = got.headers[SIGNATURE_HEADER]
    assert header.startswith(f"{algorithm}=")
    assert verify_signature(got.body, "s3cr\u00e9t", header)
    assert not verify_signature(got.body, "other", header)


async def test_publishes_arrive_in_order_to_every_subscriber(fanout_hub, callback_server) -> None:
    paths = [f"/many/{i}" for i in range(5)]
    for path in paths:
        await fanout_hub.subscribe(TOPIC, callback_server.url(path), secret="k" if path.endswith("1") else None)
    for n in range(30):
        await fanout_hub.publish(TOPIC, body(n))
    report = await fanout_hub.fan_out(TOPIC)
    assert report.served == 5 and report.delivered == 150
    for path in paths:
        assert [r.body for r in callback_server.seen(path)] == [body(n) for n in range(30)]
        assert [r.headers[SEQUENCE_HEADER] for r in callback_server.seen(path)] == [str(n) for n in range(1, 31)]


async def test_a_new_subscription_gets_only_what_comes_next(fanout_hub, callback_server) -> None:
    await fanout_hub.publish(TOPIC, body(0))
    await fanout_hub.subscribe(TOPIC, callback_server.url("/late"))
    await fanout_hub.publish(TOPIC, body(1))
    await fanout_hub.fan_out(TOPIC)
    assert [r.body for r in callback_server.seen("/late")] == [body(1)]


async def test_500_twice_then_200_gets_everything_in_order(fanout_hub, callback_server) -> None:
    calls = {"n": 0}

    def flaky(request: web.Request) -> web.Response:
        calls["n"] += 1
        return web.Response(status=500 if calls["n"] <= 2 else 200)

    callback_server.on("/flaky", flaky)
    sid = await fanout_hub.subscribe(TOPIC, callback_server.url("/flaky"))
    for n in range(5):
        await fanout_hub.publish(TOPIC, body(n))
    await fanout_hub.fan_out(TOPIC)
    sub = await store.get_subscription(fanout_hub.redis, sid)
    assert sub.attempts == 1 and sub.last_status == "500"
    await fanout_hub.settle()

    seen = [r.body for r in callback_server.seen("/flaky")]
    assert seen == [body(0), body(0), body(0), body(1), body(2), body(3), body(4)]
    attempts = await store.recent_attempts(fanout_hub.redis, sid)
    assert [a.outcome for a in reversed(attempts)] == ["retry", "retry"]     # failures are listed
    assert attempts[-1].status == 500 and attempts[-1].attempt == 1 and attempts[-2].attempt == 2
    assert (await store.get_subscription(fanout_hub.redis, sid)).attempts == 0


async def test_order_holds_for_200_notifications_under_injected_failures(fanout_hub, callback_server) -> None:
    rng = random.Random(7)
    for i in range(4):
        callback_server.on(f"/unreliable/{i}", lambda request: web.Response(status=rng.choice([200, 200, 200, 503, 502])))
    callback_server.on("/steady", lambda request: web.Response(status=204))
    for i in range(4):
        await fanout_hub.subscribe(TOPIC, callback_server.url(f"/unreliable/{i}"))
    await fanout_hub.subscribe(TOPIC, callback_server.url("/steady"), secret="x")
    fanout_hub.ctx.settings = fanout_hub.ctx.settings.with_values(max_attempts=1000)  # no dead letters here
    for n in range(200):
        await fanout_hub.publish(TOPIC, body(n))
        if n % 50 == 49:
            await fanout_hub.fan_out(TOPIC)
    await fanout_hub.settle(rounds=2000)

    expected = [body(n) for n in range(200)]
    assert [r.body for r in callback_server.seen("/steady")] == expected
    for i in range(4):
        seen = [r.body for r in callback_server.seen(f"/unreliable/{i}")]
        # every failure is retried before anything later is sent: dropping repeats gives the log
        deduped = [b for k, b in enumerate(seen) if k == 0 or b != seen[k - 1]]
        assert deduped == expected
        assert len(seen) > 200


async def test_a_hanging_subscriber_does_not_delay_the_others(fanout_settings, clock, callback_server) -> None:
    from rsnotify.hub.worker import context as worker

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response()

    callback_server.on("/hang", hang)
    ctx = await worker.open_context(fanout_settings.with_values(delivery_timeout=1.0), clock=clock)
    try:
        for path in ("/hang", "/fast/1", "/fast/2"):
            await store.activate_subscription(ctx.redis, TOPIC, callback_server.url(path), secret="",
                                              lease_seconds=600, now=clock())
        for n in range(20):
            await store.append_notification(ctx.redis, TOPIC, body(n), content_type="application/xml",
                                            now=clock(), max_len=100)
        fan_out = asyncio.create_task(fanout.fan_out(ctx, keys.topic_id(TOPIC)))
        loop = asyncio.get_running_loop()
        started = loop.time()
        while len(callback_server.seen("/fast/2")) < 20 or len(callback_server.seen("/fast/1")) < 20:
            await asyncio.sleep(0.01)
            assert loop.time() - started < 0.9, "fast subscribers waited for the hanging one"
        assert len(callback_server.seen("/hang")) == 1
        report = await fan_out
        assert report.delivered == 40 and report.failed == 1
        sid = keys.subscription_id(TOPIC, callback_server.url("/hang"))
        sub = await store.get_subscription(ctx.redis, sid)
        assert sub.attempts == 1 and "no answer within 1 s" in sub.last_error and sub.last_status == ""
    finally:
        await worker.close_context(ctx)


async def test_410_gone_ends_the_subscription(fanout_hub, callback_server) -> None:
    callback_server.on("/gone", lambda request: web.Response(status=410))
    sid = await fanout_hub.subscribe(TOPIC, callback_server.url("/gone"))
    keep = await fanout_hub.subscribe(TOPIC, callback_server.url("/stays"))
    for n in range(3):
        await fanout_hub.publish(TOPIC, body(n))
    report = await fanout_hub.fan_out(TOPIC)
    assert report.gone == 1
    assert len(callback_server.seen("/gone")) == 1
    assert await store.get_subscription(fanout_hub.redis, sid) is None
    assert not await fanout_hub.redis.sismember(keys.topic_subs_key(keys.topic_id(TOPIC)), sid)
    assert await fanout_hub.redis.zscore(keys.leases_key(), sid) is None
    assert not await fanout_hub.redis.exists(*keys.delivery_keys(sid))
    await fanout_hub.publish(TOPIC, body(3))
    await fanout_hub.fan_out(TOPIC)
    assert len(callback_server.seen("/gone")) == 1
    assert len(callback_server.seen("/stays")) == 4
    assert await store.get_subscription(fanout_hub.redis, keep) is not None


async def test_dead_letter_after_the_last_attempt_and_later_notifications_still_arrive(fanout_hub, callback_server) -> None:
    broken = {"on": True}

    def first_fails(request: web.Request) -> web.Response:
        is_first = request.headers[SEQUENCE_HEADER] == "1"
        return web.Response(status=502 if is_first and broken["on"] else 200)

    callback_server.on("/dl", first_fails)
    sid = await fanout_hub.subscribe(TOPIC, callback_server.url("/dl"))
    first = await fanout_hub.publish(TOPIC, body(0), resourcesync=RS)
    for n in range(1, 4):
        await fanout_hub.publish(TOPIC, body(n))
    await fanout_hub.fan_out(TOPIC)
    await fanout_hub.settle()

    seen = callback_server.seen("/dl")
    assert [r.body for r in seen] == [body(0)] * 5 + [body(1), body(2), body(3)]   # max_attempts=5
    [letter] = await store.list_dead_letters(fanout_hub.redis, sid)
    assert letter.notification_id == first.notification_id and letter.sequence == 1
    assert letter.attempts == 5 and letter.status == 502 and letter.error == "HTTP 502"
    assert await store.dead_letter_body(fanout_hub.redis, sid, first.notification_id) == body(0)
    sub = await store.get_subscription(fanout_hub.redis, sid)
    assert sub.attempts == 0 and sub.cursor != first.notification_id

    # re-sent once the subscriber works again: the same bytes and headers, then it is gone
    broken["on"] = False
    assert await store.resend_dead_letter(fanout_hub.redis, sid, first.notification_id, now=fanout_hub.clock())
    await fanout_hub.settle()
    resent = callback_server.seen("/dl")[-1]
    assert resent.body == body(0) and resent.headers[NOTIFICATION_ID_HEADER] == first.notification_id
    assert links_by_rel(parse_link_header(resent.headers["Link"]), "resourcesync") == [RS]
    assert await store.list_dead_letters(fanout_hub.redis, sid) == []
    assert len(callback_server.seen("/dl")) == 9


async def test_resend_all_dead_letters_keeps_them_when_still_failing(fanout_hub, callback_server) -> None:
    callback_server.on("/down", lambda request: web.Response(status=503))
    sid = await fanout_hub.subscribe(TOPIC, callback_server.url("/down"))
    for n in range(2):
        await fanout_hub.publish(TOPIC, body(n))
    await fanout_hub.fan_out(TOPIC)
    await fanout_hub.settle()
    assert [d.sequence for d in await store.list_dead_letters(fanout_hub.redis, sid)] == [1, 2]
    assert await store.resend_all_dead_letters(fanout_hub.redis, sid, now=fanout_hub.clock()) == 2
    await fanout_hub.settle()
    letters = await store.list_dead_letters(fanout_hub.redis, sid)
    assert [(d.sequence, d.resend) for d in letters] == [(1, False), (2, False)]
    assert len(callback_server.seen("/down")) == 20


async def test_paused_subscription_gets_nothing_until_resumed(fanout_hub, callback_server) -> None:
    sid = await fanout_hub.subscribe(TOPIC, callback_server.url("/paused"))
    assert await store.pause_subscription(fanout_hub.redis, sid)
    for n in range(3):
        await fanout_hub.publish(TOPIC, body(n))
    await fanout_hub.fan_out(TOPIC)
    assert callback_server.seen("/paused") == []
    assert await store.subscription_backlog(fanout_hub.redis, sid) == 3
    assert await store.resume_subscription(fanout_hub.redis, sid, now=fanout_hub.clock())
    await fanout_hub.settle()
    assert [r.body for r in callback_server.seen("/paused")] == [body(n) for n in range(3)]
    assert await store.subscription_backlog(fanout_hub.redis, sid) == 0
    assert not await store.pause_subscription(fanout_hub.redis, "no-such-subscription")


async def test_expired_subscription_gets_nothing(fanout_hub, callback_server) -> None:
    await fanout_hub.subscribe(TOPIC, callback_server.url("/expired"), lease_seconds=60)
    await fanout_hub.publish(TOPIC, body(0))
    fanout_hub.clock.advance(61)
    await fanout_hub.fan_out(TOPIC)
    assert callback_server.seen("/expired") == []


async def test_backlog_trimmed_away_shows_as_a_sequence_gap(fanout_hub, callback_server) -> None:
    sid = await fanout_hub.subscribe(TOPIC, callback_server.url("/gap"))
    await store.pause_subscription(fanout_hub.redis, sid)
    for n in range(10):
        await fanout_hub.publish(TOPIC, body(n))
    await fanout_hub.redis.xtrim(keys.topic_log_key(keys.topic_id(TOPIC)), maxlen=4, approximate=False)
    await store.resume_subscription(fanout_hub.redis, sid, now=fanout_hub.clock())
    await fanout_hub.settle()
    seen = callback_server.seen("/gap")
    assert [r.headers[SEQUENCE_HEADER] for r in seen] == ["7", "8", "9", "10"]
    raw = await fanout_hub.redis.hmget(keys.sub_key(sid), "gaps", "last_gap")
    assert raw == [b"6", b"1-6"]


async def test_connection_refused_is_retried_and_recorded(fanout_hub) -> None:
    sid = await fanout_hub.subscribe(TOPIC, f"http://127.0.0.1:{free_port()}/nobody")
    await fanout_hub.publish(TOPIC, body(0))
    await fanout_hub.fan_out(TOPIC)
    [attempt] = await store.recent_attempts(fanout_hub.redis, sid)
    assert attempt.status is None and attempt.outcome == "retry" and "connection refused" in attempt.error
    assert await fanout_hub.redis.zscore(keys.due_key(), sid) is not None


async def test_redirect_is_not_followed_and_counts_as_failure(fanout_hub, callback_server) -> None:
    callback_server.on("/moved", lambda request: web.Response(status=302, headers={"Location": callback_server.url("/target")}))
    sid = await fanout_hub.subscribe(TOPIC, callback_server.url("/moved"))
    await fanout_hub.publish(TOPIC, body(0))
    await fanout_hub.fan_out(TOPIC)
    assert callback_server.seen("/target") == []
    assert (await store.get_subscription(fanout_hub.redis, sid)).last_status == "302"


async def test_large_response_body_is_read_only_in_part(fanout_hub, callback_server) -> None:
    callback_server.on("/chatty", lambda request: web.Response(body=b"x" * (5 * 1024 * 1024)))
    for n in range(3):
        await fanout_hub.publish(TOPIC, body(n))
    await fanout_hub.subscribe(TOPIC, callback_server.url("/chatty"))
    await fanout_hub.publish(TOPIC, body(9))
    report = await fanout_hub.fan_out(TOPIC)
    assert report.delivered == 1


async def test_delivery_counters_and_last_attempt_are_recorded(fanout_hub, callback_server) -> None:
    sid = await fanout_hub.subscribe(TOPIC, callback_server.url("/counted"))
    for n in range(4):
        await fanout_hub.publish(TOPIC, body(n))
    await fanout_hub.fan_out(TOPIC)
    await fanout_hub.ctx.deliveries._flush_stats()
    stats = await store.delivery_stats(fanout_hub.redis)
    assert stats["outcome:delivered"] == 4 and stats["status:2xx"] == 4
    assert stats["delivery_seconds:count"] == 4 and stats["publish_to_delivery_seconds:count"] == 4
    raw = await fanout_hub.redis.hmget(keys.sub_key(sid), "last_status", "last_outcome", "delivered", "last_latency_ms")
    assert raw[:3] == [b"200", b"delivered", b"4"] and float(raw[3]) > 0
    assert await store.recent_attempts(fanout_hub.redis, sid) == []      # no failures to list


async def test_concurrent_fan_outs_of_one_topic_never_send_a_subscription_twice(fanout_hub, callback_server) -> None:
    paths = [f"/race/{i}" for i in range(20)]
    for path in paths:
        await fanout_hub.subscribe(TOPIC, callback_server.url(path))
    for n in range(10):
        await fanout_hub.publish(TOPIC, body(n))
    reports = await asyncio.gather(*(fanout_hub.fan_out(TOPIC) for _ in range(4)))
    assert sum(r.served for r in reports) >= 20
    for path in paths:
        assert [r.body for r in callback_server.seen(path)] == [body(n) for n in range(10)]


async def test_a_publish_during_a_run_is_picked_up_by_the_run_that_owns_the_subscription(fanout_hub, callback_server) -> None:
    release = asyncio.Event()

    async def slow_first(request: web.Request) -> web.Response:
        if request.headers[SEQUENCE_HEADER] == "1":
            await release.wait()
        return web.Response()

    callback_server.on("/owned", slow_first)
    await fanout_hub.subscribe(TOPIC, callback_server.url("/owned"))
    await fanout_hub.publish(TOPIC, body(0))
    first = asyncio.create_task(fanout_hub.fan_out(TOPIC))
    while not callback_server.seen("/owned"):
        await asyncio.sleep(0.005)
    await fanout_hub.publish(TOPIC, body(1))
    second = await fanout_hub.fan_out(TOPIC)      # the subscription is owned: skipped, not lost
    assert second.busy == 1
    release.set()
    await first
    assert [r.body for r in callback_server.seen("/owned")] == [body(0), body(1)]


async def test_a_worker_follows_a_busy_topic_so_publishes_need_no_job(fanout_settings, clock, callback_server, redis) -> None:

    from rsnotify.hub import enqueue
    from rsnotify.hub.worker import context as worker
    queue = make_queue(fanout_settings.queue_name, redis)
    ctx = await worker.open_context(fanout_settings, clock=clock, follow_seconds=FOLLOW, queue=queue)
    tid = keys.topic_id(TOPIC)
    try:
        await store.activate_subscription(ctx.redis, TOPIC, callback_server.url("/followed"), secret="",
                                          lease_seconds=600, now=clock())
        await store.append_notification(ctx.redis, TOPIC, body(0), content_type="application/xml",
                                        now=clock(), max_len=100)
        await fanout.fan_out(ctx, tid)
        # following: registered as the topic's follower in Redis, which also holds its "queued" flag
        await until(lambda: ctx.redis.zcard(keys.fanout_followers_key(tid)), 1, "the worker to follow the topic")
        assert tid in ctx.deliveries.following
        for n in range(1, 4):
            await store.append_notification(ctx.redis, TOPIC, body(n), content_type="application/xml",
                                            now=clock(), max_len=100)
            assert not await enqueue.ensure_fan_out(queue, tid, redis=ctx.redis)   # the follower has it
        await eventually(lambda: len(callback_server.seen("/followed")) >= 4, 30, "four deliveries")
        assert [r.body for r in callback_server.seen("/followed")] == [body(n) for n in range(4)]
        assert len(queue) == 0
        # Quiet for follow_seconds: it lets go. The worker drops the topic from `following` before
        # the Redis round trip that removes it from the followers and clears the flag, so wait on
        # that (a loaded machine lets a test poll in between and see the flag still set).
        await until(lambda: ctx.redis.exists(keys.fanout_followers_key(tid)), 0, "the worker to let go of the topic")
        assert tid not in ctx.deliveries.following
        assert await enqueue.ensure_fan_out(queue, tid, redis=ctx.redis)        # jobs again
    finally:
        await worker.close_context(ctx)


async def test_a_subscriber_that_lags_the_follower_is_sent_what_the_follower_read(
        fanout_settings, clock, callback_server, redis) -> None:
    """A run that falls more than a window behind the follower of its topic (its subscriber slow,
    the topic busy) is sent from the follower's reads: the window keeps what the run has yet to
    send, where it used to drop them, and the run read each entry a second time (an XRANGE of
    its own per 100 entries). Every notification still arrives, in order, once."""
    from rsnotify.hub.worker import context as worker
    from rsnotify.hub.worker.topic_log import WINDOW
    queue = make_queue(fanout_settings.queue_name, redis)
    # the first POST is held past the settings' delivery timeout (2 s): no retry wanted here
    settings = fanout_settings.with_values(log_max_len=10 * WINDOW, delivery_timeout=30.0)
    ctx = await worker.open_context(settings, clock=clock, follow_seconds=5.0, queue=queue)
    tid = keys.topic_id(TOPIC)
    release = asyncio.Event()

    async def slow_at_first(request: web.Request) -> int:
        await release.wait()            # the first POST waits while the topic runs ahead
        return 200

    callback_server.on("/lagging", slow_at_first)
    later = 3 * WINDOW
    try:
        await store.activate_subscription(ctx.redis, TOPIC, callback_server.url("/lagging"), secret="",
                                          lease_seconds=600, now=clock())
        await store.append_notification(ctx.redis, TOPIC, body(0), content_type="application/xml",
                                        now=clock(), max_len=10 * WINDOW)
        fanning = asyncio.ensure_future(fanout.fan_out(ctx, tid))     # returns once its run does
        while tid not in ctx.deliveries.following or not callback_server.seen("/lagging"):
            await asyncio.sleep(0.005)
        redis.config_resetstat()
        for start in range(1, later + 1, 256):
            await asyncio.gather(*(store.append_notification(ctx.redis, TOPIC, body(n), content_type="application/xml",
                                                             now=clock(), max_len=10 * WINDOW, batch=ctx.batch)
                                   for n in range(start, min(later, start + 255) + 1)))
        await asyncio.sleep(1.0)        # the follower reads them all meanwhile (a few reads of WINDOW)
        release.set()
        while len(callback_server.seen("/lagging")) < later + 1:
            await asyncio.sleep(0.02)
        stats = redis.info("commandstats")
        await fanning
    finally:
        release.set()
        await worker.close_context(ctx)
    assert [r.body for r in callback_server.seen("/lagging")] == [body(n) for n in range(later + 1)]
    assert stats.get("cmdstat_xread", {}).get("calls", 0) >= 3, "the follower did not read the topic"
    log_reads = stats.get("cmdstat_xrange", {}).get("calls", 0)
    assert log_reads <= 2, f"the lagging run read the log itself: {log_reads} XRANGE for {later} notifications"


async def test_two_followers_share_a_big_topic_and_each_subscription_gets_everything_once(
        fanout_settings, clock, callback_server, redis) -> None:

    from rsnotify.hub.worker import context as worker
    queue = make_queue(fanout_settings.queue_name, redis)
    # follow_seconds long enough that the first follower is still there when the second joins
    # (a fan-out to 40 subscribers on a loaded machine took more than 0.5 s); it costs nothing
    # at the end, where the contexts close without waiting for quiet
    first = await worker.open_context(fanout_settings, clock=clock, follow_seconds=FOLLOW, queue=queue)
    second = await worker.open_context(fanout_settings, clock=clock, follow_seconds=FOLLOW, queue=queue)
    tid = keys.topic_id(TOPIC)
    paths = [f"/shared/{i}" for i in range(fanout.SHARE_FROM + 8)]
    published = 1
    try:
        for path in paths:
            await store.activate_subscription(first.redis, TOPIC, callback_server.url(path), secret="",
                                              lease_seconds=600, now=clock())
        await store.append_notification(first.redis, TOPIC, body(0), content_type="application/xml",
                                        now=clock(), max_len=1000)
        await fanout.fan_out(first, tid)
        assert [job.func_name for job in queue.get_jobs()] == ["rsnotify.hub.worker.jobs.follow_topic"]   # a second worker, please
        second.deliveries.spawn(fanout.follow(second, tid))
        followers = keys.fanout_followers_key(tid)
        await until(lambda: first.redis.zcount(followers, int(time.time() * 1000), "+inf"), 2,
                    "both workers to follow the topic")
        claimed_before = (first.deliveries.claimed, second.deliveries.claimed)
        # Publish until both followers have claimed some of the subscriptions (ten at least). The
        # first follower learns of the second at its next lease renewal (FOLLOW_LEASE / 3): until
        # then it may keep every subscription, and on a loaded machine ten quick publishes can
        # all go out before that.
        deadline = time.monotonic() + 30
        while published < 11 or not (first.deliveries.claimed > claimed_before[0]
                                     and second.deliveries.claimed > claimed_before[1]):
            assert time.monotonic() < deadline, (f"after {published} publishes in 30 s, claims went from "
                                                 f"{claimed_before} to {first.deliveries.claimed, second.deliveries.claimed}")
            await store.append_notification(first.redis, TOPIC, body(published), content_type="application/xml",
                                            now=clock(), max_len=1000)
            published += 1
            await asyncio.sleep(0.02)
        await eventually(lambda: all(len(callback_server.seen(p)) >= published for p in paths), 30,
                         f"every subscription to get {published} notifications")
    finally:
        await worker.close_context(first, drain=False)
        await worker.close_context(second, drain=False)
    # each subscription got everything once, in order: checked after both workers stopped, so a
    # late duplicate cannot slip in after the check
    for path in paths:
        assert [r.body for r in callback_server.seen(path)] == [body(n) for n in range(published)], path
    assert not redis.exists(keys.fanout_queued_key(tid))     # the last follower let go of the topic


async def test_a_run_claimed_just_before_a_renewal_changed_the_secret_signs_with_the_new_one(fanout_hub,
                                                                                              callback_server):
    """The worker's keeper re-reads held runs' secrets when a renewal changes one; a run whose
    claim read the old secret before the renewal, but which joined this worker's runs only after
    the keeper's look at the renewal, is behind too and gets the new secret at the next look."""
    d = fanout_hub.ctx.deliveries
    busy = await fanout_hub.subscribe(TOPIC, callback_server.url("/busy"), secret="old busy")
    late = await fanout_hub.subscribe(TOPIC, callback_server.url("/late"), secret="old")
    held = await d.claim(busy)
    assert held is not None
    d.runs[held.sid] = held
    claimed = await d.claim(late)                    # its claim reads the old secret...
    assert claimed is not None and claimed.secret == "old"
    await fanout_hub.subscribe(TOPIC, callback_server.url("/late"), secret="new")    # ...a verified renewal
    await d._take_up_renewed_secrets()               # the keeper's look: the late run is not held yet
    d.runs[claimed.sid] = claimed                    # now it is
    await d._take_up_renewed_secrets()
    assert claimed.secret == "new" and held.secret == "old busy"

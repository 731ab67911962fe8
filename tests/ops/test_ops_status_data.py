"""What the status page reads, against a real hub and Redis: per-minute history kept by the hub
(bounded), one short human line per subscription in trouble, and search by topic or callback."""
from __future__ import annotations

import time

from rsnotify.hub import keys
from rsnotify.hub.store import history
from rsnotify.hub.web.reports import SubscriptionSummary, clock_time, short_error
from tests.support.ports import free_port

from .conftest import TOPIC, body


async def test_history_keeps_each_minute_for_hours_and_expires(ops_hub, subscriber) -> None:
    await ops_hub.subscribe(subscriber.url("/good"))
    subscriber.on("/bad", 500)
    await ops_hub.subscribe(subscriber.url("/bad"))
    for n in range(4):
        await ops_hub.publish(body(n))
    await ops_hub.drain()
    await ops_hub.counted("outcome:dead", 4, timeout=30)
    rows = (await ops_hub.admin("GET", "/admin/history"))["history"]
    assert len(rows) == history.HISTORY_MINUTES                  # six hours, one row a minute, oldest first
    assert [r["minute"] for r in rows] == sorted(r["minute"] for r in rows)
    assert rows[-1]["minute"] >= (int(time.time()) // 60 - 1) * 60              # ends now
    assert sum(r["delivered"] for r in rows) == 4 and sum(r["failed"] for r in rows) == 12     # 3 attempts x 4
    assert any(r["latency_ms"] is not None for r in rows)
    minute = next(r["minute"] for r in rows if r["delivered"])
    ttl = await ops_hub.redis.ttl(keys.history_key(minute // 60))
    assert 0 < ttl <= history.HISTORY_TTL                        # bounded: every minute expires on its own
    assert len((await ops_hub.admin("GET", "/admin/history?minutes=5"))["history"]) == 5
    assert "minutes must be an integer 1-360" in await ops_hub.admin("GET", "/admin/history?minutes=0", expect=400)


async def test_trouble_reads_as_one_short_line(ops_hub, subscriber) -> None:
    closed = f"http://127.0.0.1:{free_port()}/gone-away"
    refused = await ops_hub.subscribe(subscriber.url("/refuses"))      # verified while it answered
    await ops_hub.redis.hset(keys.sub_key(refused), "callback", closed)  # then its server went away
    await ops_hub.publish(body(1))
    await ops_hub.drain()
    overview = await ops_hub.admin("GET", "/admin/overview")
    [row] = overview["trouble"]
    assert row["problem"] == "1 dead letter · last connection refused"
    assert "Connect call failed" not in row["problem"] and len(row["problem"]) < 60


def test_a_retrying_subscription_says_what_failed_and_when_it_is_tried_again() -> None:
    now = 1_800_000_000.0
    summary = SubscriptionSummary(
        sid="a" * 32, topic="https://source.example/rs", callback="https://sub.example/cb", tid="b" * 32,
        state="active", expires=int(now) + 86_400 * 30, lease_seconds=86_400 * 60, created=int(now) - 600,
        attempts=2, next_attempt=now + 30, last_status="",
        last_error="Cannot connect to host sub.example:443 ssl:default [Connect call failed ('192.0.2.1', 443)]",
        last_attempt_at=int(now) - 5, last_latency_ms=3.0, last_outcome="retry", delivered=7, gaps=0, last_gap="",
        resend=0, backlog=2, dead_letters=0)
    assert summary.problem(now) == "connection refused · next try 08:00:30 UTC · attempt 3"
    assert summary.trouble(now) == ["retrying: 2 failed attempt(s), last connection refused"]


def test_short_errors_and_times() -> None:
    assert short_error("503", "") == "HTTP 503"
    assert short_error("", "Cannot connect to host 127.0.0.1:9 ssl:default [Connect call failed ('127.0.0.1', 9)]") \
        == "connection refused"
    assert short_error("", "TimeoutError ") == "no answer in time"
    assert short_error("", "Cannot connect to host nowhere.invalid:443 ssl:default [Name or service not known]") \
        == "host name not found"
    assert short_error("", "") == "no answer"
    now = 1_800_000_000.0
    assert clock_time(now + 30, now) == "08:00:30 UTC"
    assert clock_time(now + 86_400, now) == "2027-01-16 08:00:00 UTC"


async def test_search_by_callback_topic_or_id(ops_hub, subscriber) -> None:
    alpha = await ops_hub.subscribe(subscriber.url("/alpha"))
    beta = await ops_hub.subscribe(subscriber.url("/beta"), topic=TOPIC + "/other")
    by_callback = await ops_hub.admin("GET", "/admin/subscriptions?search=ALPHA")
    assert [s["sid"] for s in by_callback["subscriptions"]] == [alpha]
    by_topic = await ops_hub.admin("GET", "/admin/subscriptions?search=changes/rs/other")
    assert [s["sid"] for s in by_topic["subscriptions"]] == [beta]
    assert (await ops_hub.admin("GET", f"/admin/subscriptions?search={beta[:8]}"))["total"] == 1
    topics = await ops_hub.admin("GET", "/admin/topics?search=other")
    assert [t["url"] for t in topics["topics"]] == [TOPIC + "/other"]
    assert (await ops_hub.admin("GET", "/admin/topics?search=nothing-like-it"))["total"] == 0
    too_long = await ops_hub.admin("GET", "/admin/subscriptions?search=" + "x" * 201, expect=400)
    assert "search must be at most 200 characters" in too_long

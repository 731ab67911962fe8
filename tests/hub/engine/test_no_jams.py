"""No notification can jam a topic: a stored notification that cannot be sent (a Link target
with '<' in it, a control character in its Content-Type: what an older hub let in) fails its
attempts like an unreachable subscriber would, becomes a dead letter shown as trouble in the
admin API, and the healthy notifications after it are delivered in order."""
from __future__ import annotations

import asyncio
import time

import redis.asyncio as redis_async

from rsnotify.hub import keys, store

from .support import admin, http, notification, publish, subscribe, wait_until

TOPIC = "http://source.example.org/poisoned"


async def store_poison(socket_path: str) -> None:
    """Append what intake refuses today straight to the topic's log, as an older hub stored it."""
    redis = redis_async.Redis(unix_socket_path=socket_path)
    try:
        for content_type, resourcesync in (("application/xml", "http://source.example.org/<caps>"),
                                           ("application/xml\x01", "")):
            await store.append_notification(redis, TOPIC, notification(0), content_type=content_type,
                                            resourcesync=resourcesync, now=time.time(), max_len=1000)
    finally:
        await redis.aclose()


def test_unsendable_notifications_become_dead_letters_and_the_rest_flows(hub_process, callbacks, tmp_path) -> None:
    data = tmp_path / "poisoned"            # its embedded Redis's socket is where the poison goes in
    hub = hub_process("--workers", "1", "--max-attempts", "2", "--retry-base", "0.1", "--retry-cap", "0.2",
                      "--log-level", "WARNING", "--data-dir", str(data))
    callback = callbacks.url("/victim")
    subscribe(hub.url, TOPIC, callback)
    sid = keys.subscription_id(TOPIC, callback)
    wait_until(lambda: _exists(hub, sid), 30, "the verified subscription")

    asyncio.run(store_poison(str(data / "redis.sock")))
    healthy = [publish(hub.url, TOPIC, notification(i))["sequence"] for i in (1, 2)]

    wait_until(lambda: callbacks.received("/victim") == healthy, 30, "the healthy notifications after the poison")
    def both_dead() -> list[dict]:
        letters = admin(hub.url, f"/admin/subscriptions/{sid}/dead-letters")["dead_letters"]
        return letters if len(letters) == 2 else []

    letters = wait_until(both_dead, 30, "both poisoned notifications as dead letters")
    assert [d["sequence"] for d in letters] == [1, 2]
    assert all(d["error"] for d in letters), letters
    trouble = admin(hub.url, f"/admin/subscriptions/{sid}")["trouble"]
    assert any("dead letter" in reason for reason in trouble), trouble


def _exists(hub, sid: str) -> bool:
    return http("GET", hub.url + f"admin/subscriptions/{sid}")[0] == 200

"""Exactly-once intake for retried publishes: a repeat of a submission with the same
Idempotency-Key gets the first notification's id and stores nothing, also when the first
answer never reached the publisher because Redis stalled; subscribers get each notification once."""
from __future__ import annotations

import threading
import urllib.error

import redis as redis_sync

from .support import active_subscriptions, notification, publish, subscribe, wait_until

TOPIC = "http://source.example.org/retried"


def test_a_repeated_idempotency_key_gets_the_first_id(hub_process, callbacks, tmp_path) -> None:
    data = tmp_path / "retried"             # its embedded Redis's socket: the test pauses that Redis
    hub = hub_process("--workers", "1", "--log-level", "WARNING", "--data-dir", str(data))
    subscribe(hub.url, TOPIC, callbacks.url("/once"))
    wait_until(lambda: callbacks.verified, 30, "the verification")
    wait_until(lambda: active_subscriptions(hub.url) == 1, 30, "the subscription")

    first = publish(hub.url, TOPIC, notification(1), Idempotency_Key="batch-1")
    again = publish(hub.url, TOPIC, notification(1), Idempotency_Key="batch-1")
    assert again["notification_id"] == first["notification_id"]
    assert again["sequence"] == first["sequence"] == 1
    other = publish(hub.url, TOPIC, notification(2), Idempotency_Key="batch-2")
    assert other["sequence"] == 2

    # Redis stalls: the publisher gives up waiting and sends again, with the same key
    redis = redis_sync.Redis(unix_socket_path=str(data / "redis.sock"))
    redis.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
    answers: list[object] = []

    def impatient() -> None:
        try:
            answers.append(publish_with_timeout(hub.url, notification(3), "batch-3", timeout=1.0))
        except (TimeoutError, urllib.error.URLError) as exc:
            answers.append(exc)

    thread = threading.Thread(target=impatient)
    thread.start()
    thread.join()
    retried = publish(hub.url, TOPIC, notification(3), Idempotency_Key="batch-3")   # waits out the pause
    redis.close()
    assert retried["sequence"] == 3
    # Delivery is at-least-once: a worker whose cursor write stalled behind the pause sends
    # again, so the subscriber may see repeats; what must hold is that each submission was
    # stored once (no fifth sequence) and that first deliveries came in publish order.
    wait_until(lambda: {1, 2, 3} <= set(callbacks.received("/once")), 30, "three deliveries")
    published = publish(hub.url, TOPIC, notification(4))["sequence"]
    assert published == 4, "a notification was stored twice"
    wait_until(lambda: published in callbacks.received("/once"), 30, "the next delivery")
    assert list(dict.fromkeys(callbacks.received("/once"))) == [1, 2, 3, 4]


def publish_with_timeout(hub_url: str, body: bytes, key: str, timeout: float) -> dict:
    import json
    import urllib.request

    from rsnotify.websub import build_link_header

    links = build_link_header([(TOPIC, "self"), (hub_url, "hub")])
    request = urllib.request.Request(hub_url, data=body, method="POST", headers={
        "Content-Type": "application/xml", "Link": links, "Idempotency-Key": key})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


"""Nobody can stall anybody: subscribers that hang on every POST, and callbacks that accept TCP and
never answer, hold at most their host's share of one worker while another topic's delivery and a
new subscription's verification go through at once. A real `rsnotify hub` with one worker child;
the hostile callbacks' timeouts are far longer than the test, so "at once" means "before any of
them gave up"."""
from __future__ import annotations

import json

from .support import (
    active_subscriptions,
    http,
    notification,
    publish,
    subscribe,
    wait_until,
)

HOSTILE_TOPIC = "http://source.example.org/hostile"
TOPIC = "http://source.example.org/calm"
HOST_CAP = 2


def test_hanging_subscribers_leave_other_topics_alone(hub_process, callback_servers) -> None:
    hub = hub_process("--workers", "1", "--delivery-concurrency", "8", "--host-concurrency", str(HOST_CAP),
                      "--delivery-timeout", "120", "--log-level", "WARNING")
    hostile, calm = callback_servers(), callback_servers()
    for i in range(20):                      # more than the worker's delivery slots
        hostile.answers[f"/hang/{i}"] = "hang"
        subscribe(hub.url, HOSTILE_TOPIC, hostile.url(f"/hang/{i}"))
    subscribe(hub.url, TOPIC, calm.url("/calm"))
    wait_until(lambda: active_subscriptions(hub.url) == 21, 60, "21 verified subscriptions")

    publish(hub.url, HOSTILE_TOPIC, notification(1))
    wait_until(lambda: hostile.hanging >= HOST_CAP, 30, "the hanging subscribers to hold POSTs open")
    publish(hub.url, TOPIC, notification(2))

    wait_until(lambda: calm.received("/calm"), 30, "the calm topic's delivery")
    assert hostile.hung_up == 0, "the calm delivery waited for a hanging POST to time out"
    assert hostile.hanging <= HOST_CAP, f"{hostile.hanging} POSTs to one host at once; the cap is {HOST_CAP}"


def test_black_hole_callbacks_leave_verification_alone(hub_process, black_hole, callbacks) -> None:
    hub = hub_process("--workers", "1", "--verify-concurrency", "4", "--host-concurrency", str(HOST_CAP),
                      "--fetch-timeout", "120", "--log-level", "WARNING")
    for i in range(12):                      # three times the worker's verification slots
        subscribe(hub.url, HOSTILE_TOPIC, black_hole.url(f"/void/{i}"))
    wait_until(lambda: black_hole.open >= HOST_CAP, 30, "the black hole to hold verification requests")

    subscribe(hub.url, TOPIC, callbacks.url("/calm"))
    wait_until(lambda: active_subscriptions(hub.url) == 1, 30, "the calm subscription's verification")
    assert black_hole.closed == 0, "the verification waited for a black-hole request to time out"
    assert black_hole.open <= HOST_CAP, f"{black_hole.open} requests to one host at once; the cap is {HOST_CAP}"
    lanes = json.loads(http("GET", hub.url + "health")[1])["lanes"]
    assert lanes["verification"]["waiting"] >= 12 - HOST_CAP, lanes     # the rest wait for their host
    # and the calm subscription gets its notifications
    publish(hub.url, TOPIC, notification(1))
    wait_until(lambda: callbacks.received("/calm") == [1], 30, "the calm subscriber's delivery")

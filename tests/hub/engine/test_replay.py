"""A returning Destination asks for a replay: re-subscribing with rsnotify.replay_from=N (the
sync engine's extension) delivers N, N+1, ... again in order; a sequence past the log's end
replays nothing, and a malformed value is ignored (other hubs ignore the field too)."""
from __future__ import annotations

from .support import active_subscriptions, notification, publish, subscribe, wait_until

TOPIC = "http://source.example.org/replayed"
REPLAY = "rsnotify.replay_from"


def test_resubscribing_with_replay_from_delivers_again_from_that_sequence(hub_process, callbacks) -> None:
    hub = hub_process("--workers", "1", "--log-level", "WARNING")
    callback = callbacks.url("/returning")
    subscribe(hub.url, TOPIC, callback)
    wait_until(lambda: active_subscriptions(hub.url) == 1, 30, "the subscription")
    for i in range(1, 6):
        publish(hub.url, TOPIC, notification(i))
    wait_until(lambda: callbacks.received("/returning") == [1, 2, 3, 4, 5], 30, "the first five")

    subscribe(hub.url, TOPIC, callback, **{REPLAY: "3"})
    wait_until(lambda: callbacks.received("/returning") == [1, 2, 3, 4, 5, 3, 4, 5], 30, "the replay from 3")

    subscribe(hub.url, TOPIC, callback, **{REPLAY: "99"})     # past the end: nothing again
    subscribe(hub.url, TOPIC, callback, **{REPLAY: "-2"})     # malformed: ignored, still 202
    wait_until(lambda: len(callbacks.verified) == 4, 30, "both renewals' verifications")
    publish(hub.url, TOPIC, notification(6))
    wait_until(lambda: callbacks.received("/returning")[-1:] == [6], 30, "the next notification")
    assert callbacks.received("/returning") == [1, 2, 3, 4, 5, 3, 4, 5, 6]


def test_a_renewal_asking_for_a_replay_past_the_end_skips_nothing_it_has_not_had(hub_process, callbacks) -> None:
    hub = hub_process("--workers", "1", "--log-level", "WARNING")
    callback = callbacks.url("/behind")
    callbacks.answers["/behind"] = 503          # the subscriber is down: its cursor stays behind
    subscribe(hub.url, TOPIC, callback)
    wait_until(lambda: active_subscriptions(hub.url) == 1, 30, "the subscription")
    for i in range(1, 4):
        publish(hub.url, TOPIC, notification(i))
    wait_until(lambda: callbacks.posts.get("/behind", 0) >= 1, 30, "a first, refused delivery")

    subscribe(hub.url, TOPIC, callback, **{REPLAY: "99"})     # past the end: no replay, no jump either
    wait_until(lambda: len(callbacks.verified) == 2, 30, "the renewal's verification")
    callbacks.answers["/behind"] = 200
    wait_until(lambda: callbacks.received("/behind") == [1, 2, 3], 30, "the three it had not had")

"""What a followed topic costs Redis per notification. Once a worker follows a topic, its blocking
read of the log feeds the window its subscriptions' runs send from: a run that caught up reads
no log of its own, the follower renews its lease a third of a lease ahead, not at every read, and
while this worker's runs hold every subscription of the topic it claims nothing (no pass over the
topic's subscriptions per read). Counted by the Redis server itself (INFO commandstats), the load
an operator pays for: a change that brings back a log read or a script per notification shows here."""
from __future__ import annotations

import threading
import time
import urllib.parse

from rsnotify.hub import keys
from rsnotify.hub.worker import verifying

from .support import FORM_TYPE, active_subscriptions, http, notification, publish, subscribe, wait_until

TOPIC = "http://source.example.org/steady"
NOTIFICATIONS = 60
SPACING = 0.02              # s between publishes: each of the follower's reads brings one entry
PER_SECOND = 20             # scripts a worker runs by the clock, whatever it delivers (~12 seen)


def test_a_followed_topic_costs_no_log_read_and_no_script_per_notification(
        hub_process, callbacks, redis_url, redis) -> None:
    hub = hub_process("--workers", "1", "--log-level", "WARNING", redis_url=redis_url)
    subscribe(hub.url, TOPIC, callbacks.url("/one"))
    wait_until(lambda: active_subscriptions(hub.url) == 1, 60, "the verified subscription")
    # a topic whose subscriptions came before their change counter did (an older hub) has none
    redis.delete(keys.topic_subs_changes_key(keys.topic_id(TOPIC)))
    # the first notification is fanned out by a job; the worker then follows the topic
    published = [publish(hub.url, TOPIC, notification(0))["sequence"]]
    wait_until(lambda: callbacks.received("/one") == published, 30, "the first notification")
    time.sleep(verifying.LINGER + 0.3)      # the verification lane stops glancing at its line

    redis.config_resetstat()
    started = time.monotonic()
    for i in range(1, NOTIFICATIONS + 1):
        published.append(publish(hub.url, TOPIC, notification(i))["sequence"])
        time.sleep(SPACING)
    wait_until(lambda: callbacks.received("/one") == published, 30, "every notification, in order, once")
    stats = redis.info("commandstats")
    elapsed = time.monotonic() - started

    def calls(command: str) -> int:
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    log_reads = calls("xrange")
    # each publish is one script (the append); the rest are the worker's, and only what runs by
    # the clock (checkpoints, the lease renewal, the retry lane's and heartbeat's turns: a few a
    # second). A claim pass per read of the log made it one more per notification; the lease
    # renewal at every read, two.
    worker_scripts = calls("evalsha") + calls("eval") - NOTIFICATIONS
    timed = PER_SECOND * elapsed
    print(f"{NOTIFICATIONS} notifications in {elapsed:.1f} s: {log_reads} XRANGE, {worker_scripts} worker scripts, "
          f"{calls('xread')} XREAD")
    assert calls("xread") >= NOTIFICATIONS // 2, "the worker stopped following the topic"
    assert log_reads <= 3, f"the runs read the log themselves: {log_reads} XRANGE for {NOTIFICATIONS} notifications"
    assert worker_scripts <= timed, (
        f"{worker_scripts} scripts for {NOTIFICATIONS} notifications in {elapsed:.1f} s: more than the "
        f"{timed:.0f} that run by the clock, so some run per read of the log")


def unsubscribe(hub_url: str, topic: str, callback: str) -> None:
    form = urllib.parse.urlencode({"hub.mode": "unsubscribe", "hub.topic": topic, "hub.callback": callback}).encode()
    status, body, _ = http("POST", hub_url, form, {"Content-Type": FORM_TYPE})
    assert status == 202, body


def test_subscriptions_that_come_and_go_on_a_followed_topic_are_served_at_once(hub_process, callbacks) -> None:
    """The follower skips its claim pass only while its runs hold every subscription of the topic;
    a subscription added meanwhile (also one that takes the place of one removed, so that their
    number stays) gets what is published next, while the follower keeps reading, not after the
    reconciler's next look (an hour away here)."""
    hub = hub_process("--workers", "1", "--log-level", "WARNING", "--reconcile-interval", "3600")
    topic = TOPIC + "/newcomers"
    subscribe(hub.url, topic, callbacks.url("/one"))
    wait_until(lambda: active_subscriptions(hub.url) == 1, 60, "the first subscription")
    published: list[int] = []
    stop = threading.Event()

    def stream() -> None:
        for i in range(3000):                # at most a minute
            if stop.is_set():
                return
            published.append(publish(hub.url, topic, notification(i))["sequence"])
            time.sleep(SPACING)

    publisher = threading.Thread(target=stream)
    publisher.start()
    try:
        wait_until(lambda: len(callbacks.received("/one")) >= 10, 30, "the stream at the first subscriber")
        subscribe(hub.url, topic, callbacks.url("/two"))
        wait_until(lambda: callbacks.received("/two"), 10, "a notification at the subscription added")
        # one goes, another comes: the topic has as many subscriptions as when the follower last
        # claimed, and its runs hold one of them
        unsubscribe(hub.url, topic, callbacks.url("/one"))
        wait_until(lambda: active_subscriptions(hub.url) == 1, 30, "the unsubscribe")
        subscribe(hub.url, topic, callbacks.url("/three"))
        wait_until(lambda: callbacks.received("/three"), 10, "a notification at the subscription that came in place")
        assert publisher.is_alive(), "the stream ended before the new subscriptions were served: no follower to test"
    finally:
        stop.set()
        publisher.join()
    for path in ("/two", "/three"):
        got = wait_until(lambda p=path: (lambda r: r and r[-1] == published[-1] and r)(callbacks.received(p)), 30,
                         f"the last notification at {path}")
        assert got == published[published.index(got[0]):], f"{path} missed or repeated notifications: {got}"


SHARED_SUBSCRIBERS = 40     # above fanout.SHARE_FROM (32): both workers follow the topic


def test_the_claim_passes_of_a_topic_two_workers_follow_read_no_subscription_a_live_run_holds(
        hub_process, callbacks, redis_url, redis) -> None:
    """Each follower of a shared topic looks for subscriptions to claim at every read of its log;
    the ones a live run holds (nearly all, at a steady rate) are counted from their lock alone,
    not read whole (HMGET), which made every pass cost Redis ~1 µs per subscription."""
    hub = hub_process("--workers", "2", "--log-level", "WARNING", redis_url=redis_url)
    topic = TOPIC + "/shared"
    paths = [f"/s{n}" for n in range(SHARED_SUBSCRIBERS)]
    for path in paths:
        subscribe(hub.url, topic, callbacks.url(path))
    wait_until(lambda: active_subscriptions(hub.url) == SHARED_SUBSCRIBERS, 60, "the verified subscriptions")
    published = [publish(hub.url, topic, notification(0))["sequence"]]
    wait_until(lambda: all(callbacks.received(p) == published for p in paths), 30, "the first notification")
    time.sleep(verifying.LINGER + 0.3)

    redis.config_resetstat()
    for i in range(1, NOTIFICATIONS + 1):
        published.append(publish(hub.url, topic, notification(i))["sequence"])
        time.sleep(SPACING)
    wait_until(lambda: all(callbacks.received(p) == published for p in paths), 60,
               "every notification at every subscriber, in order, once")
    stats = redis.info("commandstats")

    def calls(command: str) -> int:
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    passes = calls("smembers")
    print(f"{NOTIFICATIONS} notifications x {SHARED_SUBSCRIBERS}: {passes} claim passes, {calls('hmget')} HMGET")
    assert passes >= NOTIFICATIONS, "the workers did not follow the topic (no pass per read)"
    # a subscription is read whole when its run let it go (a worker's share is shifting) or a
    # worker claims it: a few per pass at most, where reading every one made it 40 a pass
    assert calls("hmget") <= passes * SHARED_SUBSCRIBERS / 4, (
        f"{calls('hmget')} HMGET in {passes} passes over {SHARED_SUBSCRIBERS} subscriptions: the passes read "
        "subscriptions that live runs hold")

"""What a followed topic costs Redis per notification. Once a worker follows a topic, its blocking
read of the log feeds the window its subscriptions' runs send from: a run that caught up reads
no log of its own, and the follower renews its lease a third of a lease ahead, not at every read.
Counted by the Redis server itself (INFO commandstats), the load an operator pays for: a change
that brings back a log read or a script per notification shows here."""
from __future__ import annotations

import time

from rsnotify.hub.worker import verifying

from .support import active_subscriptions, notification, publish, subscribe, wait_until

TOPIC = "http://source.example.org/steady"
NOTIFICATIONS = 60
SPACING = 0.02              # s between publishes: each of the follower's reads brings one entry
PER_SECOND = 20             # scripts a worker runs by the clock, whatever it delivers (~12 seen)


def test_a_followed_topic_costs_no_log_read_and_at_most_one_script_per_notification(
        hub_process, callbacks, redis_url, redis) -> None:
    hub = hub_process("--workers", "1", "--log-level", "WARNING", redis_url=redis_url)
    subscribe(hub.url, TOPIC, callbacks.url("/one"))
    wait_until(lambda: active_subscriptions(hub.url) == 1, 60, "the verified subscription")
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
    # each publish is one script (the append); the rest are the worker's: one claim per read of
    # the log, and what runs by the clock (checkpoints, the retry lane's and heartbeat's turns: a
    # few a second). The lease renewal at every read made it two per read.
    worker_scripts = calls("evalsha") + calls("eval") - NOTIFICATIONS
    timed = PER_SECOND * elapsed
    print(f"{NOTIFICATIONS} notifications in {elapsed:.1f} s: {log_reads} XRANGE, {worker_scripts} worker scripts, "
          f"{calls('xread')} XREAD")
    assert calls("xread") >= NOTIFICATIONS // 2, "the worker stopped following the topic"
    assert log_reads <= 3, f"the runs read the log themselves: {log_reads} XRANGE for {NOTIFICATIONS} notifications"
    assert worker_scripts <= NOTIFICATIONS + timed, (
        f"{worker_scripts} scripts for {NOTIFICATIONS} notifications in {elapsed:.1f} s: more than one per read "
        f"of the log (and {timed:.0f} by the clock)")

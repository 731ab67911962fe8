"""A busy topic is served by both workers: after its first fan-out, the worker that took it asks
the other to follow it too, and the subscriptions are shared between them while notifications
keep coming (each worker keeps only its share of them between notifications), so the sends do
not wait for one worker while the other idles. Measured by the CPU each worker spends."""
from __future__ import annotations

import threading
import time

from .support import (
    active_subscriptions,
    cpu_seconds,
    notification,
    publish,
    subscribe,
    wait_until,
    worker_pids,
)

TOPIC = "http://source.example.org/busy"
SUBSCRIBERS = 60            # above fanout.SHARE_FROM (32): a second worker is asked to follow
RATE = 20.0                 # notifications per second
SECONDS = 4.0


def test_a_followed_topics_deliveries_are_shared_by_both_workers(hub_process, callbacks) -> None:
    hub = hub_process("--workers", "2", "--log-level", "WARNING")
    paths = [f"/s{n}" for n in range(SUBSCRIBERS)]
    for path in paths:
        subscribe(hub.url, TOPIC, callbacks.url(path))
    wait_until(lambda: active_subscriptions(hub.url) == SUBSCRIBERS, 60, "the verified subscriptions")
    workers = wait_until(lambda: len(worker_pids(hub.process.pid)) == 2 and worker_pids(hub.process.pid), 30,
                         "two workers")
    published: list[int] = []

    def stream() -> None:
        start = time.monotonic()
        for i in range(int(RATE * SECONDS)):
            time.sleep(max(0.0, start + i / RATE - time.monotonic()))
            published.append(publish(hub.url, TOPIC, notification(i))["sequence"])

    # the first notification is fanned out by one worker, which claims every subscription; the
    # next ones come while its runs still hold them
    cpu = {pid: cpu_seconds(pid) for pid in workers}
    publisher = threading.Thread(target=stream)
    publisher.start()
    publisher.join()
    wait_until(lambda: all(callbacks.received(p) == published for p in paths), 60,
               "every notification at every subscriber, in order, once")
    spent = sorted(cpu_seconds(pid) - cpu[pid] for pid in workers)
    print(f"CPU of the two workers over {len(published)} notifications x {SUBSCRIBERS}: {spent}")
    # before the sharing one worker did the sends (0.11 : 0.96 s here); shared, the two are alike
    assert spent[0] >= 0.35 * spent[1], f"one worker did the sends, the other idled: CPU {spent}"

"""Isolation: an unrelated topic's publish→delivery latency while hostile subscribers load the hub.

The hostile part, set up once per hub: subscription requests for black-hole callbacks (they
accept TCP and never answer, so each verification GET waits for the hub's fetch timeout) and
subscribers that echo the challenge but hang on every POST (each delivery waits for the hub's
delivery timeout, then is retried), with notifications published to their topic every run. The
measured part: a healthy topic with a few subscribers on the sinks, published to at a steady
rate, plus one legitimate subscription verified in the middle of it all.
"""
from __future__ import annotations

import asyncio
import time

from . import checks
from .payloads import bodies
from .scenarios import (
    Bench,
    hub_cpu,
    publish,
    request_subscriptions,
    setup_topic,
    steady_publish,
    subscribe_all,
    wait_and_check,
)
from .traps import TrapProcess

SETTLE_SECONDS = 1.0      # s the hostile load runs before a measurement starts


async def scenario_isolation(bench: Bench) -> list[dict]:
    """Black holes + hanging subscribers vs. an unrelated topic's latency and a new verification."""
    s = bench.sizes
    hub = bench.start_hub()
    traps = None
    try:
        await hub.wait_ready(bench.session)
        traps = TrapProcess()
        tag = bench.tag()
        topic, names, _ = await setup_topic(bench, hub, "isolation", s.isolation_subscribers)
        hanging_topic = f"http://bench.example.org/hanging/{tag}"
        await subscribe_all(bench, hub, hanging_topic, [traps.hanging(f"h-{tag}-{i}") for i in range(s.isolation_hanging)],
                            concurrency=s.subscribe_concurrency)
        await request_subscriptions(bench, hub.url, f"http://bench.example.org/black-hole/{tag}",
                                    [traps.black_hole(f"b-{tag}-{i}") for i in range(s.isolation_black_holes)],
                                    concurrency=s.subscribe_concurrency)
        hostile = bodies(1, s.entries)[0]
        count = max(1, round(s.isolation_rate * s.isolation_seconds))
        results = []
        for run in range(1, s.runs + 1):
            await publish(bench.session, hub.url, hanging_topic, hostile)   # fresh hanging deliveries every run
            await asyncio.sleep(SETTLE_SECONDS)
            await bench.sink.reset(bench.session)
            cpu = hub_cpu(hub, bench)
            started = time.time()
            verify_topic = f"http://bench.example.org/isolation-verify/{tag}/{run}"
            verification = asyncio.ensure_future(
                subscribe_all(bench, hub, verify_topic, [bench.sink.url(f"iso-verify-{tag}-{run}")], concurrency=1))
            sent_at, _, _ = await steady_publish(bench, hub.url, topic, bodies(count, s.entries), s.isolation_rate)
            verify_seconds = await verification
            seqs = sorted(sent_at)
            snapshot, result = await wait_and_check(bench, {n: seqs for n in names}, started)
            latency = checks.latency_summary(checks.latencies(snapshot, sent_at))
            health = await hub.health(bench.session)
            result.update(latency)
            result.update(scenario="isolation", run=run, subscribers=len(names), notifications=count,
                          rate_per_s=s.isolation_rate, black_holes=s.isolation_black_holes,
                          hanging=s.isolation_hanging, verify_ms=round(verify_seconds * 1000, 1),
                          health_status=health.get("status"), lanes=health.get("lanes"), cpu=cpu.done())
            bench.emit(result)
            results.append(result)
        return results
    finally:
        if traps is not None:
            traps.stop()
        hub.stop()

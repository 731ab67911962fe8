"""Failover: SIGKILL the worker that is delivering a topic, in the middle of a steady stream of
notifications, and measure how long its subscribers hear nothing.

A topic this small is served by one worker (it follows the topic's log); that worker is the one
that used the most CPU during the stream, and it gets the SIGKILL. The hub starts a new worker
by itself; the question is how soon the surviving one takes the topic's subscriptions over.
Delivery is at least once: notifications the killed worker sent but never recorded come again,
so duplicates are counted, not failed; a missing notification fails the run.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time

from . import checks
from .payloads import bodies
from .procstat import cpu_seconds
from .scenarios import Bench, setup_topic, steady_publish

SAMPLE_SECONDS = 0.5      # s of CPU sampling that tells the delivering worker
REPLACED_TIMEOUT = 60.0   # s the hub gets to start a replacement worker
WARM_SECONDS = 3.0        # s a replacement worker gets to come up before the next run


def busiest(pids: list[int], before: dict[int, float]) -> int:
    return max(pids, key=lambda pid: cpu_seconds(pid) - before.get(pid, 0.0))


def stall_after(times: list[float], killed_at: float) -> float:
    """The longest a subscriber heard nothing after the kill (seconds), its receive times given."""
    after = sorted(t for t in times if t >= killed_at)
    if not after:
        return float("nan")
    points = [killed_at, *after]
    return max(b - a for a, b in itertools.pairwise(points))


async def wait_workers(hub, count: int, replaced: int) -> None:
    """Wait until the hub runs `count` workers again, none of them `replaced`, and let them boot."""
    deadline = time.monotonic() + REPLACED_TIMEOUT
    while True:
        workers = hub.child_pids()["worker"]
        if len(workers) >= count and replaced not in workers:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the hub did not replace its killed worker within {REPLACED_TIMEOUT:.0f}s; "
                               f"hub log:\n{hub.log_tail()}")
        await asyncio.sleep(0.1)
    await asyncio.sleep(WARM_SECONDS)


async def scenario_failover(bench: Bench) -> list[dict]:
    """Steady publishing to one topic; SIGKILL its worker mid-stream; the subscribers' longest silence."""
    s = bench.sizes
    hub = bench.start_hub()
    try:
        await hub.wait_ready(bench.session)
        topic, names, _ = await setup_topic(bench, hub, "failover", s.failover_subscribers)
        workers = len(hub.child_pids()["worker"])
        count = max(1, round(s.failover_rate * (s.failover_before + s.failover_after)))
        results = []
        for run in range(1, s.runs + 1):
            await bench.sink.reset(bench.session)
            stream = asyncio.ensure_future(steady_publish(bench, hub.url, topic, bodies(count, s.entries), s.failover_rate))
            await asyncio.sleep(max(0.0, s.failover_before - SAMPLE_SECONDS))
            pids = hub.child_pids()["worker"]
            before = {pid: cpu_seconds(pid) for pid in pids}
            await asyncio.sleep(SAMPLE_SECONDS)
            victim = busiest(pids, before)
            killed_at = time.time()
            os.kill(victim, signal.SIGKILL)
            sent_at, _, _ = await stream
            seqs = sorted(sent_at)
            expected = {n: seqs for n in names}
            await bench.sink.wait_deliveries(bench.session, len(names) * len(seqs), timeout=bench.timeout,
                                             stall=bench.timeout)
            await asyncio.sleep(0.2)   # a late duplicate shows up in the check too
            snapshot = await bench.sink.records(bench.session)
            check = checks.check_deliveries(snapshot, expected)
            paths = snapshot["paths"]
            stall = max(stall_after(paths.get(n, {"t": []})["t"], killed_at) for n in names)
            after_kill = {seq: t for seq, t in sent_at.items() if t >= killed_at}
            late = checks.latencies(snapshot, after_kill)
            # at least once: a duplicate is allowed (and counted), a missing notification is not
            ok = not (check.missing or check.unexpected or check.bad_requests or check.out_of_order)
            result = {"scenario": "failover", "run": run, "subscribers": len(names), "notifications": len(seqs),
                      "rate_per_s": s.failover_rate, "stall_s": round(stall, 3),
                      "max_latency_after_kill_s": round(max(late), 3) if late else None,
                      "duplicates": check.duplicates, "check": {**check.as_dict(), "ok": ok}}
            bench.emit(result)
            results.append(result)
            await wait_workers(hub, workers, victim)
        return results
    finally:
        hub.stop()

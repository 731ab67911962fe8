"""Replication: the same hub on a plain Redis and on a Sentinel URL with --min-replicas 1 (three
data nodes, three Sentinels, all on this machine), in one run: fan-out rate and publish latency
side by side (the cost of waiting for a replica), then the delivery stall around a SIGKILL of the
primary while a steady stream of notifications goes on.

The publisher of the stall part sends a notification again with the same Idempotency-Key while
the hub answers 503 (a failover in progress), as the README asks of publishers; every
notification answered 200 must reach every subscriber, in order.
"""
from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from rsnotify.hub.redis_server import start_redis_server
from tests.support.sentinels import SentinelGroup, start_sentinel_group

from . import checks
from .failover import stall_after
from .hubproc import HubProcess
from .payloads import bodies, submission_headers
from .scenarios import Bench, fanout_run, publish, setup_topic, wait_and_check

DOWN_AFTER_MS = 1000          # Sentinel's down-after-milliseconds here (production: 5000 or more)
RETRY_DELAY = 0.1             # s between a 503 and the same publish again
REJOIN_TIMEOUT = 30.0         # s the killed primary gets to come back as a replica before the next run


async def publish_latency(bench: Bench, hub: HubProcess, count: int) -> dict:
    """`count` publishes one after another to a topic of their own (no fan-out follows, so the
    next run measures nothing of theirs): their answer times (ms percentiles)."""
    topic = f"http://bench.example.org/replication-publish/{bench.tag()}"
    answered = []
    for body in bodies(count, bench.sizes.entries):
        started = time.perf_counter()
        await publish(bench.session, hub, topic, body)
        answered.append(time.perf_counter() - started)
    summary = checks.latency_summary(answered)
    return {f"publish_{k}": v for k, v in summary.items()}


async def publish_through_failover(bench: Bench, hub: HubProcess, topic: str, count: int, rate: float,
                                   refusals: list[float]) -> dict[int, float]:
    """Publish `count` notifications at `rate` per second, each sent again (same Idempotency-Key)
    while the hub answers 503; sequence -> epoch time of its first POST."""
    payloads = bodies(count, bench.sizes.entries)
    sent_at: dict[int, float] = {}
    run = bench.tag()

    async def publish_at(index: int, when: float) -> None:
        await asyncio.sleep(max(0.0, when - time.monotonic()))
        first = time.time()
        headers = {**submission_headers(topic, hub.url), "Idempotency-Key": f"{run}-{index}"}
        while True:
            async with bench.session.post(hub.url, data=payloads[index], headers=headers) as response:
                if response.status == 200:
                    sent_at[(await response.json())["sequence"]] = first
                    return
                if response.status != 503 or time.time() - first > bench.timeout:
                    raise RuntimeError(f"the hub refused a submission: {response.status} {await response.text()}")
                refusals.append(time.time())
            await asyncio.sleep(RETRY_DELAY)

    origin = time.monotonic() + 0.05
    await asyncio.gather(*(publish_at(i, origin + i / rate) for i in range(count)))
    return sent_at


async def stall_run(bench: Bench, hub: HubProcess, group: SentinelGroup, topic: str, names: list[str],
                    run: int) -> dict:
    s = bench.sizes
    await bench.sink.reset(bench.session)
    count = max(1, round(s.failover_rate * (s.failover_before + s.failover_after)))
    refusals: list[float] = []
    stream = asyncio.ensure_future(publish_through_failover(bench, hub, topic, count, s.failover_rate, refusals))
    await asyncio.sleep(s.failover_before)
    killed = group.primary()
    killed.kill()
    killed_at = time.time()
    sent_at = await stream
    seqs = sorted(sent_at)
    expected = {n: seqs for n in names}
    # waits past duplicates (a failover repeats what was sent but not yet recorded) for every one
    snapshot, _ = await wait_and_check(bench, expected, killed_at)
    check = checks.check_deliveries(snapshot, expected)
    paths = snapshot["paths"]
    stall = max(stall_after(paths.get(n, {"t": []})["t"], killed_at) for n in names)
    ok = not (check.missing or check.unexpected or check.bad_requests or check.out_of_order)
    result = {"scenario": "replication-stall", "run": run, "subscribers": len(names), "notifications": len(seqs),
              "rate_per_s": s.failover_rate, "stall_s": round(stall, 3), "down_after_s": DOWN_AFTER_MS / 1000,
              "refused_503": len(refusals),
              "refusing_s": round(max(refusals) - killed_at, 3) if refusals else 0.0,
              "duplicates": check.duplicates, "check": {**check.as_dict(), "ok": ok}}
    # the old primary comes back (Sentinel makes it a replica), so the next run has two replicas again
    killed.start()
    await asyncio.to_thread(group.wait_for_replicas, 2, REJOIN_TIMEOUT)
    return result


async def scenario_replication(bench: Bench) -> list[dict]:
    """Fan-out and publish latency on plain Redis and on Sentinel + --min-replicas 1; the stall
    around a primary kill."""
    s = bench.sizes
    folder = Path(tempfile.mkdtemp(prefix="rsnb-repl-", dir="/tmp"))
    plain = await asyncio.to_thread(start_redis_server, folder / "plain", unix_socket=False)
    group = await asyncio.to_thread(start_sentinel_group, folder / "sentinel", down_after_ms=DOWN_AFTER_MS,
                                    failover_timeout_ms=2000)
    results: list[dict] = []
    try:
        for variant, url, args in (("plain", plain.url, ("--min-replicas", "0")),
                                   ("sentinel", group.url(), ("--min-replicas", "1"))):
            hub = HubProcess(workers=2, redis_url=url, extra_args=args)
            try:
                await hub.wait_ready(bench.session)
                topic, names, _ = await setup_topic(bench, hub, f"replication-{variant}", s.fanout_subscribers)
                for run in range(1, s.runs + 1):
                    result = await fanout_run(bench, hub, topic, names, s.fanout_notifications, run,
                                              scenario=f"replication-{variant}")
                    result.update(await publish_latency(bench, hub, s.replication_publishes))
                    result["min_replicas"] = int(args[1])
                    bench.emit(result)
                    results.append(result)
                if variant == "sentinel":
                    topic, names, _ = await setup_topic(bench, hub, "replication-stall", s.failover_subscribers)
                    for run in range(1, s.runs + 1):
                        result = await stall_run(bench, hub, group, topic, names, run)
                        bench.emit(result)
                        results.append(result)
            finally:
                hub.stop()
    finally:
        group.stop()
        plain.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return results

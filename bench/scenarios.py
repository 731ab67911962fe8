"""The scenarios. Each one sets up once (hub, subscriptions), then measures `runs` times; every
run returns one result dict (the JSON line) and every delivery of it is checked."""
from __future__ import annotations

import asyncio
import itertools
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from . import checks
from .ceiling import run_clients
from .ceilings import CeilingServer
from .hubproc import HubProcess
from .payloads import bodies, submission_headers
from .procstat import CpuMeter
from .sinks import SinkProcess

SUBSCRIBE_LEASE = 86400
FORM_TYPE = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is; `quick()` for the default run, `full()` for the issue's sizes."""

    runs: int = 3
    entries: int = 10                     # <url> entries per notification
    # in flight per ceiling client process: the fastest of 25, 50, 100 and 200 on the 2-core machine
    # (more connections cost the client and the sinks more CPU per request)
    ceiling_concurrency: int = 25
    fanout_subscribers: int = 1000
    fanout_notifications: int = 20
    latency_subscribers: int = 100
    latency_rate: float = 20.0            # notifications per second
    latency_seconds: float = 10.0
    ingest_submissions: int = 10000
    ingest_concurrency: int = 32          # submissions in flight
    subscribe_count: int = 2000
    subscribe_concurrency: int = 64
    scale_subscriptions: int = 100_000
    scale_topics: int = 10_000
    scale_hot_subscribers: int = 1000
    scale_notifications: int = 20
    peer_subscribers: int = 1000
    peer_notifications: int = 20
    isolation_black_holes: int = 1000     # subscription requests whose callbacks never answer
    isolation_hanging: int = 300          # subscribers that echo the challenge, then hang on every POST
    isolation_subscribers: int = 10       # the unrelated topic's healthy subscribers
    isolation_rate: float = 20.0          # notifications per second to the unrelated topic
    isolation_seconds: float = 10.0
    failover_subscribers: int = 20        # fewer than a fan-out shares with a second worker: one worker serves them
    failover_rate: float = 20.0           # notifications per second
    failover_before: float = 2.0          # s of publishing before the SIGKILL
    failover_after: float = 8.0           # s of publishing after it
    source_publishes: int = 300           # publishes per run, with and without the change memory
    source_edits: int = 20                # file edits per run for rsnotify source's detect->publish latency
    source_resources: int = 100_000       # resources in the Resource List rendered for its peak RSS
    replication_publishes: int = 200      # one-at-a-time publishes timed on plain Redis and on Sentinel
    sync_resources: int = 10_000          # 2 KB resources in the Destination's baseline (sync scenario)

    @classmethod
    def full(cls) -> Sizes:
        return cls(runs=5, sync_resources=100_000)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(runs=3, latency_seconds=5.0, ingest_submissions=3000, subscribe_count=1000,
                   scale_subscriptions=10_000, scale_topics=1_000, peer_notifications=5, isolation_seconds=5.0)

    @classmethod
    def smoke(cls) -> Sizes:
        """The smallest configuration of each scenario (the test suite's)."""
        return cls(runs=1, ceiling_concurrency=5, fanout_subscribers=20, fanout_notifications=3,
                   latency_subscribers=5, latency_rate=10.0, latency_seconds=0.5,
                   ingest_submissions=40, ingest_concurrency=4, subscribe_count=20,
                   subscribe_concurrency=8, scale_subscriptions=200, scale_topics=20,
                   scale_hot_subscribers=20, scale_notifications=2, peer_subscribers=10, peer_notifications=2,
                   isolation_black_holes=20, isolation_hanging=10, isolation_subscribers=2, isolation_seconds=0.5,
                   failover_subscribers=3, failover_before=1.0, failover_after=2.0,
                   source_publishes=10, source_edits=2, source_resources=1_000, replication_publishes=10,
                   sync_resources=200)


@dataclass
class Bench:
    """What every scenario shares: sizes, the sinks, an HTTP session, how to start a hub, output."""

    sizes: Sizes
    sink: SinkProcess
    session: aiohttp.ClientSession
    start_hub: Callable[[], HubProcess]
    emit: Callable[[dict], None]
    timeout: float = 300.0
    ceiling_runs: list[dict] = field(default_factory=list)
    profiler: object | None = None       # bench.profiling.Profiler, when --profile is given
    ceiling_processes: int = 2           # client processes of the ceiling (as many as the hub's workers)

    def ceiling_median(self) -> float:
        return checks.median_of(self.ceiling_runs, "rate")

    def tag(self) -> str:
        return uuid.uuid4().hex[:8]


# --- helpers -------------------------------------------------------------------------------------


async def request_subscriptions(bench: Bench, hub_url: str, topic: str, callbacks: Sequence[str], *,
                                concurrency: int) -> None:
    """POST a subscribe request for each callback (202 each); their verification is left to the hub."""
    pending = iter(callbacks)
    refused: list[str] = []

    async def one_by_one() -> None:
        for callback in pending:
            form = {"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": callback,
                    "hub.lease_seconds": str(SUBSCRIBE_LEASE)}
            async with bench.session.post(hub_url, data=form) as response:
                if response.status != 202:
                    refused.append(f"{response.status} {await response.text()}")

    await asyncio.gather(*(one_by_one() for _ in range(min(concurrency, len(callbacks)))))
    if refused:
        raise RuntimeError(f"{len(refused)} subscription requests refused, first: {refused[0]}")


async def subscribe_all(bench: Bench, hub: HubProcess, topic: str, callbacks: Sequence[str], *,
                        concurrency: int) -> float:
    """Subscribe every callback to `topic` through the hub's WebSub endpoint; wait until the hub
    counts them all as active (GET /health). Returns seconds from the first request to that."""
    base = (await hub.health(bench.session))["subscriptions"]
    started = time.perf_counter()
    await request_subscriptions(bench, hub.url, topic, callbacks, concurrency=concurrency)
    deadline = time.monotonic() + bench.timeout
    while True:
        active = (await hub.health(bench.session))["subscriptions"] - base
        if active >= len(callbacks):
            return time.perf_counter() - started
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {active} of {len(callbacks)} subscriptions became active "
                               f"within {bench.timeout:.0f}s; hub log:\n{hub.log_tail()}")
        await asyncio.sleep(0.02)


async def publish(session: aiohttp.ClientSession, url: str, topic: str, body: bytes) -> dict:
    """One ResourceSync submission to the hub at `url`; its JSON answer (notification_id, sequence)."""
    async with session.post(url, data=body, headers=submission_headers(topic, url)) as response:
        if response.status != 200:
            raise RuntimeError(f"the hub refused a submission: {response.status} {await response.text()}")
        return await response.json()


async def wait_and_check(bench: Bench, expected: dict[str, list[int]], started: float) -> tuple[dict, dict]:
    """Wait for every expected delivery, then check them all; (snapshot, result fields)."""
    total = sum(len(v) for v in expected.values())
    deadline = time.monotonic() + bench.timeout
    count, complete = await bench.sink.wait_deliveries(bench.session, total, timeout=bench.timeout)
    if complete:
        await asyncio.sleep(0.05)  # let a stray duplicate or extra delivery show up in the check
    snapshot = await bench.sink.records(bench.session)
    check = checks.check_deliveries(snapshot, expected)
    while complete and check.missing:  # duplicates made the count: wait for the missing ones
        count, complete = await bench.sink.wait_deliveries(bench.session, count + 1,
                                                           timeout=max(0.0, deadline - time.monotonic()))
        snapshot = await bench.sink.records(bench.session)
        check = checks.check_deliveries(snapshot, expected)
    elapsed = checks.last_receive_time(snapshot) - started
    return snapshot, {"deliveries": check.received, "seconds": round(elapsed, 4),
                      "rate": round(check.received / elapsed, 1) if elapsed > 0 else 0.0,
                      "complete": complete, "check": check.as_dict()}


def profile_start(bench: Bench, scenario: str, hub: HubProcess) -> None:
    if bench.profiler is not None:
        bench.profiler.start(scenario, hub)


def profile_stop(bench: Bench) -> None:
    if bench.profiler is not None:
        bench.profiler.stop()


def hub_cpu(hub: HubProcess, bench: Bench) -> CpuMeter:
    kids = hub.child_pids()
    roles = {"hub": [hub.pid] if hub.pid else [], "workers": kids["worker"], "redis": kids["redis"],
             "sinks": [bench.sink.pid], "bench": [0]}
    if len(kids["worker"]) > 1:   # how the deliveries were shared among the workers
        roles.update((f"worker{n}", [pid]) for n, pid in enumerate(kids["worker"], 1))
    return CpuMeter(roles)


# --- ceiling ------------------------------------------------------------------------------------


async def ceiling_run(bench: Bench, subscribers: int, notifications: int, run: int) -> dict:
    """Plain aiohttp clients POSTing the fan-out's payloads straight to the same sinks (bench.ceiling)."""
    sizes = bench.sizes
    tag = bench.tag()
    names = [f"ceil-{tag}-{i}" for i in range(subscribers)]
    await bench.sink.reset(bench.session)
    cpu = hub_cpu_for_sink(bench)
    started, client_cpu = await run_clients(bench.sink.base, names, notifications, sizes.entries, sizes.ceiling_concurrency,
                                            bench.ceiling_processes, f"http://bench.example.org/ceiling/{tag}", tag)
    expected = {name: list(range(1, notifications + 1)) for name in names}
    _, result = await wait_and_check(bench, expected, started)
    result.update(scenario="ceiling", run=run, subscribers=subscribers, notifications=notifications,
                  processes=bench.ceiling_processes, cpu={**cpu.done(), "clients": round(client_cpu, 2)})
    return result


def hub_cpu_for_sink(bench: Bench) -> CpuMeter:
    return CpuMeter({"sinks": [bench.sink.pid]})


async def scenario_ceiling(bench: Bench) -> list[dict]:
    s = bench.sizes
    results = []
    for run in range(1, s.runs + 1):
        result = await ceiling_run(bench, s.fanout_subscribers, s.fanout_notifications, run)
        bench.ceiling_runs.append(result)
        bench.emit(result)
        results.append(result)
    return results


# --- fan-out ------------------------------------------------------------------------------------


async def fanout_run(bench: Bench, hub: HubProcess, topic: str, names: list[str], notifications: int,
                     run: int, scenario: str = "fanout", ceiling: float | None = None) -> dict:
    """Publish `notifications` one after another; rate = deliveries / (first publish → last delivery).

    The ratio is to `ceiling` (the ceiling run paired with this one), else to the ceiling median."""
    payloads = bodies(notifications, bench.sizes.entries)
    await bench.sink.reset(bench.session)
    cpu = hub_cpu(hub, bench)
    profile_start(bench, scenario, hub)
    started = time.time()
    seqs = [(await publish(bench.session, hub.url, topic, body))["sequence"] for body in payloads]
    published = time.time() - started
    _, result = await wait_and_check(bench, {name: seqs for name in names}, started)
    profile_stop(bench)
    ceiling = ceiling or bench.ceiling_median()
    result.update(scenario=scenario, run=run, subscribers=len(names), notifications=notifications,
                  publish_seconds=round(published, 4), cpu=cpu.done(),
                  ceiling_ratio=_ratio(result["rate"], ceiling))
    return result


async def setup_topic(bench: Bench, hub: HubProcess, prefix: str, subscribers: int) -> tuple[str, list[str], float]:
    tag = bench.tag()
    topic = f"http://bench.example.org/{prefix}/{tag}"
    names = [f"{prefix}-{tag}-{i}" for i in range(subscribers)]
    seconds = await subscribe_all(bench, hub, topic, [bench.sink.url(n) for n in names],
                                  concurrency=bench.sizes.subscribe_concurrency)
    # warm-up: one notification to everyone, so connections exist as in a hub that has been running
    await bench.sink.reset(bench.session)
    seq = (await publish(bench.session, hub.url, topic, bodies(1, bench.sizes.entries)[0]))["sequence"]
    await wait_and_check(bench, {n: [seq] for n in names}, time.time())
    return topic, names, seconds


async def scenario_fanout(bench: Bench, *, with_ceiling: bool = True) -> list[dict]:
    """1,000 subscribers x 20 notifications (default); the ceiling is measured between the runs."""
    s = bench.sizes
    hub = bench.start_hub()
    try:
        await hub.wait_ready(bench.session)
        topic, names, _ = await setup_topic(bench, hub, "fanout", s.fanout_subscribers)
        results = []
        for run in range(1, s.runs + 1):
            paired = None
            if with_ceiling:  # interleaved, so both see the same background load
                ceiling = await ceiling_run(bench, s.fanout_subscribers, s.fanout_notifications, run)
                bench.ceiling_runs.append(ceiling)
                bench.emit(ceiling)
                paired = ceiling["rate"]
            result = await fanout_run(bench, hub, topic, names, s.fanout_notifications, run, ceiling=paired)
            bench.emit(result)
            results.append(result)
        return results
    finally:
        hub.stop()


# --- latency ------------------------------------------------------------------------------------


async def steady_publish(bench: Bench, url: str, topic: str, payloads: Sequence[bytes],
                         rate: float) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """Publish `payloads` at a steady `rate` per second to `url` (a hub or the relay ceiling);
    by sequence: when each was sent, answered, and stored (the stream id's time; hub only)."""
    sent_at: dict[int, float] = {}
    answered_at: dict[int, float] = {}
    stored_at: dict[int, float] = {}

    async def publish_at(index: int, when: float) -> None:
        await asyncio.sleep(max(0.0, when - time.monotonic()))
        t0 = time.time()
        answer = await publish(bench.session, url, topic, payloads[index])
        seq = answer["sequence"]
        sent_at[seq], answered_at[seq] = t0, time.time()
        millis = answer["notification_id"].partition("-")[0]
        if millis.isdigit():
            stored_at[seq] = int(millis) / 1000

    origin = time.monotonic() + 0.05
    await asyncio.gather(*(publish_at(i, origin + i / rate) for i in range(len(payloads))))
    return sent_at, answered_at, stored_at


async def latency_run(bench: Bench, url: str, topic: str, names: list[str], payloads: Sequence[bytes],
                      cpu: CpuMeter | None = None, hub: HubProcess | None = None) -> dict:
    """One steady-rate run; publish→delivery percentiles and the per-stage breakdown."""
    await bench.sink.reset(bench.session)
    if hub is not None:
        profile_start(bench, "latency", hub)
    started = time.time()
    sent_at, answered_at, stored_at = await steady_publish(bench, url, topic, payloads, bench.sizes.latency_rate)
    snapshot, result = await wait_and_check(bench, {n: sorted(sent_at) for n in names}, started)
    if hub is not None:
        profile_stop(bench)
    result.update(checks.latency_summary(checks.latencies(snapshot, sent_at)))
    result.update(subscribers=len(names), notifications=len(payloads), rate_per_s=bench.sizes.latency_rate,
                  publish_p50_ms=checks.latency_summary([answered_at[s] - sent_at[s] for s in sent_at])["p50_ms"],
                  stages=checks.stage_breakdown(snapshot, sent_at, answered_at, stored_at))
    if cpu is not None:
        result["cpu"] = cpu.done()
    return result


async def scenario_latency(bench: Bench) -> list[dict]:
    """100 subscribers; notifications at a steady 20/s for 10 s; publish→delivery percentiles,
    each run paired with the relay ceiling (the same publishes forwarded by a plain program)."""
    s = bench.sizes
    hub = bench.start_hub()
    ceiling: CeilingServer | None = None
    try:
        await hub.wait_ready(bench.session)
        ceiling = CeilingServer(_redis_url(hub), processes=bench.ceiling_processes)
        topic, names, _ = await setup_topic(bench, hub, "latency", s.latency_subscribers)
        payloads = bodies(max(1, round(s.latency_rate * s.latency_seconds)), s.entries)
        results: list[dict] = []
        for run in range(1, s.runs + 1):
            relay_names = [f"relay-{bench.tag()}-{i}" for i in range(len(names))]
            await ceiling.set_callbacks(bench.session, [bench.sink.url(n) for n in relay_names])
            relay = await latency_run(bench, ceiling.url("relay"), topic, relay_names, payloads,
                                      CpuMeter({"relay": ceiling.pids, "sinks": [bench.sink.pid]}))
            relay.update(scenario="relay", run=run)
            bench.emit(relay)
            result = await latency_run(bench, hub.url, topic, names, payloads, hub_cpu(hub, bench), hub)
            result.update(scenario="latency", run=run, relay_p50_ms=relay["p50_ms"], relay_p99_ms=relay["p99_ms"],
                          p50_ratio=_ratio(result["p50_ms"], relay["p50_ms"]),
                          p99_ratio=_ratio(result["p99_ms"], relay["p99_ms"]))
            bench.emit(result)
            results.extend((relay, result))
        return results
    finally:
        if ceiling is not None:
            ceiling.stop()
        hub.stop()


def _redis_url(hub: HubProcess) -> str:
    if not hub.redis_url:
        raise RuntimeError("the ceilings need the hub's Redis: give --redis-url with --hub-url")
    return hub.redis_url


def _ratio(figure: float, ceiling: float) -> float | None:
    if not ceiling or math.isnan(ceiling) or math.isnan(figure):
        return None
    return round(figure / ceiling, 3)


# --- ingest -------------------------------------------------------------------------------------


async def submit_all(url: str, topic: str, payloads: Sequence[bytes], count: int,
                     concurrency: int) -> tuple[list[int], float]:
    """POST `count` submissions to `url` (the hub or the ingest ceiling), `concurrency` in flight,
    from a client of their own; (sequences answered, seconds)."""
    seqs: list[int] = []
    counter = itertools.count()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as client:
        async def submit() -> None:
            while (i := next(counter)) < count:
                seqs.append((await publish(client, url, topic, payloads[i % len(payloads)]))["sequence"])

        started = time.perf_counter()
        await asyncio.gather(*(submit() for _ in range(count and concurrency)))
        return seqs, time.perf_counter() - started


async def scenario_ingest(bench: Bench) -> list[dict]:
    """Submissions accepted (200, stored) per second, one subscriber, its deliveries checked too;
    each run paired with the ingest ceiling (parse, one XADD to the same Redis, 200)."""
    s = bench.sizes
    hub = bench.start_hub()
    ceiling: CeilingServer | None = None
    try:
        await hub.wait_ready(bench.session)
        ceiling = CeilingServer(_redis_url(hub))
        payloads = bodies(min(s.ingest_submissions, 200), s.entries)
        results: list[dict] = []
        for run in range(1, s.runs + 1):
            plain_cpu = CpuMeter({"ceiling": [ceiling.pid], "redis": hub.child_pids()["redis"]})
            _, plain_seconds = await submit_all(ceiling.url("ingest"), "http://bench.example.org/ingest/ceiling",
                                                payloads, s.ingest_submissions, s.ingest_concurrency)
            plain_rate = round(s.ingest_submissions / plain_seconds, 1)
            used = plain_cpu.done()
            plain = {"scenario": "ingest-ceiling", "run": run, "rate": plain_rate, "check": {"ok": True},
                     "submissions": s.ingest_submissions, "concurrency": s.ingest_concurrency, "cpu": used,
                     "cpu_ms_per_publish": round(used["ceiling"] * 1000 / s.ingest_submissions, 3)}
            bench.emit(plain)
            results.append(plain)
            topic, names, _ = await setup_topic(bench, hub, "ingest", 1)
            await bench.sink.reset(bench.session)
            cpu = hub_cpu(hub, bench)
            profile_start(bench, "ingest", hub)
            started = time.time()
            seqs, accepted_in = await submit_all(hub.url, topic, payloads, s.ingest_submissions,
                                                 s.ingest_concurrency)
            profile_stop(bench)
            cpu_ingest = cpu.done()
            _, delivery = await wait_and_check(bench, {names[0]: sorted(seqs)}, started)
            rate = round(len(seqs) / accepted_in, 1)
            result = {"scenario": "ingest", "run": run, "accepted": len(seqs), "seconds": round(accepted_in, 4),
                      "rate": rate, "concurrency": s.ingest_concurrency, "ceiling_rate": plain_rate,
                      "ceiling_ratio": _ratio(rate, plain_rate),
                      "delivered_seconds": delivery["seconds"], "delivery_rate": delivery["rate"],
                      "complete": delivery["complete"], "check": delivery["check"], "cpu": cpu_ingest,
                      "cpu_ms_per_publish": round(cpu_ingest.get("hub", 0.0) * 1000 / max(1, len(seqs)), 3)}
            bench.emit(result)
            results.append(result)
        return results
    finally:
        if ceiling is not None:
            ceiling.stop()
        hub.stop()


# --- subscribe ----------------------------------------------------------------------------------


async def scenario_subscribe(bench: Bench) -> list[dict]:
    """Verified subscriptions per second: request → verification GET echoed → active; each run
    paired with the verification ceiling (the GET, the comparison and one HSET, then 202)."""
    s = bench.sizes
    hub = bench.start_hub()
    ceiling: CeilingServer | None = None
    try:
        await hub.wait_ready(bench.session)
        ceiling = CeilingServer(_redis_url(hub))
        results: list[dict] = []
        for run in range(1, s.runs + 1):
            tag = bench.tag()
            topic = f"http://bench.example.org/subscribe/{tag}"
            plain = [bench.sink.url(f"plain-{tag}-{i}") for i in range(s.subscribe_count)]
            started = time.perf_counter()
            await request_subscriptions(bench, ceiling.url("verify"), topic, plain, concurrency=s.subscribe_concurrency)
            plain_rate = round(len(plain) / (time.perf_counter() - started), 1)
            paired = {"scenario": "subscribe-ceiling", "run": run, "rate": plain_rate, "check": {"ok": True},
                      "subscriptions": len(plain), "concurrency": s.subscribe_concurrency}
            bench.emit(paired)
            results.append(paired)
            await bench.sink.reset(bench.session)
            cpu = hub_cpu(hub, bench)
            callbacks = [bench.sink.url(f"sub-{tag}-{i}") for i in range(s.subscribe_count)]
            profile_start(bench, "subscribe", hub)
            seconds = await subscribe_all(bench, hub, topic, callbacks, concurrency=s.subscribe_concurrency)
            profile_stop(bench)
            verified = (await bench.sink.count(bench.session))["verifications"]
            rate = round(len(callbacks) / seconds, 1)
            result = {"scenario": "subscribe", "run": run, "subscriptions": len(callbacks),
                      "seconds": round(seconds, 4), "rate": rate, "ceiling_rate": plain_rate,
                      "ceiling_ratio": _ratio(rate, plain_rate),
                      "verifications_seen": verified, "concurrency": s.subscribe_concurrency,
                      "check": {"ok": verified == len(callbacks)}, "cpu": cpu.done()}
            bench.emit(result)
            results.append(result)
        return results
    finally:
        if ceiling is not None:
            ceiling.stop()
        hub.stop()

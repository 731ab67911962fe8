"""The Destination sync (`rsnotify sync`): what a copy of a Source costs and how fast it follows.

- baseline: `rsnotify sync --once` of N x 2 KB resources from a loopback Source process
  (bench.sync_source), wall time and peak RSS (GNU time), side by side with the reference
  client `resync-sync --baseline` and a plain aiohttp fetch loop on the same Source in the same run,
  on the disk and on tmpfs; then `rsnotify audit` and `audit --deep` of the copy (time, peak RSS);
- catch-up: 500 changes (60% updates, 20% creations, 20% deletions) made while the Destination
  was stopped, then `rsnotify sync --once` again: wall time from start to exit, the resource GETs
  it made, and `rsnotify audit` to check the copy is equal;
- live: `rsnotify sync` running against `rsnotify hub`; 20 notifications/s of 10 updates each are
  published; the time from the hub POST to all 10 files holding their new bytes (p50, p99);
- inbox: deliveries POSTed (16 in flight) to the Destination's callback endpoint, which writes
  each to its SQLite inbox before answering: deliveries per second.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from rsnotify.datetimes import parse_w3c_datetime
from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange
from rsnotify.publisher import Publisher
from tests.support.ports import free_port
from rsnotify.xml import to_xml

from .scenarios import Bench

RSNOTIFY = str(Path(sys.executable).with_name("rsnotify"))
RESYNC = str(Path(sys.executable).with_name("resync-sync"))
TIME = shutil.which("time") or "/usr/bin/time"
TMPFS = "/dev/shm" if os.path.isdir("/dev/shm") else None   # the same baseline in memory: the disk's share


class _Proc:
    """A child process whose stdout lines are collected."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            self.lines.append(line.decode(errors="replace").strip())

    async def wait_line(self, predicate, timeout: float) -> str:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if predicate(line):
                    return line
            if self.process.returncode is not None:
                break
            await asyncio.sleep(0.02)
        raise RuntimeError(f"child {self.process.pid} never printed the expected line; got {self.lines[-5:]}")

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        self._reader.cancel()


async def _spawn(*args: str) -> _Proc:
    process = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.DEVNULL)
    return _Proc(process)


async def _measure(args: list[str], cwd: Path) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB, exit code) of one command, from GNU time."""
    wall, rss, code, _ = await _measure_cpu(args, cwd)
    return wall, rss, code


async def _measure_cpu(args: list[str], cwd: Path) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS in MB, exit code, CPU seconds: user + system, all its threads)."""
    report = cwd / f"time-{time.monotonic_ns()}.txt"
    process = await asyncio.create_subprocess_exec(TIME, "-f", "%e %M %U %S", "-o", str(report), *args, cwd=cwd,
                                                   stdout=asyncio.subprocess.DEVNULL,
                                                   stderr=asyncio.subprocess.DEVNULL)
    code = await process.wait()
    wall, rss_kb, user, system = report.read_text().strip().splitlines()[-1].split()
    return float(wall), int(rss_kb) / 1024, code, float(user) + float(system)


def _compile_bytecode() -> None:
    """Write the bytecode of the rsnotify package being measured (its role folders are reached
    through symlinks, which compileall does not follow, so each is named). An installed
    package has it; an editable checkout run with PYTHONDONTWRITEBYTECODE (as on the shared
    machine) compiled its ~150 modules again in each `rsnotify` started here, ~0.15 s of CPU
    the plain loop and resync, whose libraries are installed, never pay."""
    import compileall

    import rsnotify
    package = Path(rsnotify.__file__).resolve().parent
    for folder in (package, *(p.resolve() for p in package.iterdir() if p.is_symlink() and p.is_dir())):
        compileall.compile_dir(str(folder), quiet=2)


# A plain aiohttp loop (32 in flight, bodies read, nothing written or checked): the ceiling the
# loopback Source and this machine allow, measured in the same run.
_PLAIN_FETCH = """
import asyncio, sys, aiohttp
async def main(base, count):
    room = asyncio.Semaphore(32)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as session:
        async def one(i):
            async with room, session.get(f"{base}/r/{i}") as response:
                await response.read()
        await asyncio.gather(*(one(i) for i in range(count)))
asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _file_costs(folder: Path, count: int = 1000) -> dict[str, float]:
    """Microseconds per file, in `folder` now, of each step a baseline takes for a 2 KB resource:
    create, write, close, rename (what FolderSink.write_small does), md5 + sha-256 of the body
    (the fetcher's fixity), the state write (SyncState.commit, batched as the baseline commits,
    and one transaction per record for contrast), and an fsync (which rsnotify does not do)."""
    from rsnotify.subscriber.sync.outcomes import ResourceState
    from rsnotify.subscriber.sync.state import ResourceRecord, SyncState

    probe = folder / "probe"
    probe.mkdir()
    body = b"x" * 2048
    steps = dict.fromkeys(("create", "write", "close", "rename", "hash", "fsync"), 0.0)
    clock = time.perf_counter
    try:
        for n in range(count):
            partial, final = str(probe / f".partial-{n}"), str(probe / str(n))
            t0 = clock()
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            t1 = clock()
            os.write(fd, body)
            t2 = clock()
            os.close(fd)
            t3 = clock()
            os.replace(partial, final)
            t4 = clock()
            hashlib.md5(body).hexdigest()
            hashlib.sha256(body).hexdigest()
            t5 = clock()
            for name, spent in zip(("create", "write", "close", "rename", "hash"),
                                   (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                steps[name] += spent
        synced = max(1, count // 10)
        for n in range(synced):
            with open(probe / f"synced-{n}", "wb") as out:
                out.write(body)
                t0 = clock()
                os.fsync(out.fileno())
                steps["fsync"] += clock() - t0
        records = [ResourceRecord(f"http://127.0.0.1/r/{n}", f"r/{n}", ResourceState.OK, "0" * 32, "0" * 64, 2048)
                   for n in range(count)]
        state = SyncState(probe / "state.sqlite3")
        try:
            t0 = clock()
            for start in range(0, count, 1000):
                state.commit(records[start:start + 1000])
            batched = clock() - t0
            t0 = clock()
            for record in records[:synced]:
                state.commit([record])
            each = clock() - t0
        finally:
            state.close()
    finally:
        shutil.rmtree(probe)
    costs = {name: round((spent / (synced if name == "fsync" else count)) * 1e6, 1) for name, spent in steps.items()}
    costs["state_write_batched"] = round(batched / count * 1e6, 1)
    costs["state_write_each"] = round(each / synced * 1e6, 1)
    costs["per_file_total"] = round(sum(costs[k] for k in ("create", "write", "close", "rename", "hash",
                                                            "state_write_batched")), 1)
    return costs


def _tree_md5(root: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


async def _source(count: int, hub: str | None = None) -> tuple[_Proc, str]:
    port = free_port()
    proc = await _spawn(sys.executable, "-m", "bench.sync_source", str(port), str(count), *([hub] if hub else []))
    await proc.wait_line(lambda line: line == "ready", 60)
    return proc, f"http://127.0.0.1:{port}"


async def baseline_run(bench: Bench, count: int, run: int, folder: Path, medium: str, *,
                       catchup: bool = True) -> dict:
    """The baseline of `count` resources into `folder` (on `medium`: disk or tmpfs) by rsnotify,
    a plain fetch loop and resync-sync in turn, the per-file costs there, and (with `catchup`)
    500 changes caught up afterwards and audited."""
    source, base = await _source(count)
    try:
        ours = folder / "rsnotify"
        wall, rss, code, cpu = await _measure_cpu([RSNOTIFY, "sync", "--once", "--capability-list",
                                                   f"{base}/caps.xml", "--dir", str(ours), "--concurrency", "32"],
                                                  folder)
        audits = await _audits(base, ours, folder)
        costs = _file_costs(folder)
        plain_wall, plain_rss, _, plain_cpu = await _measure_cpu(
            [sys.executable, "-c", _PLAIN_FETCH, base, str(count)], folder)
        theirs = folder / "resync"
        resync_wall, resync_rss, resync_code, resync_cpu = await _measure_cpu(
            [RESYNC, "--baseline", "--sitemap", f"{base}/resourcelist.xml", f"{base}/r/={theirs}"], folder)
        ours_files = _tree_md5(ours / f"127.0.0.1_{base.rsplit(':', 1)[1]}" / "r")
        equal = ours_files == _tree_md5(theirs) and len(ours_files) == count
        result = {
            "scenario": "sync", "run": run, "resources": count, "medium": medium,
            "baseline_s": wall, "baseline_rate": round(count / wall) if wall else None,
            "baseline_rss_mb": round(rss, 1), "baseline_exit": code,
            # CPU of the whole process (start included) per resource: the sync's own cost,
            # whatever share of the 2 cores the Source and the machine's other work leave it
            "baseline_cpu_s": round(cpu, 2), "baseline_cpu_us": round(cpu / count * 1e6),
            "plain_fetch_cpu_s": round(plain_cpu, 2), "plain_fetch_cpu_us": round(plain_cpu / count * 1e6),
            "cpu_ratio": round(cpu / plain_cpu, 2) if plain_cpu else None,
            "resync_cpu_s": round(resync_cpu, 2),
            **audits, "plain_fetch_s": plain_wall,
            "plain_fetch_rate": round(count / plain_wall) if plain_wall else None,
            "plain_fetch_rss_mb": round(plain_rss, 1),
            "ceiling_ratio": round(plain_wall / wall, 2) if wall else None, "file_costs_us": costs,
            "resync_s": resync_wall, "resync_rate": round(count / resync_wall) if resync_wall else None,
            "resync_ratio": round(resync_wall / wall, 2) if wall else None,
            "resync_rss_mb": round(resync_rss, 1), "resync_exit": resync_code, "same_bytes_as_resync": equal,
        }
        if catchup:
            result.update(await _catch_up(bench, base, ours, folder, count))
    finally:
        await source.stop()
    return result


async def _audits(base: str, ours: Path, folder: Path) -> dict:
    """`rsnotify audit` and `rsnotify audit --deep` of the fresh copy (the files are still in the
    page cache, so --deep reads memory, not the disk): wall time, peak RSS, exit (0: in sync)."""
    result: dict[str, float | int] = {}
    for key, extra in (("audit", []), ("audit_deep", ["--deep"])):
        wall, rss, code = await _measure([RSNOTIFY, "audit", "--capability-list", f"{base}/caps.xml",
                                          "--dir", str(ours), *extra], folder)
        result.update({f"{key}_s": wall, f"{key}_rss_mb": round(rss, 1), f"{key}_exit": code})
    return result


async def _catch_up(bench: Bench, base: str, ours: Path, folder: Path, count: int) -> dict:
    """500 changes at the Source, then `rsnotify sync --once` again, then `rsnotify audit`."""
    async with bench.session.post(f"{base}/admin/changes", params={"count": str(min(500, count))}) as response:
        await response.json()
    async with bench.session.get(f"{base}/gets") as response:
        gets_before = (await response.json())["gets"]
    catchup_wall, catchup_rss, catchup_code = await _measure(
        [RSNOTIFY, "sync", "--once", "--capability-list", f"{base}/caps.xml", "--dir", str(ours)], folder)
    async with bench.session.get(f"{base}/gets") as response:
        catchup_gets = (await response.json())["gets"] - gets_before
    audit = await asyncio.create_subprocess_exec(RSNOTIFY, "audit", "--capability-list", f"{base}/caps.xml",
                                                 "--dir", str(ours), stdout=asyncio.subprocess.DEVNULL,
                                                 stderr=asyncio.subprocess.DEVNULL)
    return {"catchup_500_s": catchup_wall, "catchup_gets": catchup_gets, "catchup_exit": catchup_code,
            "catchup_rss_mb": round(catchup_rss, 1), "catchup_audit_exit": await audit.wait()}


async def live_run(bench: Bench, run: int, folder: Path, rate: float, seconds: float) -> dict:
    hub = bench.start_hub()
    await hub.wait_ready(bench.session)
    count = int(rate * seconds)
    # every update goes to a file not touched before, so each waiter sees its own bytes
    source, base = await _source(count * 10 + 100, hub.url)
    dest = folder / "live"
    port = free_port()
    sync = await _spawn(RSNOTIFY, "sync", "--capability-list", f"{base}/caps.xml", "--dir", str(dest), "--json",
                        "--listen", f"127.0.0.1:{port}")
    latencies: list[float] = []
    try:
        await sync.wait_line(lambda line: '"event": "live"' in line, 120)
        files = dest / f"127.0.0.1_{base.rsplit(':', 1)[1]}" / "r"
        status = json.loads((await (await asyncio.create_subprocess_exec(
            RSNOTIFY, "sync", "status", "--dir", str(dest), "--json", stdout=asyncio.subprocess.PIPE)).communicate())[0])
        last_until = parse_w3c_datetime(status["high_water"])
        waits = []
        async with Publisher(hub.url, f"{base}/changes") as publisher:
            started = time.monotonic()
            for n in range(count):
                await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
                async with bench.session.post(f"{base}/admin/changes",
                                              params={"count": "10", "kinds": "update"}) as response:
                    made = await response.json()
                until = datetime.now(UTC)
                changes = tuple(ResourceChange(c["loc"], ChangeType.UPDATED, changed_at=parse_w3c_datetime(c["datetime"]),
                                               length=c["length"], hashes=(("md5", c["md5"]),)) for c in made)
                document = to_xml(ChangeNotification(last_until, until, changes))
                last_until = until
                t0 = time.monotonic()
                await publisher.submit(document)
                expected = {c["loc"].rsplit("/", 1)[1]: c["md5"] for c in made}
                waits.append(asyncio.ensure_future(_wait_files(files, expected, t0, latencies, 60.0)))
            await asyncio.gather(*waits)
    finally:
        await sync.stop()
        await source.stop()
        hub.stop()
    latencies.sort()
    return {"scenario": "sync-live", "run": run, "notifications": count, "complete": len(latencies), "rate": rate,
            "p50_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
            "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 1)
            if latencies else None}


async def _wait_files(folder: Path, expected: dict[str, str], t0: float, latencies: list[float],
                      timeout: float) -> None:
    pending = dict(expected)
    while pending:
        for name, digest in list(pending.items()):
            try:
                if hashlib.md5((folder / name).read_bytes()).hexdigest() == digest:
                    del pending[name]
            except OSError:
                pass
        if pending:
            if time.monotonic() - t0 > timeout:
                return
            await asyncio.sleep(0.002)
    latencies.append(time.monotonic() - t0)


async def inbox_run(bench: Bench, run: int, folder: Path, deliveries: int) -> dict:
    port = free_port()
    server = await _spawn(sys.executable, "-m", "bench.sync_inbox", str(port), str(folder / "inbox"))
    try:
        callback = await server.wait_line(lambda line: line.startswith("http"), 60)
        start = datetime(2026, 1, 1, tzinfo=UTC)
        body = to_xml(ChangeNotification(start, start, (ResourceChange("http://127.0.0.1:9/r/1", ChangeType.UPDATED,
                                                                        changed_at=start),)))
        rate, failures = await _post_all(bench, callback, body, deliveries, f"bench-{run}")
        # the same client loop against the bench's plain aiohttp sink: this machine's ceiling now
        ceiling, _ = await _post_all(bench, bench.sink.url(f"sync-inbox-{run}"), body, deliveries, f"sink-{run}")
    finally:
        await server.stop()
    return {"scenario": "sync-inbox", "run": run, "deliveries": deliveries, "failures": failures,
            "rate": round(rate), "sink_rate": round(ceiling), "ceiling_ratio": round(rate / ceiling, 2)}


async def _post_all(bench: Bench, url: str, body: bytes, deliveries: int, prefix: str) -> tuple[float, int]:
    """(deliveries per second, non-200 answers) for `deliveries` POSTs, 16 in flight."""
    queue = iter(range(deliveries))
    failures = 0

    async def client() -> None:
        nonlocal failures
        for n in queue:
            async with bench.session.post(url, data=body, headers={
                    "Content-Type": "application/xml", "X-RSNotify-Id": f"{prefix}-{n}",
                    "X-RSNotify-Sequence": str(n + 1)}) as response:
                await response.read()
                failures += response.status != 200

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(16)))
    return deliveries / (time.monotonic() - started), failures


async def scenario_sync(bench: Bench) -> list[dict]:
    count = bench.sizes.sync_resources
    smoke = bench.sizes.source_resources <= 1_000     # --smoke: the live and inbox steps at their shortest
    _compile_bytecode()
    results = []
    for run in range(1, bench.sizes.runs + 1):
        with tempfile.TemporaryDirectory(prefix="rsnotify-bench-sync-") as tmp, \
                tempfile.TemporaryDirectory(prefix="rsnotify-bench-sync-", dir=TMPFS) as shm:
            folder = Path(tmp)
            steps = (("sync", baseline_run(bench, count, run, folder, "disk")),
                     ("sync", baseline_run(bench, count, run, Path(shm), "tmpfs", catchup=False)),
                     ("sync-live", live_run(bench, run, folder, 20.0, 1.0 if smoke else 10.0)),
                     ("sync-inbox", inbox_run(bench, run, folder, 200 if smoke else 5000)))
            for name, step in steps:
                try:
                    result = await step   # coroutines run one after another, here
                except RuntimeError as exc:   # e.g. the hub would not start: say so, go on
                    result = {"scenario": name, "run": run, "skipped": str(exc)[-300:]}
                bench.emit(result)
                results.append(result)
    for line in summary(results):
        print("# " + line, flush=True)
    return results


def summary(results: list[dict]) -> list[str]:
    """Median lines for the targets table."""
    def med(kind: str, key: str, medium: str | None = None) -> float | None:
        values = [r[key] for r in results if r["scenario"] == kind and r.get(key) is not None
                  and (medium is None or r.get("medium") == medium)]
        return statistics.median(values) if values else None

    base = [r for r in results if r["scenario"] == "sync" and "resources" in r]
    count = base[0]["resources"] if base else 0
    lines = []
    for medium in ("disk", "tmpfs"):
        costs = [r["file_costs_us"] for r in base if r.get("medium") == medium]
        per_file = ", ".join(f"{k} {statistics.median(c[k] for c in costs):g}" for k in costs[0]) if costs else ""
        lines.append(
            f"sync baseline {count:,} x 2 KB on {medium}: {med('sync', 'baseline_s', medium)} s "
            f"({med('sync', 'baseline_rate', medium)}/s, goal <= 40 s at 100,000 on tmpfs) = "
            f"{med('sync', 'ceiling_ratio', medium)} x the plain aiohttp fetch loop's rate "
            f"({med('sync', 'plain_fetch_s', medium)} s, {med('sync', 'plain_fetch_rate', medium)}/s, no writes; "
            f"goal >= 0.6), {med('sync', 'resync_ratio', medium)} x resync-sync --baseline's "
            f"({med('sync', 'resync_s', medium)} s, {med('sync', 'resync_rate', medium)}/s; goal >= 3); "
            f"peak RSS {med('sync', 'baseline_rss_mb', medium)} MB (goal <= 100), plain loop "
            f"{med('sync', 'plain_fetch_rss_mb', medium)} MB, resync {med('sync', 'resync_rss_mb', medium)} MB; "
            f"CPU per resource (whole process, us): rsnotify {med('sync', 'baseline_cpu_us', medium)}, plain loop "
            f"{med('sync', 'plain_fetch_cpu_us', medium)} ({med('sync', 'cpu_ratio', medium)} x); "
            f"per file (us): {per_file}")
        lines.append(
            f"sync audit of the {count:,} on {medium}: {med('sync', 'audit_s', medium)} s, "
            f"{med('sync', 'audit_rss_mb', medium)} MB (goal <= 5 s at 100,000); --deep "
            f"{med('sync', 'audit_deep_s', medium)} s, {med('sync', 'audit_deep_rss_mb', medium)} MB "
            f"(goal <= 10 s)")
    lines += [
        (f"sync catch-up of 500 changes after restart: {med('sync', 'catchup_500_s')} s (goal <= 3 s), "
         f"{med('sync', 'catchup_gets')} resource GETs"),
        (f"sync live publish->file p50 {med('sync-live', 'p50_ms')} ms (goal <= 40), p99 {med('sync-live', 'p99_ms')} ms "
         f"(goal <= 100) at 20 notifications/s x 10 changes"),
        (f"sync inbox: {med('sync-inbox', 'rate')} deliveries/s (goal >= 1,000); the same client against a plain "
         f"aiohttp sink: {med('sync-inbox', 'sink_rate')}/s"),
    ]
    return lines

"""The Source side: what the change memory costs a publisher, how fast `rsnotify source` turns
a file edit into an accepted notification, and the peak memory of rendering a big Resource List.

- publish rate: sequential `Publisher.publish` calls (one notification of `entries` changes each)
  to the hub, with a change memory file and without one, alternating in blocks of 10;
- detect→publish: `rsnotify source` watching a folder; one file is rewritten, and the time until
  its topic URI serves the notification the hub accepted (polled every 5 ms) is the latency;
- Resource List: a memory seeded with N resources is written by a fresh process as `rsnotify
  source` serves it (an index of parts), which reports its peak RSS (ru_maxrss) and the time taken.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rsnotify.publisher import Publisher
from tests.support.ports import free_port

from . import checks
from .scenarios import Bench

_POLL = 0.005
_SEED = """
import sys
from datetime import UTC, datetime
from rsnotify.notification import ChangeType, ResourceChange
from rsnotify.publisher import Publisher
from rsnotify.publisher.memory.store import ChangeMemory

db, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
memory = ChangeMemory(db)
publisher = Publisher("http://127.0.0.1:9/", topic, memory=memory)
now = datetime.now(UTC)
for start in range(0, count, 10_000):
    changes = [ResourceChange(f"https://example.org/data/{i:07d}.txt", ChangeType.CREATED, now, now,
                              (("md5", "%032x" % i), ("sha-256", "%064x" % i)), 2048, "text/plain")
               for i in range(start, min(count, start + 10_000))]
    memory.record_documents(topic, publisher.prepare(changes))
memory.update_resources(topic)  # as `rsnotify source` keeps it between renders
"""
_RENDER = """
import json, resource, sys, time
from pathlib import Path
from rsnotify.publisher.memory.store import ChangeMemory, resource_count
from rsnotify.publisher.source.static_resourcelist import PartedResourceList

db, topic, folder = sys.argv[1:4]
Path(folder).mkdir()
started = time.perf_counter()
# as `rsnotify source` keeps its served Resource List (and --write its OUT): written whole the
# first time, as an index of parts past 1,000 resources
memory = ChangeMemory(db)
served = PartedResourceList(memory, topic, Path(folder), url=lambda name: "https://example.org/" + name,
                            up="https://example.org/capabilitylist.xml", temporary_prefix=".writing-")
served.write()
seconds = time.perf_counter() - started
with memory.snapshot() as snapshot:
    count = sum(part.count for part in served.parts) if served.parts else resource_count(snapshot, topic)
print(json.dumps({"seconds": seconds, "count": count,
                  "parts": len(served.parts),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


async def _publish_rates(hub_url: str, topic: str, count: int, entries: int, db: Path) -> tuple[float, float]:
    """Publishes per second without and with a change memory. The two publishers alternate in
    blocks of 10, so the machine's other load weighs on both alike."""
    plain = Publisher(hub_url, topic + "/plain")
    remembered = Publisher(hub_url, topic + "/memory", state_path=str(db))
    seconds = {id(plain): 0.0, id(remembered): 0.0}
    try:
        for block in range(0, count, 10):
            for publisher in (plain, remembered) if block % 20 == 0 else (remembered, plain):
                started = time.perf_counter()
                for n in range(block, min(count, block + 10)):
                    await publisher.publish([(f"https://example.org/r{n}-{i}", "updated") for i in range(entries)])
                seconds[id(publisher)] += time.perf_counter() - started
        return count / seconds[id(plain)], count / seconds[id(remembered)]
    finally:
        for publisher in (plain, remembered):
            await publisher.close()
        if remembered.memory is not None:
            remembered.memory.close()


async def _latencies(source_url: str, folder: Path, edits: int) -> list[float]:
    """Rewrite one file `edits` times; seconds from each write to its notification on the topic URI."""
    import aiohttp

    target = folder / "edited.txt"
    out: list[float] = []
    async with aiohttp.ClientSession() as session:
        async def topic_body() -> bytes:
            async with session.get(source_url + "changes") as response:
                return await response.read()

        previous = await topic_body()
        for n in range(edits):
            await asyncio.sleep(0.3)  # apart from the last edit's events
            written = time.perf_counter()
            target.write_text(f"edit {n}\n")
            deadline = written + 30
            while (body := await topic_body()) == previous:
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"edit {n} was not published within 30 s")
                await asyncio.sleep(_POLL)
            out.append(time.perf_counter() - written)
            previous = body
    return out


def _start_source(folder: Path, db: Path, hub_url: str) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    base = f"http://127.0.0.1:{port}/data/"
    log = db.with_suffix(".log")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", "from rsnotify.cli import main; main()", "source", "--dir", str(folder),
             "--base-url", base, "--hub", hub_url, "--db", str(db)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    return process, base, log


async def _wait_serving(bench: Bench, process: subprocess.Popen, base: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            async with bench.session.get(base + "capabilitylist.xml") as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"rsnotify source did not serve within 60 s; its log:\n{log.read_text(errors='replace')[-3000:]}")


def _render_resource_list(work: Path, run: int) -> dict:
    topic = "https://example.org/data/changes"
    done = subprocess.run([sys.executable, "-c", _RENDER, str(work / "seeded.db"), topic, str(work / f"lists-{run}")],
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"rendering the Resource List failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


async def scenario_source(bench: Bench) -> list[dict]:
    """Publish rate with and without the change memory; detect→publish latency; Resource List RSS."""
    s = bench.sizes
    hub = bench.start_hub()
    work = Path(tempfile.mkdtemp(prefix="rsnb-source-", dir="/tmp"))
    source = None
    try:
        await hub.wait_ready(bench.session)
        seeded = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", _SEED, str(work / "seeded.db"), "https://example.org/data/changes",
                             str(s.source_resources)], capture_output=True, text=True, timeout=900, check=False)
        if seeded.returncode != 0:
            raise RuntimeError(f"seeding the change memory failed:\n{seeded.stderr[-3000:]}")
        folder = work / "src"
        folder.mkdir()
        (folder / "edited.txt").write_text("start\n")
        source, base, log = _start_source(folder, work / "source.db", hub.url)
        await _wait_serving(bench, source, base, log)
        results = []
        for run in range(1, s.runs + 1):
            tag = bench.tag()
            plain, remembered = await _publish_rates(hub.url, f"https://example.org/{tag}", s.source_publishes,
                                                     s.entries, work / f"memory-{run}.db")
            latencies = await _latencies(base, folder, s.source_edits)
            rendered = await asyncio.to_thread(_render_resource_list, work, run)
            result = {
                "scenario": "source", "run": run, "publishes": s.source_publishes, "entries": s.entries,
                "publish_rate_plain": round(plain, 1), "publish_rate_memory": round(remembered, 1),
                "memory_slowdown_pct": round(100 * (1 - remembered / plain), 1),
                "edits": len(latencies), "p50_ms": round(checks.percentile(latencies, 50) * 1000, 1),
                "p99_ms": round(checks.percentile(latencies, 99) * 1000, 1),
                "rl_resources": rendered["count"], "rl_parts": rendered["parts"],
                "rl_seconds": round(rendered["seconds"], 2), "rl_peak_rss_mb": round(rendered["peak_rss_mb"], 1),
                "check": {"ok": rendered["count"] == s.source_resources},
            }
            bench.emit(result)
            results.append(result)
        return results
    finally:
        if source is not None and source.poll() is None:
            source.terminate()
            source.wait(30)
        hub.stop()
        shutil.rmtree(work, ignore_errors=True)

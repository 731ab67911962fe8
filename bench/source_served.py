"""What `rsnotify source` (served mode) costs a reader after a change: a folder of N files is
served, one file is changed (recorded as the watcher records it), and the GET of
`resourcelist.xml` that follows is timed: it brings the served Resource List up to date first.
The server runs in a child process, so its peak and current RSS are its own.

    python -m bench.source_served --files 10000 --files 100000 --batches 5

The child builds the Source as `rsnotify source` does, with an outbox that sends nothing (no hub:
publishing is not what is measured), scans the folder, serves it on 127.0.0.1, and applies the
changes the parent names on its stdin. The change memory of the first scan is copied for each
run, so every run starts from the same recorded state and scans nothing new. The same script
runs against an older checkout of rsnotify (copy it into that checkout's bench/) for a before/after.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from tests.support.ports import free_port


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


async def _serve(src: Path, db: Path, cache: Path, port: int) -> None:
    """The child: a Source of `src` on 127.0.0.1:`port`; stdin lines "change PATH" and "rss"."""
    from aiohttp import web

    from rsnotify.publisher import Publisher
    from rsnotify.publisher.memory.store import ChangeMemory
    from rsnotify.publisher.outbox import Outbox
    from rsnotify.publisher.source.folder import Folder
    from rsnotify.publisher.source.server import RESERVED_NAMES, Source, SourceUrls

    # One base URL whatever the port (paths are all the server matches), so the topic, and with
    # it the copied change memory, is the same in every run.
    urls = SourceUrls("http://127.0.0.1/data/")
    memory = ChangeMemory(db)
    publisher = Publisher("http://127.0.0.1:9/", urls.topic, urls.capability_list, memory=memory)
    outbox = Outbox(db, publisher, autostart=False)      # nothing is sent: not what is measured
    source = Source(Folder(src, urls.base, RESERVED_NAMES), urls, publisher, outbox, memory, cache)
    started = time.perf_counter()
    await asyncio.to_thread(source.sync_folder)
    runner = web.AppRunner(source.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(json.dumps({"ready": True, "scan_s": round(time.perf_counter() - started, 2)}), flush=True)
    loop = asyncio.get_running_loop()
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        command, _, argument = line.partition(" ")
        if command == "change":
            count = await asyncio.to_thread(source.sync_paths, [Path(argument)])
            print(json.dumps({"recorded": count}), flush=True)
        elif command == "rss":
            print(json.dumps({"rss_mb": round(_status_kb("VmRSS") / 1024, 1),
                              "peak_rss_mb": round(_status_kb("VmHWM") / 1024, 1)}), flush=True)
    await runner.cleanup()
    outbox.close()
    memory.close()


def _get(port: int, path: str) -> tuple[float, int]:
    """Seconds a GET of `path` took, to its last byte, and the bytes it got."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    connection.request("GET", path)
    response = connection.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - started
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"GET {path} answered {response.status}")
    return elapsed, len(body)


def make_folder(src: Path, files: int) -> None:
    for i in range(files):
        folder = src / f"d{i // 1000:04d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        (folder / f"f{i:07d}.txt").write_bytes(b"%d\n" % i)


def measure(src: Path, files: int, seeded: Path, work: Path, batches: int) -> dict[str, object]:
    """One run: a child serving `src` from a copy of the change memory `seeded` (made if missing)."""
    db = work / "memory.db"
    if seeded.is_file():
        shutil.copyfile(seeded, db)
    port = free_port()
    child = subprocess.Popen([sys.executable, "-m", "bench.source_served", "--serve", str(src), str(db),
                              str(work / "cache"), str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=Path.cwd())
    assert child.stdin is not None and child.stdout is not None

    def ask(line: str) -> dict:
        child.stdin.write(line + "\n")   # type: ignore[union-attr]
        child.stdin.flush()              # type: ignore[union-attr]
        return json.loads(child.stdout.readline())   # type: ignore[union-attr]

    try:
        ready = json.loads(child.stdout.readline())
        if not seeded.is_file():
            # SQLite's backup: a consistent copy whatever still sits in the child's write-ahead log
            with sqlite3.connect(db) as live, sqlite3.connect(seeded) as copy:
                live.backup(copy)
        before_lists = ask("rss")       # after the scan, before any Resource List was written
        first, size = _get(port, "/data/resourcelist.xml")
        after_change, again = [], []
        for batch in range(batches):
            n = (batch * 7919 + 11) % files
            target = src / f"d{n // 1000:04d}" / f"f{n:07d}.txt"
            target.write_bytes(b"changed %d %f\n" % (batch, time.time()))
            if ask(f"change {target}")["recorded"] != 1:
                raise RuntimeError(f"the change of {target} was not recorded")
            after_change.append(_get(port, "/data/resourcelist.xml")[0])
            again.append(_get(port, "/data/resourcelist.xml")[0])
        rss = ask("rss")
    finally:
        child.stdin.close()
        child.wait(60)
    return {"files": files, "scan_s": ready["scan_s"], "first_get_s": round(first, 2), "index_kb": round(size / 1024, 1),
            "get_after_change_ms_median": round(statistics.median(after_change) * 1000, 1),
            "get_after_change_ms_max": round(max(after_change) * 1000, 1),
            "get_unchanged_ms_median": round(statistics.median(again) * 1000, 1),
            "rss_before_lists_mb": before_lists["rss_mb"], **rss}


@click.command()
@click.option("--files", "sizes", type=int, multiple=True, default=(10_000, 100_000), show_default=True)
@click.option("--batches", type=int, default=5, show_default=True)
@click.option("--dir", "where", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="where to keep the folders and change memories between runs (default: a temporary folder, "
                   "removed at the end)")
@click.option("--serve", nargs=4, type=str, default=None, hidden=True)
def main(sizes: tuple[int, ...], batches: int, where: Path | None, serve: tuple[str, str, str, str] | None) -> None:
    if serve is not None:
        src, db, cache, port = serve
        asyncio.run(_serve(Path(src), Path(db), Path(cache), int(port)))
        return
    keep = where is not None
    root = where or Path(tempfile.mkdtemp(prefix="rsnb-served-"))
    try:
        for files in sizes:
            src = root / f"src-{files}"
            if not src.is_dir():
                make_folder(src, files)
            with tempfile.TemporaryDirectory(dir=root) as work:
                click.echo(json.dumps(measure(src, files, root / f"seeded-{files}.db", Path(work), batches)))
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

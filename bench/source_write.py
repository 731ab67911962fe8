"""What `rsnotify source --write` costs per batch of changes: a folder of N files is scanned and
written once, then one file is rewritten per batch; each batch's time (record + write the
documents) and the bytes it wrote into OUT are measured.

    python -m bench.source_write --files 10000 --files 100000 --batches 10

Runs in this process with a change memory and an outbox that sends nothing (no hub is needed:
publishing is not what is measured). Bytes written are the write() bytes of the process
(/proc/self/io wchar) over the batch, SQLite's included, and the bytes of OUT's files that changed.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import click

from rsnotify.publisher import Publisher
from rsnotify.publisher.memory.store import ChangeMemory, ListPolicy
from rsnotify.publisher.outbox import Outbox
from rsnotify.publisher.source import static_cli
from rsnotify.publisher.source.folder import Folder
from rsnotify.publisher.source.server import RESERVED_NAMES, SourceUrls
from rsnotify.publisher.source.static import StaticSource


def _written_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def _out_state(out: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in out.iterdir() if p.is_file()}


def measure(files: int, batches: int, work: Path) -> dict[str, object]:
    src, out, db = work / "src", work / "out", work / "memory.db"
    for i in range(files):
        folder = src / f"d{i // 1000:04d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        (folder / f"f{i:07d}.txt").write_bytes(b"%d\n" % i)
    urls = SourceUrls("https://example.org/data/")
    # The Change List policy `rsnotify source --write` uses (a version without one: the Sitemap limit),
    # so this script also measures the code before it, run from a checkout of that version.
    memory = ChangeMemory(db, ListPolicy(max_entries=getattr(static_cli, "WRITE_LIST_ENTRIES", 50_000)))
    publisher = Publisher("http://127.0.0.1:9/", urls.topic, urls.capability_list, memory=memory)
    outbox = Outbox(db, publisher, autostart=False)      # nothing is sent: not what is measured
    source = StaticSource(Folder(src, urls.base, RESERVED_NAMES), urls, publisher, outbox, memory,
                          work / "cache", out=out)
    started = time.perf_counter()
    source.sync_folder()
    source.write_all()
    first = time.perf_counter() - started
    seconds, process_bytes, out_bytes = [], [], []
    for batch in range(batches):
        target = src / f"d{(batch * 7919 % files) // 1000:04d}" / f"f{batch * 7919 % files:07d}.txt"
        target.write_bytes(b"changed %d\n" % batch)
        before, state, started = _written_bytes(), _out_state(out), time.perf_counter()
        source.sync_paths([target])
        seconds.append(time.perf_counter() - started)
        process_bytes.append(_written_bytes() - before)
        after = _out_state(out)
        out_bytes.append(sum(size for name, (mtime, size) in after.items() if state.get(name, (0, 0))[0] != mtime))
    outbox.close()
    memory.close()
    return {"files": files, "first_write_s": round(first, 2), "batch_ms_median": round(statistics.median(seconds) * 1000, 1),
            "batch_ms_max": round(max(seconds) * 1000, 1),
            "batch_written_kb_median": round(statistics.median(process_bytes) / 1024, 1),
            "out_changed_kb_median": round(statistics.median(out_bytes) / 1024, 1)}


@click.command()
@click.option("--files", "sizes", type=int, multiple=True, default=(10_000, 100_000), show_default=True)
@click.option("--batches", type=int, default=10, show_default=True)
@click.option("--dir", "where", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="where to make the folders (default: a temporary folder)")
def main(sizes: tuple[int, ...], batches: int, where: Path | None) -> None:
    for files in sizes:
        with tempfile.TemporaryDirectory(dir=where) as work:
            click.echo(json.dumps(measure(files, batches, Path(work))))


if __name__ == "__main__":
    main()

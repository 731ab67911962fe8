"""The Resource List's parts stay within bounds and are rewritten only where something changed,
whether `rsnotify source --write` keeps them in OUT or `rsnotify source` serves them from its
cache: a part left small by deletes merges with its smaller neighbour, a grown one splits, and the
served list is the same index of parts, which resync and `rsnotify sync` copy and follow."""
from __future__ import annotations

import bisect
import io
import subprocess
from datetime import timedelta
from random import Random
from urllib.parse import unquote

from rsnotify.datetimes import format_datetime
from rsnotify.lists import ListRef, open_list
from tests.publisher.test_static_resourcelist import (
    BIN,
    folder_state,
    listed,
    parted_files,
    read,
    written_source,
)
from tests.support import cli
from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.waiting import wait_until

WAIT = 60.0


def part_sizes(out, names: list[str]) -> list[int]:
    return [len(read(out, name)[1]) for name in names]


def test_a_part_left_small_by_deletes_merges_with_its_smaller_neighbour(tmp_path):
    source = written_source(tmp_path, {f"m{i:03d}.txt": b"x" for i in range(40)}, part_entries=10)
    out, src = tmp_path / "out", tmp_path / "src"
    _, names, _ = listed(out)
    assert part_sizes(out, names) == [10, 10, 10, 10]

    # Four deletes in the first part: 6 left, still within bounds, so it alone is rewritten.
    for i in range(4):
        (src / f"m{i:03d}.txt").unlink()
    source.sync_folder()
    _, after_first, resources = listed(out)
    assert part_sizes(out, after_first) == [6, 10, 10, 10] and after_first[1:] == names[1:]

    # Eight deletes in the second part: 2 left, fewer than half a part. It merges with the first
    # (6, its smaller neighbour) into one part of 8; the third and fourth parts stay as they were.
    mtimes = {name: (out / name).stat().st_mtime_ns for name in names[2:]}
    for i in range(10, 18):
        (src / f"m{i:03d}.txt").unlink()
    source.sync_folder()
    _, merged, resources = listed(out)
    assert part_sizes(out, merged) == [8, 10, 10] and merged[1:] == names[2:]
    assert {name: (out / name).stat().st_mtime_ns for name in names[2:]} == mtimes
    assert {unquote(loc.rsplit("/", 1)[1]) for loc in resources} == set(folder_state(src))

    # A part left small beside a full one: the two share their resources (2 + 10 -> 6 + 6).
    for i in range(30, 38):
        (src / f"m{i:03d}.txt").unlink()
    source.sync_folder()
    _, shared, resources = listed(out)
    assert part_sizes(out, shared) == [8, 6, 6] and shared[0] == merged[0]
    assert {unquote(loc.rsplit("/", 1)[1]) for loc in resources} == set(folder_state(src))
    source.outbox.close()
    source.memory.close()


def test_a_first_write_folds_a_short_tail_into_the_last_part(tmp_path):
    source = written_source(tmp_path, {f"t{i:03d}.txt": b"x" for i in range(33)}, part_entries=10)
    out = tmp_path / "out"
    _, names, _ = listed(out)
    assert part_sizes(out, names) == [10, 10, 13]      # not 10, 10, 10, 3
    source.outbox.close()
    source.memory.close()


def test_parts_stay_within_bounds_and_only_the_changed_range_is_rewritten(tmp_path):
    """Random single-file batches (creates in bursts, deletes, updates): after each one every part
    holds between part_entries / 2 and 2 x part_entries resources, the list equals the folder, and
    a part is rewritten only when it holds the changed file or is that part's neighbour."""
    source = written_source(tmp_path, {f"r{i:04d}.txt": b"x" for i in range(0, 600, 5)}, part_entries=10)   # 120 files
    out, src = tmp_path / "out", tmp_path / "src"
    random = Random(11)
    _, names, _ = listed(out)
    for batch in range(150):
        parts = [(name, min(entry.loc for entry in read(out, name)[1])) for name in names]
        lows = [""] + [low for _, low in parts[1:]]
        existing = sorted(p.name for p in src.iterdir())
        if random.random() < 0.45 and len(existing) > 30:
            path = src / random.choice(existing[: len(existing) // 2 + 5])   # deletes bunch up low
            path.unlink()
        elif random.random() < 0.5:
            path = src / f"r{random.randrange(300, 600):04d}-{batch}.txt"   # creates bunch up high
            path.write_bytes(b"new")
        else:
            path = src / random.choice(existing)
            path.write_bytes(b"changed %d" % batch)
        source.sync_paths([path])
        _, new_names, resources = listed(out)
        assert {unquote(loc.rsplit("/", 1)[1]) for loc in resources} == set(folder_state(src)), batch
        sizes = part_sizes(out, new_names)
        assert all(5 <= size <= 20 for size in sizes), (batch, sizes)
        touched = bisect.bisect_right(lows, "https://example.org/data/" + path.name) - 1
        kept = {name for i, (name, _) in enumerate(parts) if abs(i - touched) > 1}
        assert kept <= set(new_names), batch   # far from the change: the same file, not rewritten
        names = new_names
    source.outbox.close()
    source.memory.close()


def test_the_served_list_changes_only_the_touched_part_and_resync_follows_it(hub_process, run_source, tmp_path):
    """`rsnotify source` serves the Resource List as an index of parts; a one-file change gives
    a new index naming one new part, the other parts and every part the previous index named stay
    readable, and resync (baseline, incremental, audit) and `rsnotify sync` copy it."""
    hub = hub_process(workers=1)
    src = tmp_path / "src"
    count = parted_files(src)
    port = free_port()
    base = f"http://127.0.0.1:{port}/data/"
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               ready_url=base + "resourcelist.xml")
    index = open_list(io.BytesIO(fetch(base + "resourcelist.xml").body))
    first = [ref.loc for ref in index if isinstance(ref, ListRef)]
    assert index.info.is_index and index.info.at is not None and len(first) == 2
    copy = tmp_path / "copy"
    run = subprocess.run([str(BIN / "resync-sync"), "--baseline", base, str(copy)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, check=False)
    assert run.returncode == 0 and "FatalError" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert {unquote(p.relative_to(copy).as_posix()): p.read_bytes() for p in copy.rglob("*") if p.is_file()} == {
        p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}

    (src / "d2" / "file 02000.txt").write_bytes(b"changed\n")     # in the second part

    def new_index() -> list[str] | None:
        served = open_list(io.BytesIO(fetch(base + "resourcelist.xml").body))
        refs = [ref.loc for ref in served if isinstance(ref, ListRef)]
        return refs if served.info.at != index.info.at else None
    second = wait_until(new_index, WAIT, "the change in the served Resource List")
    assert second[0] == first[0] and second[1] != first[1]
    assert fetch(first[1]).status == 200          # a reader of the previous index still finds its part
    # Nothing new recorded: the index is not written again (same ETag: mtime and size).
    assert fetch(base + "resourcelist.xml").headers["ETag"] == fetch(base + "resourcelist.xml").headers["ETag"]
    assert fetch(base + "resourcelist-nothing.xml").status == 404
    assert b"file%2002000.txt" in fetch(second[1]).body
    after_at = format_datetime(index.info.at + timedelta(microseconds=1))
    for args in (("--incremental", "--delete", "--from", after_at), ("--audit", "--hash", "sha-256")):
        run = subprocess.run([str(BIN / "resync-sync"), *args, base, str(copy)], capture_output=True, text=True,
                             timeout=300, cwd=tmp_path, check=False)
        assert run.returncode == 0 and "FatalError" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert f"IN SYNC (same={count}, to create=0, to update=0, to delete=0)" in run.stdout + run.stderr, run.stdout
    assert (copy / "d2" / "file%2002000.txt").read_bytes() == b"changed\n"
    synced = cli.run("sync", "--source", base, "--dir", str(tmp_path / "mirror"), "--once", timeout=300)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    mirror = tmp_path / "mirror" / f"127.0.0.1_{port}" / "data"
    assert {p.relative_to(mirror).as_posix(): p.read_bytes() for p in mirror.rglob("*") if p.is_file()} == {
        p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}

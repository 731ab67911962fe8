"""`rsnotify source --write` rewrites its Resource List in proportion to a batch of changes: past
PART_ENTRIES resources the list is an index of parts by loc range, a batch replaces only the
parts holding what changed (a new name each time, the index renamed last), splits a part grown
too big, drops one left empty, and deletes replaced parts only after readers of the previous
index had time to fetch them. resync and `rsnotify sync` copy such a list behind nginx."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from random import Random
from urllib.parse import unquote

from rsnotify.datetimes import format_datetime
from rsnotify.lists import ListInfo, ListRef, Resource, open_list
from rsnotify.publisher import Publisher
from rsnotify.publisher.memory.store import ChangeMemory
from rsnotify.publisher.outbox import Outbox
from rsnotify.publisher.source.folder import Folder
from rsnotify.publisher.source.server import RESERVED_NAMES, SourceUrls
from rsnotify.publisher.source.static import StaticSource
from rsnotify.publisher.source.static_resourcelist import PART_ENTRIES
from tests.publisher.test_static_source import nginx, nginx_site  # noqa: F401  (nginx: a fixture)
from tests.support import cli
from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.waiting import wait_until

BASE = "https://example.org/data/"
BIN = Path(sys.executable).parent
WAIT = 60.0


def make_source(tmp_path: Path, files: dict[str, bytes]) -> StaticSource:
    src = tmp_path / "src"
    for name, body in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(body)
    return open_source(tmp_path)


def parted_files(src: Path) -> int:
    """2 x PART_ENTRIES + 10 files in three folders of `src`, names with a space: two parts, the
    last holding the ten past them; how many."""
    count = PART_ENTRIES * 2 + 10
    for i in range(count):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"file {i:05d}.txt").write_bytes(b"%d\n" % i)
    return count


def written_source(tmp_path: Path, files: dict[str, bytes], part_entries: int | None = None) -> StaticSource:
    """make_source with its folder recorded and its lists written into OUT (parts of
    `part_entries` resources when given)."""
    source = make_source(tmp_path, files)
    if part_entries is not None:
        source.resource_list.part_entries = part_entries
    source.sync_folder()
    source.write_all()
    return source


def open_source(tmp_path: Path) -> StaticSource:
    """A StaticSource of tmp_path/src writing into tmp_path/out, as `rsnotify source --write` makes it."""
    src = tmp_path / "src"
    urls = SourceUrls(BASE)
    memory = ChangeMemory(tmp_path / "memory.db")
    publisher = Publisher("http://127.0.0.1:9/", urls.topic, urls.capability_list, memory=memory)
    outbox = Outbox(tmp_path / "memory.db", publisher, autostart=False)   # nothing to send in these tests
    return StaticSource(Folder(src, BASE, RESERVED_NAMES), urls, publisher, outbox, memory, tmp_path / "cache",
                        out=tmp_path / "out")


def read(out: Path, name: str) -> tuple[ListInfo, list]:
    stream = open_list(io.BytesIO((out / name).read_bytes()))
    return stream.info, list(stream)


def listed(out: Path) -> tuple[ListInfo, list[str], dict[str, Resource]]:
    """The Resource List in OUT: the index (or list) info, its part names, every resource by loc."""
    info, entries = read(out, "resourcelist.xml")
    if not info.is_index:
        return info, [], {entry.loc: entry for entry in entries}
    names = [entry.loc.removeprefix(BASE) for entry in entries if isinstance(entry, ListRef)]
    resources: dict[str, Resource] = {}
    for name in names:
        part_info, part = read(out, name)
        assert not part_info.is_index and part_info.link("index") == BASE + "resourcelist.xml"
        assert part_info.link("up") == BASE + "capabilitylist.xml"
        resources.update({entry.loc: entry for entry in part})
    return info, names, resources


def folder_state(src: Path) -> dict[str, int]:
    return {p.relative_to(src).as_posix(): p.stat().st_size for p in src.rglob("*") if p.is_file()}


def as_listed(resources: dict[str, Resource]) -> dict[str, int | None]:
    return {unquote(loc.removeprefix(BASE)): resource.length for loc, resource in resources.items()}


def test_one_changed_file_rewrites_one_part_and_the_index(tmp_path):
    count = PART_ENTRIES * 2 + PART_ENTRIES // 2
    source = written_source(tmp_path, {f"f{i:05d}.txt": b"%d\n" % i for i in range(count)})
    out, src = tmp_path / "out", tmp_path / "src"
    info, names, resources = listed(out)
    assert info.is_index and len(names) == 3 and as_listed(resources) == folder_state(src)
    stamps = {name: (out / name).stat().st_mtime_ns for name in names}

    (src / f"f{PART_ENTRIES + 7:05d}.txt").write_bytes(b"changed, and longer\n")   # in the second part
    source.sync_paths([src / f"f{PART_ENTRIES + 7:05d}.txt"])
    after, new_names, resources = listed(out)
    assert as_listed(resources) == folder_state(src)
    assert after.at is not None and info.at is not None and after.at > info.at
    assert new_names[0] == names[0] and new_names[2] == names[2] and new_names[1] != names[1]
    assert {name: (out / name).stat().st_mtime_ns for name in (names[0], names[2])} == {
        name: stamps[name] for name in (names[0], names[2])}      # untouched parts are not rewritten
    # A reader that fetched the previous index still finds the part it named.
    assert (out / names[1]).is_file()
    source.outbox.close()
    source.memory.close()


def test_parts_split_when_grown_drop_when_empty_and_old_ones_go_after_the_grace(tmp_path):
    source = make_source(tmp_path, {f"m{i:03d}.txt": b"x" for i in range(35)})
    parted = source.resource_list
    parted.part_entries = 10
    clock = [1_000_000.0]
    parted.clock = lambda: clock[0]
    source.sync_folder()
    source.write_all()
    out, src = tmp_path / "out", tmp_path / "src"
    _, names, _ = listed(out)
    assert len(names) == 4                       # 10, 10, 10, 5

    # 25 new files all inside the first part's range: it grows to 35 and is split.
    for i in range(25):
        (src / f"m000-{i:02d}.txt").write_bytes(b"new")
    source.sync_folder()
    _, grown, resources = listed(out)
    assert as_listed(resources) == folder_state(src)
    assert len(grown) == 7 and grown[-3:] == names[1:]   # 35 -> 9 + 9 + 9 + 8, the others kept
    assert all(len(read(out, name)[1]) <= 20 for name in grown)

    # Every file of the last part is deleted: the part leaves the index.
    for i in range(30, 35):
        (src / f"m{i:03d}.txt").unlink()
    source.sync_folder()
    _, shrunk, resources = listed(out)
    assert as_listed(resources) == folder_state(src) and shrunk == grown[:-1]

    # Replaced parts stay until RETIRE_SECONDS have passed, then go with the next write.
    assert (out / names[0]).is_file() and (out / grown[-1]).is_file()
    clock[0] += parted.retire_seconds + 1
    (src / "m010.txt").write_bytes(b"changed")
    source.sync_paths([src / "m010.txt"])
    _, final, _ = listed(out)
    on_disk = sorted(p.name for p in out.glob("resourcelist-*.xml"))
    assert not (out / names[0]).exists() and not (out / grown[-1]).exists()
    assert on_disk == sorted(set(final) | (set(shrunk) - set(final)))   # the index's, and the one just replaced

    # Down to no more than part_entries resources: one document again.
    for path in sorted(src.iterdir())[10:]:
        path.unlink()
    source.sync_folder()
    info, parts, resources = listed(out)
    assert not info.is_index and parts == [] and as_listed(resources) == folder_state(src)
    source.outbox.close()
    source.memory.close()


def test_a_restart_writes_a_whole_new_list_and_later_deletes_the_old_parts(tmp_path):
    """A restart (a cron run of --write --once) writes a new index; the parts the one before it
    named stay for its readers, and go at a later run once their grace is over."""
    def run() -> list[str]:
        source = open_source(tmp_path)
        source.sync_folder()
        source.write_all()
        source.outbox.close()
        source.memory.close()
        return listed(out)[1]

    made = make_source(tmp_path, {f"r{i:05d}.txt": b"r" for i in range(PART_ENTRIES + 5)})
    made.outbox.close()
    made.memory.close()
    out = tmp_path / "out"
    first = run()
    for name in first:   # written long ago, as far as the next runs can tell
        os.utime(out / name, (1_000_000, 1_000_000))
    second = run()
    _, _, resources = listed(out)
    assert len(resources) == PART_ENTRIES + 5 and not set(first) & set(second)
    # a Destination that fetched the first index a moment ago still finds every part it names
    assert sorted(p.name for p in out.glob("resourcelist-*.xml")) == sorted(first + second)
    third = run()
    assert not set(third) & set(second)
    assert sorted(p.name for p in out.glob("resourcelist-*.xml")) == sorted(second + third)


def test_resync_copies_and_follows_a_parted_list_behind_nginx(hub_process, nginx, tmp_path):  # noqa: F811
    hub = hub_process(workers=1)
    src, out = tmp_path / "src", tmp_path / "out"
    count = parted_files(src)
    port = free_port()
    base = f"http://127.0.0.1:{port}/data/"
    nginx(nginx_site("/data/", src, out, hub.url, base), port)
    log = tmp_path / "source.log"
    with log.open("ab") as handle:
        source = subprocess.Popen([str(BIN / "rsnotify"), "source", "--dir", str(src), "--base-url", base, "--hub",
                                   hub.url, "--db", str(tmp_path / "m.db"), "--write", str(out)],
                                  stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: (out / "resourcelist.xml").is_file() and (out / "changelist.xml").is_file(), WAIT,
                   "the written lists", logs=[log])
        info = open_list(io.BytesIO(fetch(base + "resourcelist.xml").body)).info
        assert info.is_index and info.at is not None
        copy = tmp_path / "copy"
        run = subprocess.run([str(BIN / "resync-sync"), "--baseline", base, str(copy)], capture_output=True,
                             text=True, timeout=300, cwd=tmp_path, check=False)
        assert run.returncode == 0 and "FatalError" not in run.stdout + run.stderr, run.stdout + run.stderr
        assert {unquote(p.relative_to(copy).as_posix()): p.read_bytes() for p in copy.rglob("*") if p.is_file()} == {
            p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}

        (src / "d1" / "file 00004.txt").write_bytes(b"changed\n")
        (src / "d2" / "file 00005.txt").unlink()
        (src / "d0" / "new file.txt").write_bytes(b"new\n")

        def in_list() -> bool:
            body = fetch(base + "resourcelist.xml").body
            return open_list(io.BytesIO(body)).info.at != info.at and b"new%20file" in b"".join(
                fetch(ref.loc).body for ref in open_list(io.BytesIO(body)))
        wait_until(in_list, WAIT, "the changes in the written Resource List", logs=[log])
        after_at = format_datetime(info.at + timedelta(microseconds=1))
        run = subprocess.run([str(BIN / "resync-sync"), "--incremental", "--delete", "--from", after_at, base,
                              str(copy)], capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
        assert run.returncode == 0 and "FatalError" not in run.stdout + run.stderr, run.stdout + run.stderr
        run = subprocess.run([str(BIN / "resync-sync"), "--audit", "--hash", "sha-256", base, str(copy)],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
        assert f"IN SYNC (same={count}, to create=0, to update=0, to delete=0)" in run.stdout + run.stderr, run.stdout
        # rsnotify's own sync reads the same index and parts.
        synced = cli.run("sync", "--source", base, "--dir", str(tmp_path / "mirror"), "--once", timeout=300)
        assert synced.returncode == 0, synced.stdout + synced.stderr
        mirror = tmp_path / "mirror" / f"127.0.0.1_{port}" / "data"
        assert {p.relative_to(mirror).as_posix(): p.read_bytes() for p in mirror.rglob("*") if p.is_file()} == {
            p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    finally:
        source.terminate()
        source.wait(30)


def test_a_reader_during_many_batches_always_reads_a_whole_list_of_one_moment(tmp_path):
    source = written_source(tmp_path, {f"s{i:03d}.txt": b"s" for i in range(60)}, part_entries=10)
    out, src = tmp_path / "out", tmp_path / "src"
    states: dict[object, dict[str, int]] = {listed(out)[0].at: folder_state(src)}
    seen: list[tuple[object, dict[str, int | None]]] = []
    stop = threading.Event()

    failures: list[BaseException] = []

    def read_continuously() -> None:
        while not stop.is_set():
            try:
                info, _, resources = listed(out)      # a missing part or half a file raises here
            except Exception as exc:  # noqa: BLE001 - handed to the test's thread, which fails on it
                failures.append(exc)
                return
            seen.append((info.at, as_listed(resources)))

    reader = threading.Thread(target=read_continuously)
    reader.start()
    try:
        random = Random(7)
        for batch in range(40):
            path = src / f"s{random.randrange(90):03d}.txt"
            if path.exists() and random.random() < 0.3:
                path.unlink()
            else:
                path.write_bytes(b"x" * random.randrange(1, 50))
            source.sync_paths([path])
            states[listed(out)[0].at] = folder_state(src)
    finally:
        stop.set()
        reader.join(30)
    assert failures == [] and len(seen) > 10
    for at, resources in seen:
        assert resources == states[at], at
    source.outbox.close()
    source.memory.close()

"""What a Destination disk that refuses a resource leaves behind, on real tmpfs mounts (full:
ENOSPC; read-only: EROFS):

- `rsnotify sync --once` gives every change the disk held back one last try before it exits
  (the disk probed first, no GET while it still refuses; at most LAST_TRY_WAIT seconds of
  waiting): exit 0 when the disk took it by then, else exit 1 with one line naming how many
  and the first path;
- the probe before a held-back retry changes nothing in the copy: it makes no folder (it asks
  the nearest one that exists) and removes only its own temp file;
- an audit repair of a resource the disk held back probes the disk first: while it refuses,
  no GET, and the resource is a failed repair.
"""
from __future__ import annotations

import errno
import json
import os
import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from rsnotify.subscriber.sync.apply import LAST_TRY_WAIT, SWEEP_GAP
from rsnotify.subscriber.sync.sink import PARTIAL_PREFIX, FolderSink
from tests.e2e.test_e2e_sync import carries, hub, site, tree, wait_until  # noqa: F401 - the fixtures
from tests.subscriber import test_sync_engine as engine_tests
from tests.subscriber.test_sync_engine import T0, copy, engine_for
from tests.subscriber.test_sync_live_disk import (
    CAN_MOUNT,
    fill,
    r1_held_back,
    remount,
    synced_then_full,
    tmpfs_over,
)

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not CAN_MOUNT, reason="needs root with mount(2): tmpfs gives real ENOSPC/EROFS")]
source = engine_tests.source     # the loopback Source fixture (it counts its GETs), shared


def entries(folder: Path) -> set[str]:
    """Everything under `folder`, folders included (an empty folder is a difference for diff -r)."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


# --- sync --once: one last try before it exits ------------------------------------------------

def _break(folder: Path, cause: str) -> Path | None:
    """Make `folder` (a tmpfs) refuse writes; the filler to remove for ENOSPC."""
    if cause == "ENOSPC":
        return fill(folder)
    remount(folder, "ro")
    return None


def _mend(folder: Path, filler: Path | None) -> None:
    if filler is not None:
        filler.unlink()
    else:
        remount(folder, "rw")


def _change_in_broken_folder(s, cause: str) -> list[str]:
    """Changes in d3 (r3, r10, r17, r24 live there) the broken disk must refuse, and one in d1,
    once the Source's Change List has them all; the names in d3."""
    (s.src / "d3" / "r3.txt").write_bytes(b"cannot land yet " * 1024)    # 16 KB: more than is free
    (s.src / "d3" / "new.txt").write_bytes(b"a new file in the broken folder")
    (s.src / "d1" / "r1.txt").write_bytes(b"lands at once")
    changes = [("d3/r3.txt", "updated"), ("d3/new.txt", "created"), ("d1/r1.txt", "updated")]
    if cause == "EROFS":              # a delete fails there too (a full disk still lets a file go)
        (s.src / "d3" / "r10.txt").unlink()
        changes.append(("d3/r10.txt", "deleted"))
    for name, change in changes:
        wait_until(lambda name=name, change=change: carries(s, "changelist.xml", name, change),
                   f"the Source to record {name}", 30, s.proc)
    return [name for name, _ in changes if name.startswith("d3/")]


@pytest.mark.parametrize("cause", ["ENOSPC", "EROFS"])
def test_once_gives_held_back_changes_a_last_try_and_exits_0_when_the_disk_took_them(site, cause):  # noqa: F811
    s = site(30)
    first = s.sync("--once", name="first")
    assert first.process.wait(120) == 0, first.output()
    assert s.equal()
    broken = s.copy / "d3"
    with tmpfs_over(broken, "64k"):
        filler = _break(broken, cause)
        names = _change_in_broken_folder(s, cause)
        run = s.sync("--once", name="second")

        # The run meets the broken disk; the operator (here: this thread) mends it while the run
        # is still on. A cron run that exited at the first refusal would leave the copy behind
        # until the next run, an hour later.
        def mend_when_refused() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and run.process.poll() is None:
                if any(e["event"] == "resource.failed" for e in run.events()):
                    _mend(broken, filler)
                    return
                time.sleep(0.02)

        mender = threading.Thread(target=mend_when_refused)
        mender.start()
        code = run.process.wait(120)
        mender.join()
        log = run.output()
        events = run.events()
        failed = {"/".join(e["loc"].split("/")[-2:]) for e in events if e["event"] == "resource.failed"}
        assert failed, log           # the disk did refuse them in this run
        assert failed <= set(names)
        assert code == 0, log
        assert "Traceback" not in log
        assert "held back by the local disk" not in log
        assert any(e["event"] == "retry.done" and e["fixed"] == len(failed) and e["still_failing"] == 0
                   for e in events), events
        assert tree(s.src) == tree(s.copy)
        assert entries(s.src) == entries(s.copy)      # no empty folder left behind either


def test_once_exits_1_naming_how_many_the_disk_still_refuses_and_the_first_path(site):  # noqa: F811
    s = site(30)
    first = s.sync("--once", name="first")
    assert first.process.wait(120) == 0, first.output()
    broken = s.copy / "d3"
    with tmpfs_over(broken, "64k"):
        remount(broken, "ro")
        names = _change_in_broken_folder(s, "EROFS")
        started = time.monotonic()
        run = s.sync("--once", name="second")
        code = run.process.wait(120)
        log = run.output()
        assert code == 1, log
        assert "Traceback" not in log
        events = run.events()
        failed_at = max(i for i, e in enumerate(events) if e["event"] == "resource.failed")
        # the last try came after the refusals, and found all three still refused
        assert any(e["event"] == "retry.done" and e["retried"] == 3 and e["still_failing"] == 3
                   for e in events[failed_at:]), events
        first_path = min(str(s.copy / name) for name in names)
        [line] = [x for x in log.splitlines() if "held back by the local disk" in x]
        assert line.startswith("rsnotify sync: 3 change(s) held back by the local disk after a last try; first: "
                               f"cannot write {first_path}: Read-only file system"), line
        assert "Read-only file system" in line and "the next run tries again" in line
        assert log.splitlines()[-1] == "rsnotify sync: differences remain (see sync status)"
        assert "next try in" not in log        # the run ends: no promise of a try in a few seconds
        assert time.monotonic() - started < 60
        assert (s.copy / "d1" / "r1.txt").read_bytes() == b"lands at once"    # the rest went on
        status = json.loads(s.run("sync", "status", "--dir", str(s.dest), "--json").stdout)
        assert status["resources"].get("failed") == 3


async def test_the_last_try_waits_at_most_two_seconds_and_makes_no_get_while_the_disk_refuses(source, tmp_path):
    async with r1_held_back(source, tmp_path) as held:
        engine = held.engine
        assert source.requests.count("/d/r1.txt") == 1          # the fetch; the last try made no GET
        assert held.record.attempts == 2 and "No space left on device" in (held.record.last_error or "")
        # Held back for long (the schedule doubles to 5 min): the last try does not sleep
        # that out; it waits LAST_TRY_WAIT at most, then probes.
        engine.state.commit([replace(held.record, attempts=9, next_retry_at=time.time() + 300)])
        started = time.monotonic()
        count, first = await engine.ctx.applier.last_try()
        assert LAST_TRY_WAIT - 0.1 < time.monotonic() - started < LAST_TRY_WAIT + 5
        assert count == 1 and first is not None and first.loc == held.record.loc and first.attempts == 10
        assert "No space left on device" in (first.last_error or "")
        assert source.requests.count("/d/r1.txt") == 1
        held.filler.unlink()
        assert await engine.sync_once() == 0
        assert source.requests.count("/d/r1.txt") == 2
        assert copy(tmp_path, source) == source.resources


async def test_a_change_held_back_for_an_excluded_resource_neither_waits_nor_fails_once(source, tmp_path):
    async with r1_held_back(source, tmp_path) as held:
        await held.engine.close()
        # the next run excludes that resource: it does not manage it, so its held-back change
        # is no reason to wait or to exit 1 (nor tried: no probe, no GET)
        engine = held.engine = await engine_for(source, tmp_path, exclude=("d/r1.txt",))
        source.requests.clear()
        started = time.monotonic()
        assert await engine.ctx.applier.last_try() == (0, None)
        assert time.monotonic() - started < LAST_TRY_WAIT
        assert await engine.sync_once() == 0
        assert "/d/r1.txt" not in source.requests
        assert engine.state.held_by_disk() == [held.record]       # kept for a run that manages it again
        held.filler.unlink()


# --- the probe changes nothing ---------------------------------------------------------------

@pytest.mark.parametrize("cause", ["ENOSPC", "EROFS", "writable"])
def test_the_disk_probe_makes_no_folder_and_leaves_no_file(tmp_path, cause):
    sink = FolderSink(tmp_path)
    host = tmp_path / "example.org"
    (host / "d").mkdir(parents=True)
    (host / "d" / "kept.txt").write_bytes(b"kept")
    with tmpfs_over(host / "d", "64k"):
        if cause == "ENOSPC":
            filler = fill(host / "d")
        elif cause == "EROFS":
            remount(host / "d", "ro")
        before = entries(tmp_path)
        refusal = sink.disk_refusal(host / "d" / "new" / "deeper" / "x.txt", 16_384)
        if cause == "writable":
            assert refusal is None
        else:
            assert refusal is not None and refusal.errno == getattr(errno, cause), refusal
        assert entries(tmp_path) == before
        assert not (host / "d" / "new").exists()
        assert not any(name.startswith(PARTIAL_PREFIX) for name in os.listdir(host / "d"))
        # a folder that exists is probed itself, and still nothing is left
        assert (sink.disk_refusal(host / "d" / "kept.txt", 10) is None) == (cause == "writable")
        assert entries(tmp_path) == before
        if cause == "ENOSPC":
            filler.unlink()


async def test_a_held_back_retry_in_a_missing_folder_leaves_no_empty_folder(source, tmp_path):
    # The Source creates d/sub/new.txt while d is read-only (no folder can be made), then d is
    # writable again but full: the retry's probe says no, and must not leave d/sub behind.
    source.resources = {"/d/r0.txt": b"resource 0"}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
        folder = tmp_path / source.base.split("//")[1].replace(":", "_") / "d"
        with tmpfs_over(folder, "64k"):
            remount(folder, "ro")
            source.changelists = [(T0, None, [source.change("/d/sub/new.txt", b"a new file " * 1500,
                                                            T0 + timedelta(minutes=1))])]
            engine.ctx.changelist_url = source.url("/changelist.xml")
            assert await engine.sync_once() == 1
            assert not (folder / "sub").exists()
            remount(folder, "rw")
            filler = fill(folder)
            source.requests.clear()
            engine.ctx.applier.swept_at = -SWEEP_GAP
            await engine.ctx.applier.retry_due(everything=True)
            [held] = engine.state.held_by_disk()
            assert "No space left on device" in (held.last_error or "")
            assert source.requests == []
            assert not (folder / "sub").exists()          # the copy is as it was
            assert entries(folder) == {"r0.txt", "filler"}
            filler.unlink()
            engine.ctx.applier.swept_at = -SWEEP_GAP
            await engine.ctx.applier.retry_due(everything=True)
            assert copy(tmp_path, source) == source.resources
    finally:
        await engine.close()


# --- an audit repair probes first ------------------------------------------------------------

async def test_an_audit_repair_of_a_held_back_resource_probes_the_disk_before_any_get(source, tmp_path):
    async with r1_held_back(source, tmp_path, at=T0 + timedelta(minutes=2)) as held:
        engine = held.engine
        source.requests.clear()
        report = await engine.audit(repair=True)
        assert report.changed == 1 and report.repair_failed == 1 and report.repaired == 0
        assert report.examples["repair_failed"] == [source.url("/d/r1.txt")]
        assert not report.in_sync
        assert "/d/r1.txt" not in source.requests, source.requests      # the disk said no: no GET
        [again] = engine.state.held_by_disk()
        assert again.attempts == held.record.attempts + 1 and "No space left on device" in (again.last_error or "")
        assert again.next_retry_at is not None and again.next_retry_at > time.time()
        held.filler.unlink()
        report = await engine.audit(repair=True)
        assert report.repaired == 1 and report.repair_failed == 0 and report.in_sync
        assert source.requests.count("/d/r1.txt") == 1
        assert engine.state.held_by_disk() == []
        assert copy(tmp_path, source) == source.resources


@pytest.mark.parametrize("size", [100, 100_000, 300_000])   # written inline, by a thread, streamed
async def test_a_fetch_the_full_disk_refused_leaves_no_empty_folder_once_the_source_drops_it(source, tmp_path, size):
    # A new file in a new folder on a full disk: making the folder takes no block on tmpfs, but
    # the file cannot be written. When the Source then deletes the file, the copy must not keep
    # a folder the Source never had empty.
    async with synced_then_full(source, tmp_path, {"/d/r0.txt": b"resource 0"}) as disk:
        t1 = T0 + timedelta(minutes=1)
        created = source.change("/d/sub/deeper/new.txt", (b"a new file " * 30_000)[:size], t1)
        source.changelists = [(T0, None, [created])]
        disk.engine.ctx.changelist_url = source.url("/changelist.xml")
        assert await disk.engine.sync_once() == 1
        assert entries(disk.folder) == {"r0.txt", "filler"}
        deleted = source.change("/d/sub/deeper/new.txt", None, t1 + timedelta(minutes=1))
        source.changelists = [(T0, None, [created, deleted])]
        assert await disk.engine.sync_once() == 0
        assert entries(disk.folder) == {"r0.txt", "filler"}
        disk.filler.unlink()
        assert copy(tmp_path, source) == source.resources


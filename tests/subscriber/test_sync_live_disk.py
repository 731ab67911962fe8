"""A live `rsnotify sync` meets a Destination disk that fails, with real processes (`rsnotify
source` over a folder, `rsnotify hub`, the `rsnotify sync` CLI; the e2e suite's harness):

- one resource that cannot be written (a full tmpfs: ENOSPC; a read-only one: EROFS; without
  root, a folder chmod 0555: EACCES) is not applied: a `failed` outcome in its
  `notification.applied`, a `resource.failed` event, one stderr line, its record held back;
  the other changes go on, the sync keeps running, and once the disk is writable again the
  held-back change is retried and `diff -r` is clean;
- the state database that cannot be written stops the sync: one line, exit 1, no traceback,
  and the next start resumes and converges;
- a held-back resource the disk still refuses is not fetched again (a probe beside the file
  says so), so a full disk costs the Source no GETs until it has room.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from rsnotify.subscriber.sync.apply import SWEEP_GAP
from rsnotify.subscriber.sync.engine import SyncEngine
from rsnotify.subscriber.sync.state import ResourceRecord
from tests.e2e.test_e2e_sync import Site, hub, site, tree, wait_until  # noqa: F401 - the fixtures
from tests.subscriber import test_sync_engine as engine_tests
from tests.subscriber.test_sync_engine import T0, copy, engine_for

pytestmark = pytest.mark.timeout(240)
source = engine_tests.source     # the loopback Source fixture, shared


def _can_mount() -> bool:
    """Root with mount(2) allowed (a container may refuse it): tmpfs gives real ENOSPC/EROFS."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    with tempfile.TemporaryDirectory() as folder:
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", folder], capture_output=True, check=False)
        if made.returncode != 0:
            return False
        subprocess.run(["umount", folder], check=True)
    return True


CAN_MOUNT = _can_mount()
# Root ignores file modes, so without mount there is no way to make a write fail for root.
CAUSES = ["ENOSPC", "EROFS"] if CAN_MOUNT else (["EACCES"] if os.geteuid() != 0 else [])


@contextmanager
def tmpfs_over(folder: Path, size: str) -> Iterator[None]:
    """A small tmpfs mounted over `folder`, keeping the files that were there."""
    saved = Path(tempfile.mkdtemp())
    shutil.copytree(folder, saved / "x")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        shutil.copytree(saved / "x", folder, dirs_exist_ok=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        shutil.rmtree(saved, ignore_errors=True)


def fill(folder: Path) -> Path:
    """Write a filler file in `folder` until its file system is full; the filler's path."""
    filler = folder / "filler"
    with filler.open("wb", buffering=0) as out:
        for size in (4096, 1):
            try:
                while True:
                    out.write(b"\0" * size)
            except OSError:
                pass
    return filler


def remount(folder: Path, option: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{option}", str(folder)], check=True)


def outcomes(events: list[dict]) -> dict[str, list[dict]]:
    """Every change outcome of every notification.applied, by the loc's last two segments."""
    found: dict[str, list[dict]] = {}
    for event in events:
        if event["event"] == "notification.applied":
            for change in event["changes"]:
                found.setdefault("/".join(change["loc"].split("/")[-2:]), []).append(change)
    return found


def status(s: Site) -> dict:
    return json.loads(s.run("sync", "status", "--dir", str(s.dest), "--json").stdout)


@pytest.mark.skipif(not CAUSES, reason="needs root with mount(2) (ENOSPC, EROFS) or a non-root user (EACCES)")
@pytest.mark.parametrize("cause", CAUSES)
def test_a_resource_the_disk_refuses_is_held_back_the_rest_goes_on_and_it_lands_once_the_disk_is_back(site, cause):  # noqa: F811
    s = site(30)
    proc = s.live("sync")
    wait_until(s.equal, "the baseline", 60, proc)
    broken = s.copy / "d3"            # r3, r10, r17, r24 live there
    with tmpfs_over(broken, "64k") if cause != "EACCES" else _nothing():
        filler = None
        if cause == "ENOSPC":
            filler = fill(broken)
        elif cause == "EROFS":
            remount(broken, "ro")
        else:
            broken.chmod(0o555)
        (s.src / "d3" / "r3.txt").write_bytes(b"cannot land yet " * 1024)    # 16 KB: more than is free
        (s.src / "d3" / "new.txt").write_bytes(b"a new file in the broken folder")
        (s.src / "d1" / "r1.txt").write_bytes(b"lands at once")
        (s.src / "d2" / "r2.txt").unlink()
        if cause != "ENOSPC":          # a delete there fails too (a full disk still lets a file go)
            (s.src / "d3" / "r10.txt").unlink()

        def told() -> bool:
            seen = outcomes(proc.events())
            return "d3/r3.txt" in seen and "d1/r1.txt" in seen and "d3/new.txt" in seen and "d2/r2.txt" in seen \
                and (cause == "ENOSPC" or "d3/r10.txt" in seen)
        wait_until(told, "the notifications applied", 60, proc)
        seen = outcomes(proc.events())
        assert seen["d1/r1.txt"][-1]["outcome"] == "stored"
        assert seen["d2/r2.txt"][-1]["outcome"] == "deleted"
        assert (s.copy / "d1" / "r1.txt").read_bytes() == b"lands at once"
        assert not (s.copy / "d2" / "r2.txt").exists()
        words = {"ENOSPC": "No space left on device", "EROFS": "Read-only file system",
                 "EACCES": "Permission denied"}[cause]
        held = ["d3/r3.txt", "d3/new.txt"] + (["d3/r10.txt"] if cause != "ENOSPC" else [])
        for name in held:
            assert seen[name][-1]["outcome"] == "failed", seen[name]
            assert words in seen[name][-1]["detail"], seen[name]
        failed = [e for e in proc.events() if e["event"] == "resource.failed"]
        assert {"/".join(e["loc"].split("/")[-2:]) for e in failed} >= set(held)
        assert all(e["retry_in_seconds"] is not None for e in failed)
        log = proc.output()
        assert "Traceback" not in log
        assert any(line.startswith("rsnotify sync: failed: ") and "d3/r3.txt" in line and words in line
                   for line in log.splitlines()), log
        assert proc.process.poll() is None                  # still live
        assert status(s)["resources"].get("failed") == len(held)
        # the sync goes on with other resources while these wait
        (s.src / "d4" / "r4.txt").write_bytes(b"still live")
        wait_until(lambda: (s.copy / "d4" / "r4.txt").read_bytes() == b"still live", "a later change", 30, proc)

        # the disk is back: the held-back changes land by themselves
        if filler is not None:
            filler.unlink()
        elif cause == "EROFS":
            remount(broken, "rw")
        else:
            broken.chmod(0o755)
        wait_until(s.equal, "equal once the disk is back", 90, proc)
        assert status(s)["resources"].get("failed") is None
        assert any(e["event"] == "retry.done" and e["fixed"] >= 1 for e in proc.events())
        assert proc.stop() == 0
        audit = s.run("audit", "--capability-list", s.caplist, "--dir", str(s.dest), "--deep")
        assert audit.returncode == 0, audit.stderr


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@pytest.mark.skipif(not CAN_MOUNT, reason="needs root with mount(2): a full tmpfs under the state database")
def test_a_state_database_that_cannot_be_written_stops_the_sync_in_one_line_and_a_restart_resumes(site):  # noqa: F811
    s = site(30)
    state = s.dest / ".rsnotify"
    state.mkdir(parents=True)
    with tmpfs_over(state, "4m"):
        proc = s.live("sync1")
        wait_until(s.equal, "the baseline", 60, proc)
        filler = fill(state)
        for i in range(30):           # a notification body too big for what is left
            (s.src / f"d{i % 7}" / f"r{i}.txt").write_bytes(f"changed while the state disk is full {i}".encode())
        wait_until(lambda: proc.process.poll() is not None, "the sync to stop", 60)
        assert proc.process.returncode == 1
        lines = [line for line in proc.output().splitlines() if "state database" in line or "cannot write" in line]
        assert "Traceback" not in proc.output(), proc.output()
        assert lines and lines[-1].startswith("rsnotify sync: ") and str(state) in lines[-1], proc.output()
        assert "full" in lines[-1] or "No space" in lines[-1], lines
        assert not s.equal()
        filler.unlink()
        again = s.live("sync2")
        wait_until(s.equal, "equal after the restart", 60, again)
        assert again.stop() == 0
        assert tree(s.src) == tree(s.copy)


@dataclass
class FullDisk:
    engine: SyncEngine                    # closed at the end (a test may open another in its place)
    folder: Path                          # the copy's d/: a 64k tmpfs, full
    filler: Path                          # what fills it: unlink it to make room
    record: ResourceRecord | None = None  # r1_held_back: d/r1.txt's record, holding its update back


@asynccontextmanager
async def synced_then_full(source, tmp_path: Path, resources: dict[str, bytes]) -> AsyncIterator[FullDisk]:
    """An in-process engine whose --once run copied `resources` (all below /d/) from the
    loopback Source, then the copy's d/ made a full 64k tmpfs (its files kept)."""
    source.resources = resources
    disk = FullDisk(await engine_for(source, tmp_path), Path(), Path())
    try:
        assert await disk.engine.sync_once() == 0
        disk.folder = tmp_path / source.base.split("//")[1].replace(":", "_") / "d"
        with tmpfs_over(disk.folder, "64k"):
            disk.filler = fill(disk.folder)
            yield disk
    finally:
        await disk.engine.close()


@asynccontextmanager
async def r1_held_back(source, tmp_path: Path, *, at: datetime | None = None) -> AsyncIterator[FullDisk]:
    """synced_then_full of d/r0-r2, right after the --once run that found an update of d/r1 in
    the Change List too big for the full disk (its one GET made, exit 1): held back."""
    async with synced_then_full(source, tmp_path, {f"/d/r{i}.txt": f"resource {i}".encode() for i in range(3)}
                                ) as disk:
        source.changelists = [(T0, None, [source.change("/d/r1.txt", b"too big for what is left " * 400,
                                                        T0 + timedelta(minutes=1))])]
        if at is not None:
            source.at = at
        disk.engine.ctx.changelist_url = source.url("/changelist.xml")
        source.requests.clear()
        assert await disk.engine.sync_once() == 1
        [disk.record] = disk.engine.state.held_by_disk()
        yield disk


@pytest.mark.skipif(not CAN_MOUNT, reason="needs root with mount(2): a full tmpfs under one folder of the copy")
async def test_a_held_back_resource_is_not_fetched_again_while_the_disk_still_refuses_it(source, tmp_path):
    # In-process engine against the loopback Source of test_sync_engine, which counts its GETs.
    async with r1_held_back(source, tmp_path) as disk:
        engine = disk.engine
        assert source.requests.count("/d/r1.txt") == 1
        [held] = engine.state.due_retries(None)
        assert held.state == "failed" and "No space left on device" in (held.last_error or "")
        for _ in range(3):       # at each start and poll every held-back change is tried again
            engine.ctx.applier.swept_at = -SWEEP_GAP
            await engine.ctx.applier.retry_due(everything=True)
        assert source.requests.count("/d/r1.txt") == 1, source.requests   # no GET: the disk said no
        [held] = engine.state.due_retries(None)
        # the fetch, --once's last try before it exited, and the three sweeps: all but the first a probe
        assert held.attempts == 5 and "No space left on device" in (held.last_error or "")
        disk.filler.unlink()
        engine.ctx.applier.swept_at = -SWEEP_GAP
        await engine.ctx.applier.retry_due(everything=True)
        assert source.requests.count("/d/r1.txt") == 2
        assert engine.state.due_retries(None) == []
        assert copy(tmp_path, source) == source.resources

"""`--exclude GLOB` and `--dry-run` with a real `rsnotify sync` / `rsnotify audit` process against a
Source on loopback (the hostile-Source server of test_sync_trust serving honest lists): excluded
resources are neither fetched, deleted nor counted as differences (baseline, catch-up, audit,
repair; a copy made before stays as it was), and a dry run lists what it would fetch and delete
while DIR stays byte for byte the same."""
from __future__ import annotations

import hashlib
import os
import subprocess
from datetime import timedelta
from pathlib import Path

from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange
from rsnotify.subscriber.sync import SyncEngine, SyncOptions
from rsnotify.xml import to_xml
from tests.subscriber.test_sync_trust import (  # noqa: F401  (the fixture is used by name)
    RSNOTIFY,
    T0,
    T1,
    HostileSource,
    copy_of,
    hostile,
    sync_once,
)


def audit(source: HostileSource, dest: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run([RSNOTIFY, "audit", "--capability-list", source.base + "/caps.xml", "--dir", str(dest),
                           *extra], capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def relist(source: HostileSource, path: str, body: bytes) -> None:
    """The Source changed `path`: listed with its new hash and length, and in the Change List."""
    source.listed[:] = [r for r in source.listed if r.loc != source.base + path]
    source.add(path, body)
    source.changes.append(ResourceChange(source.base + path, ChangeType.UPDATED, changed_at=T1))


def drop(source: HostileSource, path: str) -> None:
    source.listed[:] = [r for r in source.listed if r.loc != source.base + path]
    source.changes.append(ResourceChange(source.base + path, ChangeType.DELETED, changed_at=T1))


def create(source: HostileSource, path: str, body: bytes) -> None:
    source.add(path, body)
    source.changes.append(ResourceChange(source.base + path, ChangeType.CREATED, changed_at=T1))


def checksum(root: Path) -> dict[str, str]:
    """Every file under root (the state folder too) with the sha-256 of its bytes."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


def test_excluded_resources_are_neither_fetched_deleted_nor_differences(hostile, tmp_path):
    dest = tmp_path / "dest"
    for path, body in (("/a.txt", b"a"), ("/keep.txt", b"old"), ("/tmp/x.txt", b"x"), ("/b.tmp", b"b")):
        hostile.add(path, body)
    exclude = ("--exclude", "tmp/", "--exclude", "*.tmp")
    first = sync_once(hostile, dest, *exclude)
    assert first.code == 0, first.stderr
    folder = copy_of(hostile, dest)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == ["a.txt", "keep.txt"]
    assert "/tmp/x.txt" not in hostile.hits and "/b.tmp" not in hostile.hits          # never fetched
    [done] = first.of("baseline.done")
    assert done["excluded"] == 2 and done["fetched"] == 2
    # Now keep.txt and a.txt become excluded too: the Source updates one, deletes the other and
    # adds an excluded file, and a file of the user's sits in the excluded tmp/ folder.
    relist(hostile, "/keep.txt", b"new")
    drop(hostile, "/a.txt")
    create(hostile, "/c.tmp", b"c")
    (folder / "tmp").mkdir()
    (folder / "tmp" / "mine.txt").write_bytes(b"the user's")
    more = (*exclude, "--exclude", "keep.txt", "--exclude", f"{hostile.base}/a.*")   # a path, and a URL
    second = sync_once(hostile, dest, *more)
    assert second.code == 0, second.stderr
    assert (folder / "keep.txt").read_bytes() == b"old" and (folder / "a.txt").read_bytes() == b"a"  # left alone
    assert not (folder / "c.tmp").exists() and "/c.tmp" not in hostile.hits
    [caught_up] = second.of("catchup.done")
    assert caught_up["excluded"] == 3 and caught_up["fetched"] == 0 and caught_up["deleted"] == 0
    # The audit agrees: nothing excluded is a difference; without --exclude all of it is.
    plain = audit(hostile, dest, *more, "--deep")
    assert plain.returncode == 0 and "excluded " in plain.stderr, plain.stderr
    assert audit(hostile, dest).returncode == 1
    repaired = audit(hostile, dest, *more, "--repair")
    assert repaired.returncode == 0, repaired.stderr
    assert (folder / "keep.txt").read_bytes() == b"old" and (folder / "a.txt").read_bytes() == b"a"
    assert (folder / "tmp" / "mine.txt").read_bytes() == b"the user's" and not (folder / "c.tmp").exists()
    # Narrowed again, the repair brings the once-excluded copies up to date.
    assert audit(hostile, dest, *exclude, "--repair").returncode == 0
    assert (folder / "keep.txt").read_bytes() == b"new" and not (folder / "a.txt").exists()


def test_a_bad_exclude_is_a_usage_error(tmp_path):
    done = subprocess.run([RSNOTIFY, "sync", "--capability-list", "http://127.0.0.1:9/caps.xml", "--dir",
                           str(tmp_path / "d"), "--once", "--exclude", " "], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 2 and "--exclude" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "d").exists()


def test_dry_run_lists_what_it_would_fetch_and_delete_and_writes_nothing(hostile, tmp_path):
    dest, scratch = tmp_path / "dest", tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    for path, body in (("/a.txt", b"a"), ("/b.txt", b"b"), ("/d/c.txt", b"c"), ("/skip.tmp", b"s")):
        hostile.add(path, body)
    # A fresh folder: the baseline's plan, one line per resource, and DIR is not even made.
    fresh = subprocess.run([RSNOTIFY, "sync", "--capability-list", hostile.base + "/caps.xml", "--dir", str(dest),
                            "--once", "--dry-run", "--exclude", "*.tmp"], capture_output=True, text=True,
                           timeout=60, check=False, env=env)
    assert fresh.returncode == 0, fresh.stderr
    assert sorted(fresh.stdout.splitlines()) == [
        f"fetch {hostile.base}/{p} -> 127.0.0.1_{hostile.port}/{p}" for p in ("a.txt", "b.txt", "d/c.txt")]
    assert "dry run: would fetch 3, delete 0; excluded 1; nothing was written" in fresh.stderr
    assert not dest.exists() and os.listdir(scratch) == []
    assert [h for h in hostile.hits if h.endswith(".txt")] == []          # planned, not fetched
    assert sync_once(hostile, dest).code == 0
    # The Source changes; the dry run's catch-up plan, as --json events.
    relist(hostile, "/a.txt", b"a2")
    drop(hostile, "/d/c.txt")
    create(hostile, "/e.txt", b"e")
    before = checksum(dest)
    run = sync_once(hostile, dest, "--dry-run")
    assert run.code == 0, run.stderr
    assert checksum(dest) == before                                         # byte for byte
    plan = sorted((e["action"], e["loc"].rsplit("/", 1)[1]) for e in run.of("plan"))
    assert plan == [("delete", "c.txt"), ("fetch", "a.txt"), ("fetch", "e.txt")]
    [counts] = run.of("plan.done")
    assert counts == {"event": "plan.done", "fetch": 2, "delete": 1, "excluded": 0}
    # The real run does what was planned.
    real = sync_once(hostile, dest)
    assert real.code == 0
    folder = copy_of(hostile, dest)
    assert (folder / "a.txt").read_bytes() == b"a2" and (folder / "e.txt").read_bytes() == b"e"
    assert not (folder / "d" / "c.txt").exists()


async def test_a_live_notification_for_an_excluded_resource_is_left_alone(hostile, tmp_path):
    dest = tmp_path / "dest"
    hostile.add("/a.txt", b"a")
    hostile.add("/logs/old.log", b"old")
    engine = SyncEngine(dest, capability_list=hostile.base + "/caps.xml", options=SyncOptions(exclude=("logs/",)))
    seen: list = []
    engine.events.listeners.append(seen.append)
    await engine.open()
    try:
        assert await engine.sync_once() == 0
        folder = copy_of(hostile, dest)
        hostile.add("/logs/new.log", b"new")
        hostile.add("/b.txt", b"b")
        t2 = T1 + timedelta(minutes=1)
        notification = ChangeNotification(T0, t2, (
            ResourceChange(hostile.base + "/logs/new.log", ChangeType.CREATED, changed_at=T1),
            ResourceChange(hostile.base + "/b.txt", ChangeType.CREATED, changed_at=T1)))
        engine.state.add_to_inbox("http://hub.example/", 1, "n-1", "application/xml", to_xml(notification))
        await engine.drain_inbox()
        assert (folder / "b.txt").read_bytes() == b"b" and not (folder / "logs").exists()
        assert "/logs/new.log" not in hostile.hits and "/logs/old.log" not in hostile.hits
        [applied] = [e for e in seen if e.event == "notification.applied"]
        outcomes = {c["loc"].rsplit("/", 1)[1]: c["outcome"] for c in applied.data["changes"]}
        assert outcomes == {"new.log": "excluded", "b.txt": "stored"}
        assert engine.state.high_water == t2 and engine.exit_code() == 0
    finally:
        await engine.close()

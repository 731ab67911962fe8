"""`rsnotify audit` exit 0 means the copy equals the Source: a change newer than the Resource
List's `at` that the copy holds back (a failed fetch, bytes that did not match, a creation that
failed) is `pending`, a difference (exit 1), never "newer locally"; `audit --repair` tries it
again and is in sync once it lands. Real `rsnotify sync --once` and `rsnotify audit` processes
against a loopback Source serving a Resource List at T0 and a Change List after it."""
from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from aiohttp import web

from rsnotify.notification import ChangeType, ResourceChange
from rsnotify.subscriber.sync import audit as audit_module
from rsnotify.subscriber.sync.engine import SyncEngine
from rsnotify.subscriber.sync.state import ResourceRecord, ResourceState
from tests.subscriber.test_sync_trust import (  # noqa: F401
    RSNOTIFY,
    T1,
    HostileSource,
    copy_of,
    hostile,
    sync_once,
)


def audit(source: HostileSource, dest: Path, *extra: str) -> tuple[int, dict, str]:
    """`rsnotify audit --json`: exit code, the `audit.done` event, stderr."""
    done = subprocess.run([RSNOTIFY, "audit", "--capability-list", source.base + "/caps.xml", "--dir", str(dest),
                           "--json", *extra], capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    report = [e for e in events if e["event"] == "audit.done"]
    assert len(report) == 1, (done.stdout, done.stderr)
    return done.returncode, report[0], done.stderr


def announce(source: HostileSource, path: str, body: bytes, change: ChangeType = ChangeType.UPDATED) -> None:
    """A change of `path` at T1 (after the Resource List's `at`) announcing `body`."""
    source.changes.append(ResourceChange(source.base + path, change, changed_at=T1,
                                         hashes=(("md5", hashlib.md5(body).hexdigest()),), length=len(body)))


async def _down(request: web.Request) -> web.Response:
    return web.Response(status=500, text="down for maintenance")


@pytest.mark.parametrize("served", ["500", "other bytes"])
def test_a_held_back_update_newer_than_the_list_is_a_difference_until_repaired(hostile, tmp_path, served):  # noqa: F811
    dest = tmp_path / "dest"
    hostile.add("/r1.txt", b"v1\n")
    hostile.add("/r2.txt", b"two\n")
    assert sync_once(hostile, dest).code == 0
    announce(hostile, "/r1.txt", b"v2 from the Source\n")
    hostile.bodies["/r1.txt"] = _down if served == "500" else b"not what was announced\n"
    held = sync_once(hostile, dest, "--tries", "1")
    assert held.code == 1, held.stderr
    assert (copy_of(hostile, dest) / "r1.txt").read_bytes() == b"v1\n"      # the old copy is kept

    code, report, stderr = audit(hostile, dest)
    assert code == 1, stderr
    assert report["pending"] == 1 and report["newer_locally"] == 0 and report["examples"]["pending"] == [
        hostile.base + "/r1.txt"]
    assert report["in_sync"] is False and "pending 1" in stderr

    code, report, stderr = audit(hostile, dest, "--repair", "--tries", "1")   # the Source still fails
    assert code == 1 and report["repair_failed"] == 1 and report["repaired"] == 0, stderr

    hostile.bodies["/r1.txt"] = b"v2 from the Source\n"
    code, report, stderr = audit(hostile, dest, "--repair")
    assert code == 0, stderr
    assert report["pending"] == 1 and report["repaired"] == 1 and report["repair_failed"] == 0
    assert (copy_of(hostile, dest) / "r1.txt").read_bytes() == b"v2 from the Source\n"
    code, report, stderr = audit(hostile, dest)
    assert code == 0 and report["pending"] == 0 and report["newer_locally"] == 1, stderr


def test_a_failed_creation_newer_than_the_list_is_pending_not_newer_locally(hostile, tmp_path):  # noqa: F811
    dest = tmp_path / "dest"
    hostile.add("/r1.txt", b"v1\n")
    assert sync_once(hostile, dest).code == 0
    announce(hostile, "/new.txt", b"created after the list\n", ChangeType.CREATED)
    hostile.bodies["/new.txt"] = _down
    assert sync_once(hostile, dest, "--tries", "1").code == 1

    code, report, stderr = audit(hostile, dest)
    assert code == 1, stderr
    assert report["pending"] == 1 and report["extra"] == 0 and report["newer_locally"] == 0
    assert report["examples"]["pending"] == [hostile.base + "/new.txt"]


def test_an_applied_change_newer_than_the_list_stays_newer_locally(hostile, tmp_path):  # noqa: F811
    dest = tmp_path / "dest"
    hostile.add("/r1.txt", b"v1\n")
    assert sync_once(hostile, dest).code == 0
    announce(hostile, "/r1.txt", b"v2\n")
    hostile.bodies["/r1.txt"] = b"v2\n"
    assert sync_once(hostile, dest).code == 0
    code, report, stderr = audit(hostile, dest)
    assert code == 0, stderr
    assert report["pending"] == 0 and report["newer_locally"] == 1 and report["same"] == 0


def test_notifications_received_and_not_applied_are_a_difference_until_a_sync_applies_them(hostile, tmp_path):  # noqa: F811
    from rsnotify.notification import ChangeNotification
    from rsnotify.subscriber.sync.state import STATE_DIR, STATE_FILE, SyncState
    from rsnotify.xml import to_xml

    dest = tmp_path / "dest"
    hostile.add("/r1.txt", b"v1\n")
    assert sync_once(hostile, dest).code == 0
    # A sync killed between its 2xx to the hub and applying: the notification waits in the inbox.
    v2 = b"v2, announced by a notification\n"
    hostile.bodies["/r1.txt"] = v2
    change = ResourceChange(hostile.base + "/r1.txt", ChangeType.UPDATED, changed_at=T1,
                            hashes=(("md5", hashlib.md5(v2).hexdigest()),), length=len(v2))
    state = SyncState(dest / STATE_DIR / STATE_FILE)
    try:
        state.add_to_inbox("http://127.0.0.1:9/", 1, "n-1", "application/xml",
                           to_xml(ChangeNotification(T1, T1, (change,))))
    finally:
        state.close()

    code, report, stderr = audit(hostile, dest)
    assert code == 1 and report["unapplied"] == 1 and "unapplied notifications 1" in stderr, stderr
    code, report, stderr = audit(hostile, dest, "--repair")     # an audit does not apply the inbox
    assert code == 1 and report["unapplied"] == 1, stderr

    assert sync_once(hostile, dest).code == 0                    # the next start applies it
    assert (copy_of(hostile, dest) / "r1.txt").read_bytes() == v2
    code, report, stderr = audit(hostile, dest)
    assert code == 0 and report["unapplied"] == 0, stderr


def test_a_repairs_retry_never_lands_over_a_live_change_that_came_while_it_fetched(hostile, tmp_path):  # noqa: F811
    # `audit --repair` handed to a live sync retries r1's held-back change (T1) while a notification
    # for r1 (T2) arrives. The live change must wait for the retry and land over it: before, the
    # retry's late answer (v2, served before the Source changed) overwrote the applied v3 and its
    # record, the T2 change was lost for good, and the audit said "repaired".
    dest = tmp_path / "dest"
    hostile.add("/r1.txt", b"v1\n")
    assert sync_once(hostile, dest).code == 0
    v2, v3 = b"v2\n", b"v3, the newest\n"
    announce(hostile, "/r1.txt", v2)
    hostile.bodies["/r1.txt"] = _down
    assert sync_once(hostile, dest, "--tries", "1").code == 1     # r1 held back at T1
    asked = []

    async def late_then_newest(request: web.Request) -> web.Response:
        asked.append(request.path)
        if len(asked) == 1:             # the repair's GET, answered after the live change came
            await asyncio.sleep(1.0)
            return web.Response(body=v2)
        return web.Response(body=v3)

    hostile.bodies["/r1.txt"] = late_then_newest
    loc = hostile.base + "/r1.txt"

    async def race() -> tuple[ResourceRecord, audit_module.AuditReport]:
        engine = SyncEngine(dest, capability_list=hostile.base + "/caps.xml", tries=1)
        await engine.open()
        try:
            ctx = engine.ctx
            ctx.applier.watch_changes()         # as the live process does for an audit
            report = audit_module.AuditReport()
            repair = asyncio.create_task(
                audit_module._count_pending(ctx, [ctx.state.records([loc])[loc]], report, True))
            await asyncio.sleep(0.3)
            live = ResourceChange(loc, ChangeType.UPDATED, changed_at=T1 + timedelta(minutes=1),
                                  hashes=(("md5", hashlib.md5(v3).hexdigest()),), length=len(v3))
            record, _ = await ctx.applier.apply_change(live, ctx.state.records([loc]).get(loc))
            ctx.state.commit([record])
            await repair
            return ctx.state.records([loc])[loc], report
        finally:
            await engine.close()

    record, report = asyncio.run(race())
    assert (copy_of(hostile, dest) / "r1.txt").read_bytes() == v3
    assert record.state == ResourceState.OK and record.changed_at == T1 + timedelta(minutes=1)
    assert report.pending == 1 and report.repaired == 1

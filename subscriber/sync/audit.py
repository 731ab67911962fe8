"""Audit: the folder and its records against the Source's current Resource List (core §5.2).

Counts: same, missing (listed, no good copy), changed (hash or length differs; with `deep`,
also files whose bytes no longer hash to their record: bit rot or local edits), extra
(tracked, no longer listed), untracked (files with no record), newer locally (a change
applied after the list's `at`: the list is older than the copy, not a difference),
unverifiable (neither hash nor length nor lastmod to compare), pending (a change after the
list's `at` that the copy holds back: a failed fetch, bytes that did not match, a name in the
way; the copy is not the Source's until it lands, so it is a difference), unapplied
(notifications in the inbox since before the audit began and not applied yet: a sync stopped
between its 2xx to the hub and applying them; a difference until a sync starts). `repair` fetches
missing and changed resources, deletes extra tracked ones and tries the pending changes again;
untracked files are never touched.
The audit only reads the state database (the locs it meets go to a private temporary one), so
it can run beside the `rsnotify sync` that owns the folder.
"""
from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from rsnotify.datetimes import format_datetime
from rsnotify.lists import Resource

from .apply import hashes_match, probes_disk
from .context import SyncContext
from .outcomes import ChangeOutcome, Refusal, ResourceState
from .remote import SourceDocumentError
from .resources import ResourceListRead, resource_chunks
from .sink import FolderLook, FolderSink, SymlinkRefusedError
from .state import RETRIED_STATES, ResourceRecord, SyncState

T = TypeVar("T")


@dataclass
class AuditReport:
    at: datetime | None = None
    listed: int = 0
    same: int = 0
    missing: int = 0
    changed: int = 0
    extra: int = 0
    untracked: int = 0
    newer_locally: int = 0
    pending: int = 0          # a change newer than the list held back in its record (a difference)
    unapplied: int = 0        # inbox notifications from before the audit, not applied (a difference)
    unverifiable: int = 0
    corrupt: int = 0          # part of `changed` (deep only)
    escaped: int = 0          # resources stored under an escaped name (not a difference; README "File names")
    symlinks: int = 0         # part of `missing`: a symlink stands at the name or on its way (never followed)
    conflicts: int = 0        # locs whose path is contested (both sides of a collision; repair cannot fix it)
    excluded: int = 0         # listed or tracked resources --exclude leaves alone (never a difference)
    repaired: int = 0
    repair_failed: int = 0
    seconds: float = 0.0
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def differences(self) -> int:
        return self.missing + self.changed + self.extra + self.untracked + self.conflicts + self.pending \
            + self.unapplied

    @property
    def in_sync(self) -> bool:
        # after a repair: in sync when every difference it could fix was fixed (a pending change
        # that landed counts as repaired; one still held back as repair_failed)
        return self.differences == 0 or bool(self.repaired and self.repair_failed == 0 and self.untracked == 0
                                             and self.conflicts == 0 and self.unapplied == 0)

    def note(self, kind: str, loc: str) -> None:
        items = self.examples.setdefault(kind, [])
        if len(items) < 5:
            items.append(loc)

    def to_json(self) -> dict[str, object]:
        return {"at": format_datetime(self.at) if self.at else None, "listed": self.listed, "same": self.same,
                "missing": self.missing, "changed": self.changed, "extra": self.extra, "untracked": self.untracked,
                "newer_locally": self.newer_locally, "pending": self.pending, "unapplied": self.unapplied,
                "unverifiable": self.unverifiable, "corrupt": self.corrupt,
                "escaped": self.escaped, "symlinks": self.symlinks, "conflicts": self.conflicts, "excluded": self.excluded,
                "repaired": self.repaired, "repair_failed": self.repair_failed,
                "seconds": round(self.seconds, 3), "examples": self.examples}


def file_hashes(sink: FolderLook, path: str) -> tuple[str, str, int] | None:
    """md5, sha-256 and size of a stored file, read without following any link; None when it
    cannot be read (a link stands there, or it went away)."""
    try:
        md5, sha256, size = hashlib.md5(), hashlib.sha256(), 0
        with sink.open_read(path) as file:
            while chunk := file.read(1 << 20):
                md5.update(chunk)
                sha256.update(chunk)
                size += len(chunk)
        return md5.hexdigest(), sha256.hexdigest(), size
    except (OSError, ValueError):
        return None


def _corrupt(sink: FolderLook, record: ResourceRecord, path: str) -> bool:
    found = file_hashes(sink, path)
    if found is None:
        return True
    md5, sha256, size = found
    if record.length is not None and size != record.length:
        return True
    if record.sha256 is not None:
        return sha256 != record.sha256
    return record.md5 is not None and md5 != record.md5


class _Seen:
    """The locs the audit met in the Resource List, in a private temporary SQLite database
    (spills to disk, so memory stays flat): the state database is only read, which lets an
    audit run beside the sync that owns the folder."""

    def __init__(self) -> None:
        self.db = sqlite3.connect("", check_same_thread=False)
        self.db.execute("CREATE TABLE seen (loc TEXT PRIMARY KEY) WITHOUT ROWID")

    def add(self, locs: Iterable[str]) -> None:
        self.db.executemany("INSERT OR IGNORE INTO seen(loc) VALUES (?)", [(loc,) for loc in locs])

    def unseen(self, state: SyncState, batch: int = 1000) -> Iterator[ResourceRecord]:
        """Live records (not tombstones) the Resource List did not list, in loc order. Only
        their locs are read first: whole records only for the few unseen ones."""
        for locs in state.iter_live_locs(batch):
            marks = ",".join("?" * len(locs))
            found = {row[0] for row in self.db.execute(f"SELECT loc FROM seen WHERE loc IN ({marks})", locs)}
            missing = [loc for loc in locs if loc not in found]
            if missing:
                records = state.records(missing)
                yield from (records[loc] for loc in missing if loc in records)

    def close(self) -> None:
        self.db.close()


async def run_audit(ctx: SyncContext, *, deep: bool = False, repair: bool = False,
                    record: bool = True) -> AuditReport:
    """`record`: add the run to the state's `runs` (False for a read-only audit beside a sync).

    Live applies go on meanwhile (the engine runs it as a task of its own): a resource a change
    touched since the audit began is counted `newer locally`, never a difference, and never
    repaired; a repair holds its locs, so a change for one lands after it."""
    seen = _Seen()
    ctx.applier.watch_changes()
    try:
        return await _audit(ctx, seen, deep=deep, repair=repair, keep_run=record)
    finally:
        ctx.applier.unwatch_changes()
        seen.close()


async def _audit(ctx: SyncContext, seen: _Seen, *, deep: bool, repair: bool, keep_run: bool) -> AuditReport:
    started, began = time.monotonic(), time.time()
    report = AuditReport()
    read = ResourceListRead(ctx.resourcelist_url or "")
    if not ctx.resourcelist_url:
        raise SourceDocumentError("the Source advertises no Resource List to audit against")
    ctx.progress.start("audit")
    to_repair: list[tuple[Resource, ResourceRecord | None, Path, tuple[str, ...]]] = []
    pending: list[ResourceRecord] = []    # held-back changes newer than the list (bounded: one per change since `at`)
    contested = ctx.state.conflict_paths()
    async for resources in resource_chunks(ctx.session, ctx.resourcelist_url, read, ctx.list_origins):
        report.at = read.at
        ctx.progress.total = read.hint
        seen.add(r.loc for r in resources)
        records = ctx.state.records(r.loc for r in resources)
        checks = []
        for resource in resources:
            report.listed += 1
            ctx.progress.seen += 1
            if ctx.applier.exclusions.excludes(resource.loc):
                report.excluded += 1
                continue
            record = records.get(resource.loc)
            if record is not None and record.state in (ResourceState.OK, ResourceState.CONFLICT) \
                    and record.path in contested:
                # Both sides of a name collision: the keeper's file and the loc left without one.
                report.conflicts += 1
                report.note("conflict", resource.loc)
                continue
            if record is not None and _newer_than_list(record, report.at):
                if _held_back(record):
                    pending.append(record)
                else:
                    report.newer_locally += 1
                continue
            try:
                path = ctx.sink.path_text(resource.loc)
            except ValueError:
                report.missing += 1
                report.note("missing", resource.loc)
                continue
            checks.append((resource, record, path))
        verdicts = await _in_thread(_judge_all, ctx.sink, checks, deep)
        # Live applies ran while the files were judged: a difference is only one if no change
        # touched the loc since the audit began and its record is still the one judged.
        differing = [resource.loc for (resource, _, _), verdict in zip(checks, verdicts)
                     if verdict not in ("same", "unverifiable")]
        now = ctx.state.records(differing) if differing else {}
        for (resource, record, path), verdict in zip(checks, verdicts):
            if verdict == "same":
                report.same += 1
                continue
            if verdict == "unverifiable":
                report.unverifiable += 1
                continue
            if ctx.applier.touched(resource.loc) or now.get(resource.loc) != record:
                report.newer_locally += 1
                continue
            kinds: tuple[str, ...] = ()
            if verdict == "corrupt":
                report.corrupt += 1
                kinds = ("corrupt",)
                verdict = "changed"
            if verdict == "symlink":     # no good copy, and a link where it should be: never read
                report.symlinks += 1
                report.note("symlink", resource.loc)
                kinds = ("symlinks",)
                verdict = "missing"
            setattr(report, verdict, getattr(report, verdict) + 1)
            report.note(verdict, resource.loc)
            if repair:
                to_repair.append((resource, record, Path(path), (verdict, *kinds)))
        if repair and len(to_repair) >= 500:
            await _repair(ctx, to_repair, report)
            to_repair = []
    if repair and to_repair:
        await _repair(ctx, to_repair, report)
    extras = []
    for extra in seen.unseen(ctx.state):
        if ctx.applier.exclusions.excludes(extra.loc):
            report.excluded += 1
            continue
        newer = _newer_than_list(extra, report.at)
        if newer and _held_back(extra):
            pending.append(extra)
            continue
        if newer or ctx.applier.touched(extra.loc):
            report.newer_locally += 1
            continue
        report.extra += 1
        report.note("extra", extra.loc)
        extras.append(extra)
    if repair:
        for record in extras:
            if ctx.applier.touched(record.loc):     # a change came for it meanwhile: it wins
                _not_a_difference(report, record.loc, ("extra",))
                continue
            ctx.applier.hold_for_repair([record.loc])   # a change arriving now lands after this delete
            try:
                await _delete_extra(ctx, record, report)
            finally:
                ctx.applier.release_repair([record.loc])
    await _count_pending(ctx, pending, report, repair)
    # a live sync applies what it received within moments: only what waited the whole audit counts
    report.unapplied = sum(1 for _, received in ctx.state.pending_inbox_heads() if received < began)
    report.untracked = await _in_thread(_count_untracked, ctx, report)
    report.escaped = ctx.state.count_escaped()
    ctx.applier.flush_refusals()
    report.seconds = time.monotonic() - started
    if keep_run:
        ctx.state.add_run("audit", time.time() - report.seconds, report.to_json(),
                          "in sync" if report.in_sync else "differences")
    return report


def _newer_than_list(record: ResourceRecord, at: datetime | None) -> bool:
    """The record's last change is after the list's `at`: the list cannot judge it."""
    return record.changed_at is not None and at is not None and record.changed_at > at


def _held_back(record: ResourceRecord) -> bool:
    """The record keeps a change it could not apply (failed, stale, conflict, refused)."""
    return record.state in RETRIED_STATES


async def _count_pending(ctx: SyncContext, pending: list[ResourceRecord], report: AuditReport, repair: bool) -> None:
    """Count the held-back changes newer than the list as differences (the copy is not the
    Source's while one waits); with `repair`, try each again now, as the sync's retry would.
    One a live change touched since the audit began is that change's business: newer locally."""
    now = ctx.state.records(r.loc for r in pending) if pending else {}
    waiting = []
    for record in pending:
        current = now.get(record.loc)
        if ctx.applier.touched(record.loc) or current is None or not _held_back(current):
            report.newer_locally += 1
        else:
            waiting.append(current)
    report.pending += len(waiting)
    for record in waiting:
        report.note("pending", record.loc)
    if not (repair and waiting):
        return
    # held as _repair holds its locs (nothing awaited since they were judged): a live change for
    # one waits until the retry's records are committed, then lands over them, never under them
    locs = [record.loc for record in waiting]
    ctx.applier.hold_for_repair(locs)
    try:
        ctx.state.commit(await ctx.applier.retry(waiting, repair=True))
        landed = ctx.state.records(locs)
    finally:
        ctx.applier.release_repair(locs)
    for record in waiting:
        if _held_back(landed.get(record.loc, record)):
            report.repair_failed += 1
            report.note("repair_failed", record.loc)
        else:
            report.repaired += 1


async def _delete_extra(ctx: SyncContext, record: ResourceRecord, report: AuditReport) -> None:
    """Repair an extra tracked resource: remove its file, keep a tombstone."""
    if record.path and record.holds_file:
        try:
            await asyncio.to_thread(ctx.sink.delete, ctx.sink.absolute(record.path))
        except SymlinkRefusedError as exc:
            ctx.applier.refuse(Refusal.SYMLINK, record.loc, str(exc))
        except OSError as exc:     # the disk refused: the delete is held back and tried again
            ctx.state.commit([ctx.applier.hold_delete(record, record.changed_at, exc)])
            report.repair_failed += 1
            report.note("repair_failed", record.loc)
            return
    ctx.state.commit([ResourceRecord(record.loc, record.path, ResourceState.DELETED,
                                     changed_at=record.changed_at, last_change="deleted")])
    report.repaired += 1


async def _in_thread(func: Callable[..., T], *args: Any) -> T:
    """`func(*args, cancelled)` in a worker thread; a cancel (Ctrl-C) tells it to stop between
    files, so the process does not wait for a whole chunk of re-hashing before it exits."""
    cancelled = threading.Event()
    try:
        return await asyncio.to_thread(func, *args, cancelled)
    except asyncio.CancelledError:
        cancelled.set()
        raise


def _judge_all(sink: FolderSink, checks: list[tuple[Resource, ResourceRecord | None, str]], deep: bool,
               cancelled: threading.Event) -> list[str]:
    verdicts = []
    # One look per chunk: its folders stay open only while this chunk is judged (a repair
    # between chunks may remove and remake them).
    with sink.looking() as look:
        for resource, record, path in checks:
            if cancelled.is_set():
                break
            verdicts.append(_judge(look, resource, record, path, deep))
    return verdicts


def _judge(sink: FolderLook, resource: Resource, record: ResourceRecord | None, path: str, deep: bool) -> str:
    """same, missing, changed, corrupt, unverifiable, or symlink (a link at the resource's name
    or on its way: reported, never followed). Read-only; the sink looks without following links."""
    kind = sink.kind(path)
    if kind == "symlink":
        return "symlink"
    if record is None or record.state == ResourceState.DELETED or kind != "file":
        return "missing"
    match = hashes_match(record, resource.hashes)
    if match is None:
        if resource.length is None and resource.lastmod is None:
            return "corrupt" if deep and _corrupt(sink, record, path) else "unverifiable"
        match = resource.length == record.length and (resource.lastmod is None or resource.lastmod == record.lastmod)
    elif resource.length is not None and resource.length != record.length:
        match = False
    if not match or record.state != ResourceState.OK:
        return "changed"
    if deep and _corrupt(sink, record, path):
        return "corrupt"
    return "same"


def _not_a_difference(report: AuditReport, loc: str, kinds: tuple[str, ...]) -> None:
    """A loc counted as a difference that a live change touched since: newer locally instead."""
    for kind in kinds:
        setattr(report, kind, getattr(report, kind) - 1)
        examples = report.examples.get({"symlinks": "symlink"}.get(kind, kind), [])
        if loc in examples:
            examples.remove(loc)
    report.newer_locally += 1


async def _repair(ctx: SyncContext, items: list[tuple[Resource, ResourceRecord | None, Path, tuple[str, ...]]],
                  report: AuditReport) -> None:
    """Fetch the listed version of each item, unless a live change touched its loc since it was
    judged (that change is newer than the list). The locs are held until their records are
    committed: a change arriving meanwhile waits, then lands over the repair."""
    held = []
    for resource, record, path, kinds in items:
        if ctx.applier.touched(resource.loc):
            _not_a_difference(report, resource.loc, kinds)
        else:
            held.append((resource, record, path))
    locs = [resource.loc for resource, _, _ in held]
    ctx.applier.hold_for_repair(locs)
    try:
        # A resource held back by the disk is fetched only if the disk now takes it (the probe a
        # held-back retry makes): while it refuses, no GET, the record is rescheduled and the
        # resource stays a failed repair.
        probed = [(record, resource.length) for resource, record, _ in held if record is not None and probes_disk(record)]
        refused = await ctx.applier.disk_refusals(probed) if probed else []
        if refused:
            ctx.state.commit([rescheduled for _, rescheduled in refused])
            ctx.applier.say_still_refused([rescheduled for _, rescheduled in refused])
            still = {record.loc for record, _ in refused}
            held = [item for item in held if item[0].loc not in still]
            report.repair_failed += len(still)
            for _, rescheduled in refused:
                report.note("repair_failed", rescheduled.loc)
        # every fetch ends before the holds go (return_exceptions): one failing must not let a
        # waiting live change write a file another fetch of this repair is still writing
        ended = await asyncio.gather(*(ctx.applier.fetch_resource(r, rec, p, repair=True) for r, rec, p in held),
                                     return_exceptions=True)
        for result in ended:
            if isinstance(result, BaseException):
                raise result
        results = [result for result in ended if not isinstance(result, BaseException)]
        ctx.state.commit([record for record, _ in results])
    finally:
        ctx.applier.release_repair(locs)
    for _, outcome in results:
        if outcome.outcome == ChangeOutcome.STORED:
            report.repaired += 1
        else:
            report.repair_failed += 1
            report.note("repair_failed", outcome.loc)


def _count_untracked(ctx: SyncContext, report: AuditReport, cancelled: threading.Event, batch: int = 500) -> int:
    count = 0
    chunk: list[str] = []
    for relative in ctx.sink.walk():
        if cancelled.is_set():
            return count
        if ctx.applier.exclusions.excludes_file(relative):
            continue     # an excluded part of the tree: files there are not the sync's business
        chunk.append(relative)
        if len(chunk) >= batch:
            count += _untracked_in(ctx.state, chunk, report, ctx.applier.is_claimed)
            chunk = []
    return count + _untracked_in(ctx.state, chunk, report, ctx.applier.is_claimed)


def _untracked_in(state: SyncState, paths: list[str], report: AuditReport, is_claimed: Callable[[str], bool]) -> int:
    """Files of `paths` (in walk order) with no record at their path, or a tombstone as the
    record `record_by_path` gives: one query for the lot instead of one per file. A file a live
    change just wrote (`is_claimed`: its record not committed yet) is not untracked."""
    states = state.states_by_path(paths)
    count = 0
    for relative in paths:
        if states.get(relative, ResourceState.DELETED) == ResourceState.DELETED and not is_claimed(relative):
            count += 1
            report.note("untracked", relative)
    return count

"""Catch-up from the Source's Change Lists: every change in [H, now), applied idempotently.

Lists are chosen by their from/until, never by URI order: a list whose `until` is at or before
H is never fetched. When the earliest usable list starts after H, the lists cannot close the
gap and the caller re-baselines. Entries are applied in document order, a chunk at a time (the
last change per loc within a chunk), so memory stays flat; H moves to each closed list's
`until` in the transaction that records its last changes, and to the open list's last entry.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

from rsnotify.datetimes import format_datetime
from rsnotify.lists import CHANGE_LIST, ListRef
from rsnotify.notification import ChangeType, ResourceChange

from .context import SyncContext
from .listdates import refuse_bad_bounds, refuse_future_changes
from .names import migrate_names
from .outcomes import ChangeOutcome, ResourceState
from .remote import RemoteList, SourceDocumentError
from .state import ResourceRecord

log = logging.getLogger(__name__)

CHUNK = 5000


class CatchupImpossibleError(Exception):
    """The Change Lists do not reach back to H (rotated or expired, or none at all)."""


@dataclass
class CatchupReport:
    start: datetime | None
    end: datetime | None = None
    lists: list[str] = field(default_factory=list)
    changes: int = 0
    fetched: int = 0
    unchanged: int = 0
    deleted: int = 0
    skipped: int = 0
    excluded: int = 0
    failed: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"from": format_datetime(self.start) if self.start else None,
                "until": format_datetime(self.end) if self.end else None, "lists": self.lists,
                "changes": self.changes, "fetched": self.fetched, "unchanged": self.unchanged,
                "deleted": self.deleted, "skipped": self.skipped, "excluded": self.excluded, "failed": self.failed,
                "seconds": round(self.seconds, 3)}


async def select_lists(ctx: SyncContext, high_water: datetime) -> list[ListRef | RemoteList]:
    """The Change Lists that may hold changes after H, in `from` order; raises
    CatchupImpossibleError when they start after H."""
    if not ctx.changelist_url:
        raise CatchupImpossibleError("the Source advertises no Change List")
    top = await RemoteList.open(ctx.session, ctx.changelist_url, "Change List", ctx.list_origins)
    _check_head(top)
    if not top.info.is_index:
        if top.info.from_ is not None and top.info.from_ > high_water:
            top.close()
            raise CatchupImpossibleError(
                f"the Change List {top.url} starts at {format_datetime(top.info.from_)}, after the high-water "
                f"mark {format_datetime(high_water)}")
        if top.info.until is not None and top.info.until <= high_water:
            top.close()
            return []
        return [top]
    refs: list[ListRef] = []
    async for chunk in top.chunks():
        refs.extend(e for e in chunk if isinstance(e, ListRef))
    for ref in refs:
        refuse_bad_bounds("Change List Index", top.url, ref)
    bounded = [r for r in refs if r.from_ is not None]
    unbounded = [r for r in refs if r.from_ is None]   # fetched to learn their bounds
    if not bounded and not unbounded:
        raise CatchupImpossibleError(f"the Change List Index {top.url} lists no Change List")
    for ref in unbounded:
        remote = await RemoteList.open(ctx.session, ref.loc, "Change List", ctx.list_origins)
        remote.close()
        _check_head(remote)
        bounded.append(ListRef(ref.loc, from_=remote.info.from_, until=remote.info.until))
    bounded.sort(key=lambda r: (r.from_ or high_water))
    selected = [r for r in bounded if r.until is None or r.until > high_water]
    if not selected:
        return []
    if selected[0].from_ is not None and selected[0].from_ > high_water:
        raise CatchupImpossibleError(
            f"the oldest Change List still needed ({selected[0].loc}) starts at "
            f"{format_datetime(selected[0].from_)}, after the high-water mark {format_datetime(high_water)}: "
            "older lists were rotated away")
    return list(selected)


def _check_head(remote: RemoteList) -> None:
    """Refuse (and close) a document that is not a Change List or its index, or whose bounds are
    dated in the future or end before they start (listdates.py). A Resource List (or any other
    document) where a Change List belongs has no change to read: taken as one, it would be a
    silent "nothing changed"."""
    info = remote.info
    try:
        if info.capability != CHANGE_LIST:
            raise SourceDocumentError(f"{remote.url} is a {info.capability} document; expected a Change List")
        refuse_bad_bounds("Change List Index" if info.is_index else "Change List", remote.url, info)
    except BaseException:
        remote.close()
        raise


async def catch_up(ctx: SyncContext, high_water: datetime) -> CatchupReport:
    """Apply every change after H from the Change Lists; returns what was done.

    Raises CatchupImpossibleError (re-baseline instead), SourceUnreachableError or
    SourceDocumentError.
    """
    started = time.monotonic()
    report = CatchupReport(start=high_water, end=high_water)
    migrate_names(ctx)
    ctx.progress.start("catch-up")
    selected = await select_lists(ctx, high_water)
    # At start and on each poll, once the Source answered: every held-back change again.
    await ctx.applier.retry_due(everything=True)
    for item in selected:
        remote = item if isinstance(item, RemoteList) else await RemoteList.open(ctx.session, item.loc, "Change List",
                                                                                   ctx.list_origins)
        if remote.info.is_index:
            remote.close()
            raise SourceDocumentError(f"{remote.url} is an index inside a Change List Index; expected a Change List")
        _check_head(remote)
        report.lists.append(remote.url)
        last_datetime = await _apply_list(ctx, remote, high_water, report)
        if remote.info.until is not None:
            high_water = max(high_water, remote.info.until)
        elif last_datetime is not None:
            high_water = max(high_water, last_datetime)
        if not ctx.options.dry_run:
            ctx.state.commit(high_water=high_water)
        report.end = high_water
    report.seconds = time.monotonic() - started
    return report


async def _apply_list(ctx: SyncContext, remote: RemoteList, high_water: datetime,
                      report: CatchupReport) -> datetime | None:
    last_datetime: datetime | None = None
    pending: list[ResourceChange] = []
    async for chunk in remote.chunks(CHUNK):
        # before any of the chunk is applied: a future datetime would become a record's changed_at
        refuse_future_changes(remote.url, (c for c in chunk if isinstance(c, ResourceChange)))
        at_high_water: list[ResourceChange] = []
        for change in chunk:
            if not isinstance(change, ResourceChange):
                continue
            if change.changed_at is not None:
                last_datetime = change.changed_at
                if change.changed_at < high_water:
                    continue
                if change.changed_at == high_water:
                    at_high_water.append(change)
            pending.append(change)
        if at_high_water:
            # Those at H the records show applied are dropped; the rest keep their place in the
            # list: the last change per loc wins (apply.collapse), so one stamped H must never
            # come after a later change of its loc (a held-back creation, then its delete).
            done = {id(c) for c in at_high_water} - {id(c) for c in _not_yet_applied(ctx, at_high_water)}
            pending = [c for c in pending if id(c) not in done]
        if pending:
            await _apply(ctx, pending, report)
            pending = []
    return last_datetime


def _not_yet_applied(ctx: SyncContext, changes: list[ResourceChange]) -> list[ResourceChange]:
    """The changes stamped exactly H that the records do not show as applied. H is the last
    applied change's datetime (or a notification's `until`), so without this every poll
    would apply the list's newest changes again."""
    if not changes:
        return []
    records = ctx.state.records(c.loc for c in changes)
    return [c for c in changes if not _applied(c, records.get(c.loc))]


def _applied(change: ResourceChange, record: ResourceRecord | None) -> bool:
    if record is None or record.changed_at is None or change.changed_at is None:
        return False
    if record.changed_at > change.changed_at:
        return True
    deleted = change.change is ChangeType.DELETED
    return (record.changed_at == change.changed_at and record.last_change == change.change.value
            and record.state == (ResourceState.DELETED if deleted else ResourceState.OK))


async def _apply(ctx: SyncContext, changes: list[ResourceChange], report: CatchupReport) -> None:
    report.changes += len(changes)
    ctx.progress.seen += len(changes)
    records, outcomes = await ctx.applier.apply_changes(changes)
    if not ctx.options.dry_run:
        ctx.state.commit(records)
    for outcome in outcomes:
        match outcome.outcome:
            case ChangeOutcome.STORED | ChangeOutcome.WOULD_FETCH:
                report.fetched += 1
                ctx.progress.fetched += 1
            case ChangeOutcome.UNCHANGED:
                report.unchanged += 1
                ctx.progress.unchanged += 1
            case ChangeOutcome.EXCLUDED:
                report.excluded += 1
            case ChangeOutcome.DELETED | ChangeOutcome.ABSENT | ChangeOutcome.WOULD_DELETE:
                report.deleted += 1
                ctx.progress.deleted += 1
            case ChangeOutcome.SKIPPED_OLDER:
                report.skipped += 1
            case ChangeOutcome.FAILED | ChangeOutcome.STALE | ChangeOutcome.CONFLICT | ChangeOutcome.REFUSED:
                report.failed += 1
                ctx.progress.failed += 1

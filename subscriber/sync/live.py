"""Live: the inbox drained in chain order, each notification applied and H moved to its `until`
in one transaction with its records.

A notification whose interval is already covered (until <= H) is marked `covered`; one that
starts at or before H is applied (overlap is safe: every change is applied idempotently); one
that starts after H is a gap, unless the list the engine just read was fetched after it arrived
(the Source writes its lists before notifying, so that list already held it: `bridge_id`).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime

from rsnotify.datetimes import format_datetime, parse_w3c_datetime
from rsnotify.errors import DocumentParseError, NotificationParseError, ValidationError
from rsnotify.notification import ChangeNotification
from rsnotify.safexml import parse_in_thread
from rsnotify.websub import missing_sequences
from rsnotify.xml import parse_notification

from . import events as ev
from .context import SyncContext
from .outcomes import InboxStatus
from .state import InboxRow

log = logging.getLogger(__name__)

DONE = "done"
WAIT = "wait"
GAP = "gap"


@dataclass
class DrainResult:
    status: str                       # done, wait (a young gap: give reordering a chance), gap
    applied: int = 0
    gap_from: datetime | None = None  # H when the gap was met
    gap_until: datetime | None = None  # the first pending notification's `from`
    wait: float = 0.0
    kind: str = "interval"            # interval, or hub-epoch (the hub's numbering restarted)


async def _parse(row: InboxRow) -> ChangeNotification | str:
    """The delivery's notification, or why it is not one; parsed in a parser thread, bounded in
    time, so a hostile body never holds the loop the receiver and the engine share."""
    try:
        return await parse_in_thread(parse_notification, row.body, error=NotificationParseError)
    except ValidationError as exc:
        return "; ".join(exc.problems)
    except DocumentParseError as exc:
        return str(exc)


async def drain(ctx: SyncContext, *, bridge_id: int = 0, settle: float | None = None) -> DrainResult:
    """Apply what the inbox holds, in chain order, until it is empty or a gap is met.

    Each delivery is read and parsed once per call; rows that arrive meanwhile are picked up
    on the next pass.
    """
    settle = ctx.options.settle if settle is None else settle
    await ctx.applier.retry_due()
    schedule_retry(ctx)
    result = DrainResult(DONE)
    last_sequences = ctx.state.last_sequences()
    parsed: dict[int, tuple[InboxRow, ChangeNotification | str]] = {}
    while True:
        heads = ctx.state.pending_inbox_heads()
        if not heads:
            return result
        new = [row_id for row_id, _ in heads if row_id not in parsed]
        for row in ctx.state.inbox_rows(new):
            parsed[row.id] = (row, await _parse(row))
        latest = max((n.until_time for _, n in (parsed[i] for i in new if i in parsed)
                      if isinstance(n, ChangeNotification)), default=None)
        if latest is not None:
            ctx.state.note_source_latest(latest)    # what `sync status` measures the lag against
        pending = [parsed[row_id] for row_id, _ in heads if row_id in parsed]
        invalid = [(row, problem) for row, problem in pending if isinstance(problem, str)]
        if invalid:
            row, problem = invalid[0]
            ctx.state.commit(inbox_status=[(row.id, InboxStatus.INVALID, problem[:500])])
            ctx.events.emit(ev.GAP, kind="invalid", notification_id=row.notification_id, sequence=row.sequence,
                            detail=problem)
            return DrainResult(GAP, result.applied, ctx.state.high_water, None)
        good = sorted(((row, n) for row, n in pending if isinstance(n, ChangeNotification)),
                      key=lambda item: (item[1].from_time, item[0].id))
        progressed = False
        for row, notification in good:
            high_water = ctx.state.high_water
            if high_water is not None and notification.until_time <= high_water:
                _check_sequence(ctx, row, last_sequences)
                ctx.state.commit(inbox_status=[(row.id, InboxStatus.COVERED, None)], sequences=_seq(row))
            elif high_water is not None and notification.from_time > high_water and row.id > bridge_id:
                if progressed:
                    break      # re-read: an earlier delivery may have arrived meanwhile
                age = time.time() - row.received_at
                if age < settle:
                    return DrainResult(WAIT, result.applied, wait=settle - age)
                return DrainResult(GAP, result.applied, high_water, notification.from_time)
            else:
                if _new_hub_epoch(ctx, row, last_sequences) and (ctx.changelist_url or ctx.resourcelist_url):
                    # the hub's log restarted: what it lost is not in its numbering; catch up from H
                    return DrainResult(GAP, result.applied, high_water, None, kind="hub-epoch")
                _check_sequence(ctx, row, last_sequences)
                await _apply(ctx, row, notification)
                result.applied += 1
            parsed.pop(row.id, None)
            progressed = True
        if not progressed:
            return result


def schedule_retry(ctx: SyncContext) -> None:
    """Wake the live loop when the next held-back change is due (its backoff has passed)."""
    if ctx.wake is None:
        return
    due = ctx.state.next_retry_at()
    if ctx.retry_timer is not None:
        ctx.retry_timer.cancel()
        ctx.retry_timer = None
    if due is not None:
        ctx.retry_timer = asyncio.get_running_loop().call_later(max(0.05, due - time.time()), ctx.wake.set)


def _seq(row: InboxRow) -> list[tuple[str, int]]:
    return [(row.hub or "", row.sequence)] if row.sequence is not None else []


def _new_hub_epoch(ctx: SyncContext, row: InboxRow, last_sequences: dict[str, int]) -> bool:
    """A sequence below the last one seen, on a notification not yet covered: the hub (or its
    log) was replaced and numbers from 1 again (a repeat of an old delivery is covered, never
    here). The new numbering becomes the baseline; a `gap` event of kind hub-epoch says so."""
    if row.sequence is None:
        return False
    hub = row.hub or ""
    last = last_sequences.get(hub)
    if last is None or row.sequence >= last:
        return False
    ctx.state.reset_sequence(hub, row.sequence - 1)
    last_sequences[hub] = row.sequence - 1
    epochs = ctx.state.get_json("hub_epochs") or {}
    epochs[hub] = {"count": epochs.get(hub, {}).get("count", 0) + 1, "after": last, "restarted_at": row.sequence,
                   "seen": time.time()}
    ctx.state.set(hub_epochs=epochs)
    ctx.events.emit(ev.GAP, kind="hub-epoch", hub=hub, after=last, sequence=row.sequence)
    log.warning("the sequence at %s restarted (%d after %d): a new hub epoch", hub, row.sequence, last)
    return True


def _check_sequence(ctx: SyncContext, row: InboxRow, last_sequences: dict[str, int]) -> None:
    if row.sequence is None:
        return
    hub = row.hub or ""
    last = last_sequences.get(hub)
    if last is not None and row.sequence > last + 1:
        missing = missing_sequences(last, row.sequence)
        ctx.events.emit(ev.GAP, kind="sequence", hub=hub, missing=missing, after=last, sequence=row.sequence)
        log.warning("sequence jump at %s: %s missing", hub, missing)
    last_sequences[hub] = max(last or 0, row.sequence)


async def _apply(ctx: SyncContext, row: InboxRow, notification: ChangeNotification) -> None:
    records, outcomes = await ctx.applier.apply_changes(notification.changes)
    filled = _fills_open_gap(ctx, notification)
    ctx.state.commit(records, high_water=notification.until_time,
                     inbox_status=[(row.id, InboxStatus.APPLIED, None)],
                     sequences=_seq(row), last_notification_id=row.notification_id,
                     last_until_received=format_datetime(notification.until_time),
                     **({"unrecoverable_gap": None, "engine_state": "live"} if filled else {}))
    schedule_retry(ctx)   # a change held back just now gets its timer
    if filled:
        ctx.events.emit(ev.GAP, kind="filled", by="hub", **{"from": format_datetime(notification.from_time)})
    ctx.events.emit(ev.NOTIFICATION_APPLIED, notification_id=row.notification_id, sequence=row.sequence,
                    hub=row.hub, **{"from": format_datetime(notification.from_time)},
                    until=format_datetime(notification.until_time),
                    changes=[o.to_json() for o in outcomes],
                    latency_ms=round((time.time() - row.received_at) * 1000, 1))


def _fills_open_gap(ctx: SyncContext, notification: ChangeNotification) -> bool:
    """A gap reported at a restart with no list to check ([H, now)) is filled when the hub
    replays from H: the first notification applied then starts at or before that H."""
    gap = ctx.state.get_json("unrecoverable_gap")
    if not gap or gap.get("until") is not None or not gap.get("from"):
        return False
    return notification.from_time <= parse_w3c_datetime(gap["from"])

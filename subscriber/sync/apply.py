"""Applying changes and Resource List entries to the folder: the per-loc rules, idempotent.

A change older than what was applied for its loc is skipped (newer-wins on the Source's
`datetime`); deletes go first (a delete may free the name a create needs: a file that became a
folder); a delete removes only a file the state tracks for that loc, on an allowed host; a
create/update whose hash equals the stored one (file present) is recorded without a GET;
anything else is fetched, unless another loc already holds its path (a conflict, both named).
A change that cannot be applied is kept in its record (`want`) and retried: with backoff, on
the next change at a related path, on the poll and at start. Functions here return new
records; the caller commits them together with H.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from rsnotify.backoff import backoff_delay
from rsnotify.lists import Resource
from rsnotify.notification import ChangeType, ResourceChange

from . import events as ev
from .events import Events
from .exclude import Exclusions
from .fetcher import Fetcher, FetchResult
from .outcomes import ChangeOutcome, FetchOutcome, Refusal, ResourceState
from .sink import (
    WRITE_PROBLEM,
    FolderSink,
    Placement,
    SymlinkRefusedError,
    write_problem,
)
from .state import RETRIED_STATES, ResourceRecord, SyncState, from_text, to_text

log = logging.getLogger(__name__)

RETRY_CAP = 6 * 3600.0       # seconds: the longest wait between two tries of one change
_RETRY_BASE = {ResourceState.CONFLICT: 1.0, ResourceState.STALE: 30.0, ResourceState.FAILED: 10.0}
# A change the Destination's own disk refused (full, read-only, permissions, I/O): tried again
# after 2 s doubling to 5 min, not 6 h. Nothing about the Source says to wait; what ends it is
# an operator freeing space or fixing a mount, after which the copy should be whole again within
# minutes. A try asks the disk first (Applier._still_refused_by_disk): no GET while it still refuses.
LOCAL_RETRY_BASE = 2.0
LOCAL_RETRY_CAP = 300.0
# `sync --once` gives every change the disk held back one last try before it exits
# (Applier.last_try): at once when its retry time has come, else when it comes but never more
# than this many seconds from now. That is the first step of the schedule above, so a change
# the disk refused during the run gets the pause a live sync would give it, and a cron run
# never sleeps out a backoff of minutes.
LAST_TRY_WAIT = LOCAL_RETRY_BASE
_LINES_PER_MINUTE = 20       # stderr lines about single resources, per kind
SWEEP_GAP = 10.0             # seconds: a baseline or sweep this recent makes another sweep pointless
_UPDATED = ChangeType.UPDATED.value
# A retried change that is now applied: a held-back delete that removed its file (or found it
# gone) counts as fixed as a fetch that stored its bytes does.
_LANDED = (ChangeOutcome.STORED, ChangeOutcome.UNCHANGED, ChangeOutcome.DELETED, ChangeOutcome.ABSENT)


@dataclass(frozen=True, slots=True)
class Outcome:
    loc: str
    change: str
    outcome: ChangeOutcome
    path: str | None = None
    detail: str = ""

    def to_json(self) -> dict[str, str | None]:
        data: dict[str, str | None] = {"loc": self.loc, "change": self.change, "outcome": self.outcome,
                                       "path": self.path}
        if self.detail:
            data["detail"] = self.detail
        return data


def hashes_match(record: ResourceRecord | None, hashes: Sequence[tuple[str, str]]) -> bool | None:
    """True/False when some announced hash can be compared with the record's, else None."""
    if record is None:
        return None
    for algorithm, expected in hashes:
        stored = record.hash_of(algorithm)
        if stored is not None:
            return stored == expected.lower()
    return None


def collapse(changes: Iterable[ResourceChange]) -> list[ResourceChange]:
    """The last change per loc, in the order of those last changes (forward chronological).

    A change dated before the one already kept for its loc does not replace it: a Change List
    out of order (a Source's bug) would otherwise apply its older change and drop the newer,
    which apply_change alone would have skipped as older."""
    last: dict[str, ResourceChange] = {}
    for change in changes:
        kept = last.pop(change.loc, None)
        if kept is not None and change.changed_at is not None and kept.changed_at is not None \
                and change.changed_at < kept.changed_at:
            change = kept
        last[change.loc] = change
    return list(last.values())


def want_of(kind: str, changed_at: datetime | None, lastmod: datetime | None,
            hashes: Sequence[tuple[str, str]], length: int | None) -> str:
    """The JSON a record keeps of a change still to apply."""
    return json.dumps({"change": kind, "datetime": to_text(changed_at), "lastmod": to_text(lastmod),
                       "hashes": [list(pair) for pair in hashes], "length": length})


def probes_disk(record: ResourceRecord) -> bool:
    """A fetch the disk refused last time: the disk is asked (FolderSink.disk_refusal) before
    any GET for it, by a retry and by an audit's repair alike."""
    return record.state == ResourceState.FAILED and bool(record.path) \
        and (record.last_error or "").startswith(WRITE_PROBLEM) and not wants_delete(record)


def wants_delete(record: ResourceRecord) -> bool:
    """The record holds back a delete (its file could not be removed: a read-only disk)."""
    return record.state == ResourceState.FAILED and record.want is not None \
        and json.loads(record.want).get("change") == ChangeType.DELETED.value


def change_from_want(record: ResourceRecord) -> ResourceChange:
    want = json.loads(record.want or "{}")
    kind = want.get("change")
    return ResourceChange(record.loc, ChangeType(kind) if kind in ("created", "updated", "deleted") else ChangeType.UPDATED,
                          changed_at=from_text(want.get("datetime")), lastmod=from_text(want.get("lastmod")),
                          hashes=tuple(tuple(pair) for pair in want.get("hashes") or ()),  # type: ignore[misc]
                          length=want.get("length"))


def retry_delay(state: ResourceState, attempts: int, *, local: bool = False) -> float:
    """Seconds before the next try: doubling from a base by state (a conflict may clear at
    once, a server error less so), capped at RETRY_CAP; a local disk error (`local`) from
    LOCAL_RETRY_BASE to LOCAL_RETRY_CAP. The shared schedule without its jitter
    (rand=1.0: the whole ceiling): these are one Destination's own held-back changes, no crowd
    of clients to spread out, and the "next try" times `sync status` shows stay exact."""
    if local:
        return backoff_delay(max(1, attempts), LOCAL_RETRY_BASE, LOCAL_RETRY_CAP, rand=1.0)
    return backoff_delay(max(1, attempts), _RETRY_BASE.get(state, 10.0), RETRY_CAP, rand=1.0)


def held_delete(record: ResourceRecord, changed_at: datetime | None, detail: str) -> ResourceRecord:
    """The record of a delete whose file could not be removed (the disk refused): the file is
    still this resource's, and the delete is kept (`want`) to be tried again."""
    attempts = (record.attempts if record.state in RETRIED_STATES else 0) + 1
    return replace(record, state=ResourceState.FAILED, changed_at=_later(record.changed_at, changed_at),
                   last_change=ChangeType.DELETED.value, last_error=detail[:500], attempts=attempts,
                   next_retry_at=time.time() + retry_delay(ResourceState.FAILED, attempts, local=True),
                   want=want_of(ChangeType.DELETED.value, changed_at, None, (), None))


class PathHolders:
    """The locs whose records held each path when a batch of Resource List entries was read:
    one query per chunk instead of one per fetch. Together with the Applier's claims (paths
    being written, or written and not yet committed) it answers what `SyncState.holder_of`
    would at fetch time, as long as no claim was dropped since (`epoch`); otherwise the
    Applier asks the database again."""

    def __init__(self, held: dict[str, list[str]], epoch: int) -> None:
        self.held = held
        self.epoch = epoch

    def holder_of(self, path: str, other_than: str) -> str | None:
        for loc in self.held.get(path, ()):
            if loc != other_than:
                return loc
        return None


class Applier:
    """Applies changes and list entries through one Fetcher into one FolderSink.

    `events` and `report` (one stderr line) are set by the engine; each refusal, conflict,
    failure and escaped name goes to both."""

    def __init__(self, state: SyncState, sink: FolderSink, fetcher: Fetcher, *, dry_run: bool = False) -> None:
        self.state = state
        self.sink = sink
        self.fetcher = fetcher
        self.dry_run = dry_run
        self.events: Events | None = None
        self.report: Callable[[str], None] = lambda message: None
        self.refusals = 0                     # refusals by this process (--once exits 1 after one)
        self._unsaved_refusals: list[tuple[str, str, str]] = []
        self._unsaved_landed: set[str] = set()   # locs refused no more: a change of theirs landed since
        self._claims: dict[str, str] = {}     # path -> the loc being written there now
        self._claims_epoch = 0                # times _claims was emptied (see PathHolders)
        self._lines: dict[str, tuple[float, int]] = {}
        self.swept_at = -SWEEP_GAP   # time.monotonic() of the last pass over every resource (a sweep or a baseline)
        self.exclusions = Exclusions()        # --exclude, read against the Source's base (set by the engine)
        self.planned = {"fetch": 0, "delete": 0, "excluded": 0}   # --dry-run counts
        # An audit runs beside live applies (engine.py: a task of its own). While one watches,
        # every loc a change writes or deletes is noted: the audit neither reports nor repairs
        # such a loc (what it judged is older than the copy now). A repair in flight holds its
        # locs, and a change for one waits for it, so the newer change always lands last.
        self._watching = 0
        self._touched: set[str] = set()
        self._repairing: dict[str, asyncio.Event] = {}

    # --- audits beside live applies ----------------------------------------------------------

    def watch_changes(self) -> None:
        """Start noting the locs changes touch (one call per audit; `unwatch_changes` after)."""
        self._watching += 1

    def unwatch_changes(self) -> None:
        self._watching -= 1
        if self._watching <= 0:
            self._watching = 0
            self._touched.clear()

    def touched(self, loc: str) -> bool:
        """A change wrote or deleted `loc` (or is doing so) since the watching began."""
        return loc in self._touched

    def note_change(self, loc: str) -> None:
        if self._watching:
            self._touched.add(loc)

    def is_claimed(self, path: str) -> bool:
        """`path` is being written, or written and its record not yet committed."""
        return path in self._claims

    def hold_for_repair(self, locs: Iterable[str]) -> None:
        """A repair of these locs starts: changes for them wait until `release_repair`."""
        for loc in locs:
            self._repairing[loc] = asyncio.Event()

    def release_repair(self, locs: Iterable[str]) -> None:
        """The repair's records are committed: the changes that waited go on (and win)."""
        for loc in locs:
            event = self._repairing.pop(loc, None)
            if event is not None:
                event.set()

    async def _before_change(self, loc: str, record: ResourceRecord | None) -> ResourceRecord | None:
        """Note `loc` touched (before any await: an audit checking it next sees it), wait for a
        repair of it in flight; the record to build on (read again after such a wait)."""
        self.note_change(loc)
        event = self._repairing.get(loc)
        if event is None:
            return record
        await event.wait()
        return self.state.records([loc]).get(loc)

    # --- what the user sees ----------------------------------------------------------------

    def _say(self, kind: str, message: str) -> None:
        start, count = self._lines.get(kind, (time.monotonic(), 0))
        if time.monotonic() - start > 60:
            if count > _LINES_PER_MINUTE:
                self.report(f"{count - _LINES_PER_MINUTE:,} more {kind} line(s) not shown (see sync status)")
            start, count = time.monotonic(), 0
        count += 1
        self._lines[kind] = (start, count)
        if count <= _LINES_PER_MINUTE:
            self.report(message)

    def plan(self, action: str, loc: str, path: str | None) -> None:
        """--dry-run: say that a loc would be fetched or deleted (or is excluded: only counted)."""
        self.planned[action] += 1
        if action != "excluded":
            self._emit(ev.PLAN, action=action, loc=loc, path=path)

    def _emit(self, event: str, **data: object) -> None:
        if self.events is not None:
            self.events.emit(event, **data)

    def refuse(self, rule: Refusal, loc: str, detail: str) -> None:
        """Count, record and report one refusal (nothing was touched)."""
        self.refusals += 1
        if not self.dry_run:
            # Counted in batches: a Source listing 100,000 refused locs costs no 100,000 commits.
            self._unsaved_refusals.append((rule, loc, detail))
            self._unsaved_landed.discard(loc)
            if len(self._unsaved_refusals) >= 500:
                self.flush_refusals()
        self._emit(ev.REFUSED, loc=loc, rule=rule, detail=detail)
        self._say("refused", f"refused ({rule}): {loc}: {detail}")

    def flush_refusals(self) -> None:
        """Write the refusals counted since the last flush, and forget those of locs whose
        change landed since (each step ends with one)."""
        if self._unsaved_refusals or self._unsaved_landed:
            self.state.note_refusals(self._unsaved_refusals, self._unsaved_landed)
            self._unsaved_refusals = []
            self._unsaved_landed = set()

    def _note_landed(self, outcomes: Iterable[Outcome]) -> None:
        """A loc whose change landed (stored, unchanged, deleted, absent) is refused by no rule
        now: e.g. a body over the length a notification announced (a Source that saw the file
        mid-write announces 0, then the real length with its next change), or a loc the Source
        has deleted since. Without this, `sync status` counted it until the next baseline."""
        landed = {o.loc for o in outcomes if o.outcome in _LANDED}
        if landed and not self.dry_run:
            self._unsaved_refusals = [r for r in self._unsaved_refusals if r[1] not in landed]
            self._unsaved_landed |= landed

    def _escaped(self, loc: str, placement: Placement, record: ResourceRecord | None) -> None:
        if not placement.escaped:
            return
        relative = self.sink.relative(placement.path)
        if record is None or record.path != relative:
            self._emit(ev.NAME_ESCAPED, loc=loc, path=relative, reasons=list(placement.escaped))
            self._say("escaped", f"escaped name: {loc} -> {relative} ({'; '.join(placement.escaped)})")

    def _problem(self, outcome: Outcome, record: ResourceRecord | None, other: str | None = None) -> None:
        if outcome.outcome == ChangeOutcome.CONFLICT:
            self._emit(ev.CONFLICT, loc=outcome.loc, path=outcome.path, detail=outcome.detail,
                       **({"with": other, "kept": False} if other else {}))
            self._say("conflict", f"conflict: {outcome.loc} -> {outcome.path}: {outcome.detail}")
            if other:
                # Both sides of a name collision are reported; the one that got there first keeps the file.
                detail = f"{other} keeps {outcome.path}; {outcome.loc} maps there too"
                self._emit(ev.CONFLICT, loc=other, path=outcome.path, detail=detail, kept=True,
                           **{"with": outcome.loc})
                self._say("conflict", f"conflict: {other} -> {outcome.path}: {detail}")
        elif outcome.outcome in (ChangeOutcome.FAILED, ChangeOutcome.STALE):
            retry = (round(record.next_retry_at - time.time(), 1)
                     if record is not None and record.next_retry_at is not None else None)
            self._emit(ev.RESOURCE_FAILED, loc=outcome.loc, outcome=outcome.outcome, detail=outcome.detail,
                       retry_in_seconds=retry)
            self._say("failed", f"{outcome.outcome}: {outcome.loc}: {outcome.detail}"
                      + (f" (retry in {retry:.0f} s)" if retry is not None else ""))

    def hold_delete(self, record: ResourceRecord, changed_at: datetime | None, exc: OSError) -> ResourceRecord:
        """A delete the disk refused: its record (to commit), reported as a failure."""
        assert record.path is not None
        detail = write_problem(exc, self.sink.absolute(record.path), "remove")
        held = held_delete(record, changed_at, detail)
        self._problem(Outcome(record.loc, ChangeType.DELETED.value, ChangeOutcome.FAILED, record.path, detail), held)
        return held

    # --- changes (notifications, Change Lists) ----------------------------------------------

    async def apply_changes(self, changes: Sequence[ResourceChange],
                            records: dict[str, ResourceRecord] | None = None
                            ) -> tuple[list[ResourceRecord], list[Outcome]]:
        """Apply the last change per loc: deletes first, then the rest, different locs
        concurrently; then retry held-back changes at related paths. The records to commit
        (retried ones included) and one outcome per change."""
        collapsed = collapse(changes)
        new_records, outcomes = await self._apply_batch(collapsed, records)
        if not self.dry_run:
            # Only a delete frees a name: the held-back changes at, under or around it may go now.
            touched = {o.path for o in outcomes if o.path and o.outcome == ChangeOutcome.DELETED}
            batch = {c.loc for c in collapsed}
            related = [r for r in self.state.related_retries(touched) if r.loc not in batch] if touched else []
            if related:
                new_records += await self.retry(related)
        self.flush_refusals()
        return new_records, outcomes

    async def _apply_batch(self, collapsed: list[ResourceChange], records: dict[str, ResourceRecord] | None,
                           repair: bool = False) -> tuple[list[ResourceRecord], list[Outcome]]:
        if records is None:
            records = self.state.records(c.loc for c in collapsed)
        deletes = [c for c in collapsed if c.change is ChangeType.DELETED]
        others = [c for c in collapsed if c.change is not ChangeType.DELETED]
        results = list(await asyncio.gather(*(self.apply_change(c, records.get(c.loc), repair) for c in deletes)))
        results += await asyncio.gather(*(self.apply_change(c, records.get(c.loc), repair) for c in others))
        by_loc = {outcome.loc: (record, outcome) for record, outcome in results}
        self._note_landed(outcome for _, outcome in results)
        ordered = [by_loc[c.loc] for c in collapsed]
        return [record for record, _ in ordered if record is not None], [outcome for _, outcome in ordered]

    async def retry(self, records: Sequence[ResourceRecord], *, say_next_try: bool = True,
                    repair: bool = False) -> list[ResourceRecord]:
        """Try again the changes these records hold back; the records to commit. `say_next_try`:
        a line when the disk still refuses some, with their next try (not for --once's last try,
        which says what it left for the next run). `repair`: an audit's repair, which holds
        the locs itself (hold_for_repair)."""
        if not records or self.dry_run:
            return []
        records = [r for r in records if r.want and not self.exclusions.excludes(r.loc)]
        records, still_refused = await self._still_refused_by_disk(records, say_next_try)
        changes = [change_from_want(r) for r in records]
        new_records, outcomes = await self._apply_batch(changes, {r.loc: r for r in records}, repair)
        fixed = sum(o.outcome in _LANDED for o in outcomes)
        self.flush_refusals()
        tried = len(outcomes) + len(still_refused)
        self._emit(ev.RETRY_DONE, retried=tried, fixed=fixed, still_failing=tried - fixed)
        if fixed:
            self._say("retry", f"retried {tried:,} held-back change(s): {fixed:,} applied now")
        return new_records + still_refused

    async def _still_refused_by_disk(self, records: list[ResourceRecord], say: bool = True
                                     ) -> tuple[list[ResourceRecord], list[ResourceRecord]]:
        """Split off the fetches the disk refused last time and still refuses (a probe beside
        the file, no GET): a full disk with thousands of held-back resources costs the Source
        nothing until it has room again. Those come back rescheduled; the rest are to retry."""
        # the announced length, else one byte: a disk with no block left refuses even that
        local = [(r, json.loads(r.want or "{}").get("length")) for r in records if probes_disk(r)]
        if not local:
            return records, []
        refused = await self.disk_refusals(local)
        # The probe ran in a thread: read every record again, so a change applied meanwhile (an
        # audit's repair) is built on, is never overwritten by a rescheduled copy of what it
        # replaced, and a record no longer held back is left alone.
        now = self.state.records(r.loc for r in records)
        still = [rescheduled for probed, rescheduled in refused if now.get(probed.loc) == probed]
        held = {record.loc for record in still}
        if say:
            self.say_still_refused(still)
        return [r for r in now.values() if r.loc not in held and r.state in RETRIED_STATES and r.want], still

    async def disk_refusals(self, items: Sequence[tuple[ResourceRecord, int | None]]
                            ) -> list[tuple[ResourceRecord, ResourceRecord]]:
        """Ask the disk about each held-back fetch (its record, the length it will write; None:
        one byte, which a disk with no block left refuses too), in a thread, with no GET. For
        each one the disk still refuses: (the record as probed, the record rescheduled, with
        the new reason and the next try)."""
        paths = [self.sink.absolute(record.path or "") for record, _ in items]
        sizes = [length or 1 for _, length in items]
        refusals = await asyncio.to_thread(lambda: [self.sink.disk_refusal(p, n) for p, n in zip(paths, sizes)])
        refused: list[tuple[ResourceRecord, ResourceRecord]] = []
        for (record, _), path, refusal in zip(items, paths, refusals, strict=True):
            if refusal is not None:
                attempts = record.attempts + 1
                refused.append((record, replace(record, attempts=attempts,
                                                last_error=write_problem(refusal, path)[:500],
                                                next_retry_at=time.time() + retry_delay(ResourceState.FAILED,
                                                                                        attempts, local=True))))
        return refused

    def say_still_refused(self, still: Sequence[ResourceRecord]) -> None:
        """One stderr line for the held-back fetches a probe found the disk still refusing."""
        if still:
            self._say("failed", f"{len(still):,} held-back change(s) still cannot be written "
                                f"({still[0].last_error}); next try in "
                                f"{retry_delay(ResourceState.FAILED, still[0].attempts, local=True):.0f} s")

    async def last_try(self, wait_at_most: float = LAST_TRY_WAIT) -> tuple[int, ResourceRecord | None]:
        """Before `sync --once` exits: one last try of every change the disk held back (a
        fetch after a probe, so no GET while the disk still refuses; a delete by removing the
        file again), after waiting for the latest one's retry time, `wait_at_most` seconds at
        most. Commits what it did; returns how many are still held back, and the first of
        them by path."""
        if self.dry_run:
            return 0, None
        held = self._held_by_disk()
        if not held:
            return 0, None
        pause = min(wait_at_most, max(0.0, max(r.next_retry_at or 0.0 for r in held) - time.time()))
        if pause > 0:
            await asyncio.sleep(pause)
        self.state.commit(await self.retry(held, say_next_try=False))
        still = self._held_by_disk()
        return (len(still), still[0]) if still else (0, None)

    def _held_by_disk(self) -> list[ResourceRecord]:
        """The records the disk holds back, by path, but those of an --exclude'd loc: this run
        does not manage them (retry skips them too), so they neither wait nor fail it."""
        return [r for r in self.state.held_by_disk() if not self.exclusions.excludes(r.loc)]

    async def retry_due(self, *, everything: bool = False) -> int:
        """Retry (and commit) held-back changes whose time has come (`everything`: all of them,
        as at start and on the poll). Returns how many were tried."""
        if self.dry_run:
            return 0
        if everything:
            if time.monotonic() - self.swept_at < SWEEP_GAP:
                everything = False   # just tried them all (a baseline right before a catch-up)
            else:
                self.swept_at = time.monotonic()
        due = self.state.due_retries(None if everything else time.time(), limit=10_000)
        if due:
            self.state.commit(await self.retry(due))
        return len(due)

    async def apply_change(self, change: ResourceChange, record: ResourceRecord | None, repair: bool = False
                           ) -> tuple[ResourceRecord | None, Outcome]:
        """The record to commit for `change` and its outcome. `repair`: an audit's repair, which
        holds the loc itself (hold_for_repair)."""
        kind = change.change.value
        if self.exclusions.excludes(change.loc):
            if self.dry_run:
                self.plan("excluded", change.loc, None)
            return None, Outcome(change.loc, kind, ChangeOutcome.EXCLUDED, record.path if record else None)
        if (record is not None and change.changed_at is not None and record.changed_at is not None
                and change.changed_at < record.changed_at):
            return None, Outcome(change.loc, kind, ChangeOutcome.SKIPPED_OLDER, record.path)
        try:
            placement = self.sink.place(change.loc)
        except ValueError as exc:
            self.refuse(getattr(exc, "rule", Refusal.HOST), change.loc, str(exc))
            refused = None if change.change is ChangeType.DELETED else _refused(change.loc, str(exc), kind)
            return refused, Outcome(change.loc, kind, ChangeOutcome.REFUSED, None, str(exc))
        if change.change is ChangeType.DELETED:
            return await self._delete(change, record, placement, repair)
        path = placement.path
        relative = self.sink.relative(path)
        self._escaped(change.loc, placement, record)
        if (record is not None and record.state == ResourceState.OK and record.path == relative
                and hashes_match(record, change.hashes) and (change.length is None or change.length == record.length)
                and self.sink.is_file(path)):
            kept = replace(record, changed_at=_later(record.changed_at, change.changed_at), last_change=kind,
                           lastmod=change.lastmod or record.lastmod)
            return kept, Outcome(change.loc, kind, ChangeOutcome.UNCHANGED, relative)
        if self.dry_run:
            self.plan("fetch", change.loc, relative)
            return None, Outcome(change.loc, kind, ChangeOutcome.WOULD_FETCH, relative)
        return await self._fetch(change.loc, kind, path, record, change.changed_at, change.lastmod,
                                 change.length, change.hashes, kind, change.changed_at, repair=repair)

    async def _delete(self, change: ResourceChange, record: ResourceRecord | None, placement: Placement,
                      repair: bool = False) -> tuple[ResourceRecord | None, Outcome]:
        kind = change.change.value
        relative = self.sink.relative(placement.path)
        refused = self.fetcher.refusal(change.loc)
        if refused is not None:     # the same host rule as for fetches
            self.refuse(refused[0], change.loc, refused[1])
            return None, Outcome(change.loc, kind, ChangeOutcome.REFUSED, relative, refused[1])
        if not self.dry_run and not repair:
            record = await self._before_change(change.loc, record)
        tomb = ResourceRecord(change.loc, record.path if record and record.path else relative,
                              ResourceState.DELETED, changed_at=change.changed_at or (record.changed_at if record else None),
                              last_change=kind)
        if self.dry_run:
            if record is not None and record.holds_file:
                self.plan("delete", change.loc, record.path)
                return None, Outcome(change.loc, kind, ChangeOutcome.WOULD_DELETE, record.path)
            return None, Outcome(change.loc, kind, ChangeOutcome.ABSENT, relative)
        if record is None or not (record.holds_file or wants_delete(record)):
            # Only files the state tracks for this loc are ever removed.
            if record is None and await asyncio.to_thread(self.sink.is_file, placement.path):
                detail = f"{relative} is not a file this sync made; left as it is"
                self.refuse(Refusal.UNTRACKED, change.loc, detail)
                return tomb, Outcome(change.loc, kind, ChangeOutcome.REFUSED, relative, detail)
            return tomb, Outcome(change.loc, kind, ChangeOutcome.ABSENT, relative)
        assert record.path is not None
        if self._claims.get(record.path) == change.loc:
            del self._claims[record.path]
        try:
            existed = await asyncio.to_thread(self.sink.delete, self.sink.absolute(record.path))
        except SymlinkRefusedError as exc:
            self.refuse(Refusal.SYMLINK, change.loc, str(exc))
            return tomb, Outcome(change.loc, kind, ChangeOutcome.REFUSED, record.path, str(exc))
        except OSError as exc:
            # The disk refused (read-only, permissions, I/O): the file stays, and so does the delete.
            held = self.hold_delete(record, change.changed_at, exc)
            return held, Outcome(change.loc, kind, ChangeOutcome.FAILED, record.path, held.last_error or "")
        return tomb, Outcome(change.loc, kind, ChangeOutcome.DELETED if existed else ChangeOutcome.ABSENT, record.path)

    async def _fetch(self, loc: str, kind: str, path: Path | str, record: ResourceRecord | None,
                     changed_at: datetime | None, lastmod: datetime | None, length: int | None,
                     hashes: tuple[tuple[str, str], ...], want_kind: str, want_at: datetime | None,
                     holders: PathHolders | None = None, relative: str | None = None,
                     repair: bool = False) -> tuple[ResourceRecord, Outcome]:
        """Fetch one loc into `path` unless another loc holds that path. `want_kind` and
        `want_at`: the change a failed fetch keeps to retry (its JSON is only built then).
        `holders`: who held which path when the caller's batch was read (else one query here);
        `relative`: `path` relative to DIR, when the caller has it; `repair`: an audit's repair,
        which holds the loc itself (hold_for_repair)."""
        if not repair and (self._watching or self._repairing):
            fresh = await self._before_change(loc, record)
            if fresh is not record and fresh is not None and changed_at is not None \
                    and fresh.changed_at is not None and changed_at < fresh.changed_at:
                # a newer change landed while this one waited for a repair: it stays
                return fresh, Outcome(loc, kind, ChangeOutcome.SKIPPED_OLDER, fresh.path)
            record = fresh
        if relative is None:
            relative = self.sink.relative(path)
        other = self._claims.get(relative)
        if other is None:
            other = holders.holder_of(relative, loc) if holders is not None and holders.epoch == self._claims_epoch \
                else self.state.holder_of(relative, loc)
        if other is not None and other != loc:
            detail = f"{loc} and {other} both map to {relative}; the first one keeps it"
            result = FetchResult(loc, FetchOutcome.CONFLICT, detail=detail)
        else:
            # The claim outlives the fetch: the record that shows the path taken may still wait
            # for its batch's commit (every 1,000 records or 200 ms), so a bound far above that
            # keeps memory flat. Dropped on failure and on delete.
            if len(self._claims) > 20_000:
                self._claims.clear()
                self._claims_epoch += 1   # a PathHolders read before now may miss what was dropped
            self._claims[relative] = loc
            stored = False
            try:
                result = await self.fetcher.fetch(loc, path, length=length, hashes=hashes)
                stored = result.outcome == FetchOutcome.STORED
            finally:
                if not stored and self._claims.get(relative) == loc:    # failed, or cancelled
                    del self._claims[relative]
        # a stored resource keeps no change to retry: the JSON is built only for the others
        want = None if result.outcome == FetchOutcome.STORED else \
            want_of(want_kind, want_at, lastmod, hashes, length)
        new = record_from_fetch(result, relative, record, changed_at=changed_at, lastmod=lastmod,
                                last_change=kind, want=want)
        outcome = Outcome(loc, kind, outcome_of(result), relative, result.detail)
        if result.rule is not None:
            self.refuse(result.rule, loc, result.detail)
        self._problem(outcome, new, other)
        return new, outcome

    # --- Resource List entries (baseline, audit --repair) ------------------------------------

    def needs_fetch(self, resource: Resource, record: ResourceRecord | None, path: Path | str) -> bool:
        """False when the stored copy already is the listed one (hash, else length + lastmod)."""
        if record is None or record.state != ResourceState.OK or record.path != self.sink.relative(path):
            return True
        match = hashes_match(record, resource.hashes)
        if match is None:
            if resource.length is None and resource.lastmod is None:
                return True   # nothing to compare: fetch (audit calls such a resource unverifiable)
            match = (resource.length == record.length and resource.lastmod == record.lastmod)
        elif resource.length is not None and resource.length != record.length:
            match = False
        return not (match and self.sink.is_file(path))

    def path_holders(self, paths: Iterable[str]) -> PathHolders:
        """Who holds each of `paths` now (one query per 500), for `fetch_resource`'s conflict check."""
        return PathHolders(self.state.holders(paths), self._claims_epoch)

    async def fetch_resource(self, resource: Resource, record: ResourceRecord | None, path: Path | str, *,
                             placement: Placement | None = None, holders: PathHolders | None = None,
                             relative: str | None = None, repair: bool = False) -> tuple[ResourceRecord, Outcome]:
        """Fetch a listed resource to `path` (`placement`, `relative`: the sink's, when the
        caller has them; `repair`: an audit's repair of a loc it holds)."""
        if placement is None or placement.escaped:
            self._escaped(resource.loc, placement or self.sink.place(resource.loc), record)
        return await self._fetch(resource.loc, "baseline", path, record, record.changed_at if record else None,
                                 resource.lastmod, resource.length, resource.hashes, _UPDATED,
                                 None, holders, relative, repair)


def record_from_fetch(result: FetchResult, relative: str, previous: ResourceRecord | None, *,
                      changed_at: datetime | None, lastmod: datetime | None, last_change: str,
                      want: str | None = None) -> ResourceRecord:
    changed_at = _later(previous.changed_at if previous else None, changed_at)
    if result.outcome == FetchOutcome.STORED:
        return ResourceRecord(result.loc, relative, ResourceState.OK, result.md5, result.sha256, result.length,
                              lastmod, changed_at, last_change)
    base = previous or ResourceRecord(result.loc, relative, ResourceState.FAILED)
    state = {FetchOutcome.MISMATCH: ResourceState.STALE, FetchOutcome.CONFLICT: ResourceState.CONFLICT,
             FetchOutcome.REFUSED: ResourceState.REFUSED}.get(result.outcome, ResourceState.FAILED)
    if result.rule is Refusal.LENGTH:
        state = ResourceState.STALE      # the old copy stays; the Source may send the right bytes later
    if previous is not None and (previous.state == ResourceState.DELETED or previous.path != relative):
        base = replace(previous, md5=None, sha256=None, length=None)
    held = previous is not None and previous.state in RETRIED_STATES
    attempts = (previous.attempts if held and previous is not None else 0) + 1
    # A refusal is tried again only at start and on the poll (the rules may have changed:
    # --allow-host), never on a timer.
    timed = state != ResourceState.REFUSED and want is not None
    return replace(base, path=relative, state=state, changed_at=changed_at, last_change=last_change,
                   expected_hash=result.expected, last_error=result.detail[:500] or result.outcome,
                   attempts=attempts,
                   next_retry_at=time.time() + retry_delay(state, attempts, local=result.local) if timed else None,
                   want=want)


def outcome_of(result: FetchResult) -> ChangeOutcome:
    if result.outcome == FetchOutcome.STORED:
        return ChangeOutcome.STORED
    if result.outcome == FetchOutcome.MISMATCH or result.rule is Refusal.LENGTH:
        return ChangeOutcome.STALE
    if result.outcome == FetchOutcome.CONFLICT:
        return ChangeOutcome.CONFLICT
    if result.outcome == FetchOutcome.REFUSED:
        return ChangeOutcome.REFUSED
    return ChangeOutcome.FAILED


def _refused(loc: str, detail: str, kind: str) -> ResourceRecord:
    return ResourceRecord(loc, None, ResourceState.REFUSED, last_change=kind, last_error=detail[:500])


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)

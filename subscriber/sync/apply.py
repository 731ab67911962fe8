"""Applying changes and Resource List entries to the folder: the per-loc rules, idempotent.

A change older than what was applied for its loc is skipped (newer-wins on the Source's
`datetime`); a delete removes the file and keeps a tombstone; a create/update whose hash
equals the stored one (file present) is recorded without a GET; anything else is fetched.
Functions here return new records; the caller commits them together with H.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from rsnotify.lists import Resource
from rsnotify.notification import ChangeType, ResourceChange

from . import fetcher as fetch_outcomes
from .fetcher import Fetcher, FetchResult
from .sink import FolderSink
from .state import (
    CONFLICT,
    DELETED,
    FAILED,
    OK,
    REFUSED,
    STALE,
    ResourceRecord,
    SyncState,
)

log = logging.getLogger(__name__)

# Outcome values (the `outcome` of each change in `notification.applied` events)
STORED = "stored"
UNCHANGED = "unchanged"
DELETED_OUTCOME = "deleted"
ABSENT = "absent"
STALE_OUTCOME = "stale"
FAILED_OUTCOME = "failed"
SKIPPED_OLDER = "skipped-older"


@dataclass(frozen=True, slots=True)
class Outcome:
    loc: str
    change: str
    outcome: str
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
    """The last change per loc, in the order of those last changes (forward chronological)."""
    last: dict[str, ResourceChange] = {}
    for change in changes:
        last.pop(change.loc, None)
        last[change.loc] = change
    return list(last.values())


class Applier:
    """Applies changes and list entries through one Fetcher into one FolderSink."""

    def __init__(self, state: SyncState, sink: FolderSink, fetcher: Fetcher, *, dry_run: bool = False) -> None:
        self.state = state
        self.sink = sink
        self.fetcher = fetcher
        self.dry_run = dry_run

    # --- changes (notifications, Change Lists) ----------------------------------------------

    async def apply_changes(self, changes: Sequence[ResourceChange],
                            records: dict[str, ResourceRecord] | None = None
                            ) -> tuple[list[ResourceRecord], list[Outcome]]:
        """Apply the last change per loc, different locs concurrently."""
        collapsed = collapse(changes)
        if records is None:
            records = self.state.records(c.loc for c in collapsed)
        results = await asyncio.gather(*(self.apply_change(c, records.get(c.loc)) for c in collapsed))
        new_records = [record for record, _ in results if record is not None]
        return new_records, [outcome for _, outcome in results]

    async def apply_change(self, change: ResourceChange, record: ResourceRecord | None
                           ) -> tuple[ResourceRecord | None, Outcome]:
        kind = change.change.value
        if (record is not None and change.changed_at is not None and record.changed_at is not None
                and change.changed_at < record.changed_at):
            return None, Outcome(change.loc, kind, SKIPPED_OLDER, record.path)
        try:
            path = self.sink.path_for(change.loc)
        except ValueError as exc:
            return _refused(change.loc, str(exc), kind), Outcome(change.loc, kind, FAILED_OUTCOME, None, str(exc))
        relative = self.sink.relative(path)
        if change.change is ChangeType.DELETED:
            existed = False if self.dry_run else await asyncio.to_thread(self.sink.delete, path)
            tomb = ResourceRecord(change.loc, relative, DELETED, changed_at=change.changed_at or
                                  (record.changed_at if record else None), last_change=kind)
            return tomb, Outcome(change.loc, kind, DELETED_OUTCOME if existed else ABSENT, relative)
        if (record is not None and record.state == OK and hashes_match(record, change.hashes)
                and (change.length is None or change.length == record.length) and path.is_file()):
            kept = replace(record, changed_at=_later(record.changed_at, change.changed_at), last_change=kind,
                           lastmod=change.lastmod or record.lastmod)
            return kept, Outcome(change.loc, kind, UNCHANGED, relative)
        if self.dry_run:
            return None, Outcome(change.loc, kind, "would-fetch", relative)
        result = await self.fetcher.fetch(change.loc, path, length=change.length, hashes=change.hashes)
        new = record_from_fetch(result, relative, record, changed_at=change.changed_at, lastmod=change.lastmod,
                                last_change=kind)
        return new, Outcome(change.loc, kind, outcome_of(result), relative, result.detail)

    # --- Resource List entries (baseline, audit --repair) ------------------------------------

    def needs_fetch(self, resource: Resource, record: ResourceRecord | None, path: Path) -> bool:
        """False when the stored copy already is the listed one (hash, else length + lastmod)."""
        if record is None or record.state != OK:
            return True
        match = hashes_match(record, resource.hashes)
        if match is None:
            if resource.length is None and resource.lastmod is None:
                return True   # nothing to compare: fetch (audit calls such a resource unverifiable)
            match = (resource.length == record.length and resource.lastmod == record.lastmod)
        elif resource.length is not None and resource.length != record.length:
            match = False
        return not (match and path.is_file())

    async def fetch_resource(self, resource: Resource, record: ResourceRecord | None, path: Path
                             ) -> tuple[ResourceRecord, Outcome]:
        relative = self.sink.relative(path)
        result = await self.fetcher.fetch(resource.loc, path, length=resource.length, hashes=resource.hashes)
        new = record_from_fetch(result, relative, record, changed_at=record.changed_at if record else None,
                                lastmod=resource.lastmod, last_change="baseline")
        return new, Outcome(resource.loc, "baseline", outcome_of(result), relative, result.detail)


def record_from_fetch(result: FetchResult, relative: str, previous: ResourceRecord | None, *,
                      changed_at: datetime | None, lastmod: datetime | None, last_change: str) -> ResourceRecord:
    changed_at = _later(previous.changed_at if previous else None, changed_at)
    if result.outcome == fetch_outcomes.STORED:
        return ResourceRecord(result.loc, relative, OK, result.md5, result.sha256, result.length, lastmod,
                              changed_at, last_change)
    base = previous or ResourceRecord(result.loc, relative, FAILED)
    state = {fetch_outcomes.MISMATCH: STALE, fetch_outcomes.CONFLICT: CONFLICT,
             fetch_outcomes.REFUSED: REFUSED}.get(result.outcome, FAILED)
    if previous is not None and previous.state == DELETED:
        base = replace(previous, md5=None, sha256=None, length=None)
    return replace(base, path=relative, state=state, changed_at=changed_at, last_change=last_change,
                   expected_hash=result.expected, last_error=result.detail[:500] or result.outcome)


def outcome_of(result: FetchResult) -> str:
    if result.outcome == fetch_outcomes.STORED:
        return STORED
    if result.outcome == fetch_outcomes.MISMATCH:
        return STALE_OUTCOME
    return FAILED_OUTCOME


def _refused(loc: str, detail: str, kind: str) -> ResourceRecord:
    return ResourceRecord(loc, None, REFUSED, last_change=kind, last_error=detail[:500])


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)

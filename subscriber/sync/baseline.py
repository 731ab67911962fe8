"""Baseline: make the folder equal to the Source's Resource List (or Resource List Index).

The list is streamed a chunk at a time; each chunk's records are read in one query, resources
already held (hash, else length + lastmod) are skipped, the rest fetched concurrently. Tracked
resources the list no longer has are deleted. H becomes the list's `at` (never `completed`),
committed with the last records. A crash part-way resumes cheaply: what was fetched is recorded
and skipped the next time.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rsnotify.datetimes import format_datetime
from rsnotify.lists import Resource

from .apply import Outcome, PathHolders
from .context import SyncContext
from .events import BASELINE_PROGRESS
from .names import migrate_names
from .outcomes import ChangeOutcome, Refusal, ResourceState
from .remote import SourceDocumentError
from .resources import ResourceListRead, resource_chunks
from .sink import Placement, SymlinkRefusedError
from .state import ResourceRecord

log = logging.getLogger(__name__)


@dataclass
class BaselineReport:
    at: datetime | None
    listed: int = 0
    fetched: int = 0
    unchanged: int = 0
    deleted: int = 0
    failed: int = 0
    excluded: int = 0
    newer_locally: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"at": format_datetime(self.at) if self.at else None, "listed": self.listed,
                "fetched": self.fetched, "unchanged": self.unchanged, "deleted": self.deleted,
                "failed": self.failed, "excluded": self.excluded, "seconds": round(self.seconds, 3)}


PROGRESS_EVERY = 1.0     # seconds between baseline.progress events (--json), at batch commits


class _Batch:
    """Records waiting for their transaction (flushed by count or age); a flush a second or
    more after the last progress event emits the next (the counts a long baseline has reached)."""

    def __init__(self, ctx: SyncContext) -> None:
        self.ctx = ctx
        self.records: list[ResourceRecord] = []
        self.flushed_at = self.reported_at = time.monotonic()

    def add(self, record: ResourceRecord) -> None:
        self.records.append(record)
        if len(self.records) >= self.ctx.options.commit_every or time.monotonic() - self.flushed_at > 0.2:
            self.flush()

    def flush(self, **commit: object) -> None:
        if not self.ctx.options.dry_run:
            self.ctx.state.commit(self.records, **commit)  # type: ignore[arg-type]
        self.records = []
        self.flushed_at = time.monotonic()
        if self.flushed_at - self.reported_at >= PROGRESS_EVERY:
            self.reported_at = self.flushed_at
            self.ctx.events.emit(BASELINE_PROGRESS, **self.ctx.progress.counts())


async def run_baseline(ctx: SyncContext, *, phase: str = "baseline") -> BaselineReport:
    """Bring the folder to the Resource List's state; raises SourceUnreachableError /
    SourceDocumentError when the list cannot be had (nothing is deleted then)."""
    if not ctx.resourcelist_url:
        raise SourceDocumentError("the Source advertises no Resource List")
    started = time.monotonic()
    migrate_names(ctx)
    read = ResourceListRead(ctx.resourcelist_url)
    report = BaselineReport(at=None)
    ctx.progress.start(phase)
    ctx.state.clear_seen()
    ctx.state.clear_refusals()
    batch = _Batch(ctx)

    async def fetch(resource: Resource, record: ResourceRecord | None, placement: Placement,
                    holders: PathHolders, relative: str) -> None:
        new, outcome = await ctx.applier.fetch_resource(resource, record, placement.text, placement=placement,
                                                        holders=holders, relative=relative)
        batch.add(new)
        _count(report, ctx, outcome)

    workers = _Workers(fetch, ctx.options.concurrency * WORKERS_PER_GET)
    try:
        async for resources in resource_chunks(ctx.session, ctx.resourcelist_url, read, ctx.list_origins):
            report.at = read.at
            ctx.progress.total = read.hint
            ctx.state.mark_seen(r.loc for r in resources)
            records = ctx.state.records(r.loc for r in resources)
            wanted = _to_fetch(ctx, report, resources, records, batch)
            if not wanted:
                continue
            relatives = [ctx.sink.relative(placement.text) for _, _, placement in wanted]
            # who holds each path, read once for the chunk (the conflict check of every fetch)
            holders = ctx.applier.path_holders(relatives)
            await workers.put([(resource, record, placement, holders, relative)
                               for (resource, record, placement), relative in zip(wanted, relatives, strict=True)])
        await workers.finish()
    finally:
        workers.cancel()
        batch.flush()
    freed: list[str] = []
    if not ctx.options.keep_deleted:
        freed = await _delete_unlisted(ctx, report, batch)
    if not ctx.options.dry_run:
        batch.flush(high_water=report.at, baseline_at=report.at)
        ctx.applier.swept_at = time.monotonic()   # every listed resource was just tried
        # A listed resource whose name was taken by one the list dropped (a file that became
        # a folder) gets its turn now that the old one is gone.
        if freed:
            ctx.state.commit(await ctx.applier.retry(ctx.state.related_retries(freed)))
    ctx.applier.flush_refusals()
    report.seconds = time.monotonic() - started
    return report


WORKERS_PER_GET = 4      # workers per GET in flight: the others wait their turn at the fetcher's cap,
                         # or out a retry's backoff, while the cap's slots stay busy
BACKLOG_PER_WORKER = 1   # queued entries per worker before the list's reading waits for them


class _Workers:
    """A fixed set of tasks fetching queued entries in list order: one task per worker, not one
    per resource (a task, a semaphore turn and a wake-up of the list reader per resource were
    ~4 us of a 2 KB resource's CPU). The reader queues a chunk at a time and waits while the
    backlog is long, so memory holds a chunk and the entries in flight, whatever the list's size.
    The first error stops every worker; `put` or `finish` raises it."""

    def __init__(self, run: Callable[..., Awaitable[None]], size: int) -> None:
        self._run = run
        self._queue: deque[tuple[Any, ...]] = deque()
        self._backlog = size * BACKLOG_PER_WORKER
        self._more = asyncio.Event()         # entries queued, or no more will come
        self._room = asyncio.Event()         # the backlog is short again, or a worker failed
        self._closing = False
        self._error: BaseException | None = None
        self._tasks = [asyncio.create_task(self._work()) for _ in range(size)]

    async def put(self, entries: list[tuple[Any, ...]]) -> None:
        """Queue `entries`; returns once the backlog is short enough to read on."""
        self._raise_error()
        self._queue.extend(entries)
        self._more.set()
        while len(self._queue) > self._backlog and self._error is None:
            self._room.clear()
            await self._room.wait()
        self._raise_error()

    async def finish(self) -> None:
        """Wait until every queued entry is done; raises the first worker's error."""
        self._closing = True
        self._more.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._raise_error()

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    async def _work(self) -> None:
        queue = self._queue
        while self._error is None:
            if not queue:
                if self._closing:
                    return
                self._more.clear()
                await self._more.wait()
                continue
            entry = queue.popleft()
            if len(queue) <= self._backlog:
                self._room.set()
            try:
                await self._run(*entry)
            except BaseException as exc:   # stops the others; put/finish raise it
                if self._error is None:
                    self._error = exc
                self._room.set()
                self._more.set()
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return     # held for put/finish: a task's own exception would go unread after a cancel


def _to_fetch(ctx: SyncContext, report: BaselineReport, resources: list[Resource],
              records: dict[str, ResourceRecord], batch: _Batch
              ) -> list[tuple[Resource, ResourceRecord | None, Placement]]:
    """The chunk's resources to fetch, each with its record and placement; the others are
    counted (excluded, newer here, refused, unchanged) or, with --dry-run, planned."""
    wanted: list[tuple[Resource, ResourceRecord | None, Placement]] = []
    # A loc listed twice in one chunk (a Source's bug, or a hostile list repeating one loc a
    # thousand times) is taken once, as its last entry says: each copy was a GET and a write
    # of the same file, all at once.
    last = {resource.loc: resource for resource in resources}
    for resource in resources:
        report.listed += 1
        ctx.progress.seen += 1
        if len(last) < len(resources) and last[resource.loc] is not resource:
            continue
        if ctx.applier.exclusions.excludes(resource.loc):
            report.excluded += 1      # marked seen: a copy made before stays as it is
            if ctx.options.dry_run:
                ctx.applier.plan("excluded", resource.loc, None)
            continue
        record = records.get(resource.loc)
        if (record is not None and record.changed_at is not None and report.at is not None
                and record.changed_at > report.at):
            report.newer_locally += 1   # a change applied after the list's `at` wins
            continue
        try:
            placement = ctx.sink.place(resource.loc)
        except ValueError as exc:
            ctx.applier.refuse(getattr(exc, "rule", Refusal.HOST), resource.loc, str(exc))
            batch.add(ResourceRecord(resource.loc, None, ResourceState.REFUSED, last_error=str(exc)[:500]))
            report.failed += 1
            continue
        if not ctx.applier.needs_fetch(resource, record, placement.text):
            report.unchanged += 1
            ctx.progress.unchanged += 1
            continue
        if ctx.options.dry_run:
            report.fetched += 1
            ctx.applier.plan("fetch", resource.loc, ctx.sink.relative(placement.text))
            continue
        wanted.append((resource, record, placement))
    return wanted


async def _delete_unlisted(ctx: SyncContext, report: BaselineReport, batch: _Batch) -> list[str]:
    """Delete tracked resources the list no longer has; the paths freed."""
    freed: list[str] = []
    for record in list(ctx.state.unseen_records()):
        if record.changed_at is not None and report.at is not None and record.changed_at > report.at:
            continue   # created after the list's snapshot
        if ctx.applier.exclusions.excludes(record.loc):
            report.excluded += 1     # never deleted: an excluded copy is left as it is
            continue
        if ctx.options.dry_run:
            report.deleted += 1
            if record.path and record.holds_file:
                ctx.applier.plan("delete", record.loc, record.path)
            continue
        if record.path and record.holds_file:
            ctx.applier.note_change(record.loc)    # an audit running beside this leaves it alone
            try:
                await asyncio.to_thread(ctx.sink.delete, ctx.sink.absolute(record.path))
                freed.append(record.path)
            except SymlinkRefusedError as exc:
                ctx.applier.refuse(Refusal.SYMLINK, record.loc, str(exc))
            except OSError as exc:     # the disk refused: the delete is held back and tried again
                batch.add(ctx.applier.hold_delete(record, record.changed_at, exc))
                report.failed += 1
                continue
        batch.add(ResourceRecord(record.loc, record.path, ResourceState.DELETED, changed_at=record.changed_at,
                                 last_change="deleted"))
        report.deleted += 1
        ctx.progress.deleted += 1
    return freed


def _count(report: BaselineReport, ctx: SyncContext, outcome: Outcome) -> None:
    if outcome.outcome == ChangeOutcome.STORED:
        report.fetched += 1
        ctx.progress.fetched += 1
    else:
        report.failed += 1
        ctx.progress.failed += 1
        # the Applier already said it on stderr (a line each, at most 20 a minute) and as an event
        log.info("baseline: %s %s: %s", outcome.loc, outcome.outcome, outcome.detail)

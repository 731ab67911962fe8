"""The sync engine: keeps a folder equal to a Source, by baseline, live notifications and
catch-up after any gap, with one checkpoint H on the Source's clock.

States: baselining -> catching-up -> live (-> polling while push is unhealthy; degraded when
a gap cannot be filled or the Source cannot be reached). Every gap signal (a restart, an
interval that starts after H, an invalid delivery, a lost subscription, a poll) leads to the
same catch-up from H: the hub's replay (asked for when re-subscribing), the Source's Change
Lists, else a re-baseline from its Resource List. A gap nothing can fill is reported (a
`gap` event, `sync status`, exit 1 under --once), never absorbed silently.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import aiohttp

from rsnotify.datetimes import format_datetime
from rsnotify.filelocks import lock_or_holder, unlock, write_holder
from rsnotify.netguard import Network

from ..discovery import (
    DiscoveredTopic,
    DiscoveryUnreachableError,
    discover_capabilities,
    find_source,
)
from ..errors import DiscoveryError, SubscriberError
from ..settings import SubscriberSettings
from . import events as ev
from .apply import Applier
from .baseline import run_baseline
from .catchup import CatchupImpossibleError, catch_up
from .context import SyncContext, SyncOptions
from .events import Events
from .exclude import Exclusions
from .fetcher import USER_AGENT, Fetcher
from .headers import RequestRule
from .leftovers import sweep_partials
from .live import GAP, WAIT, drain
from .remote import ListOrigins, SourceDocumentError, SourceUnreachableError
from .session import make_session, source_networks
from .sink import FolderSink
from .state import RETRIED_STATES, STATE_DIR, SyncState

if TYPE_CHECKING:  # start_push imports it: `sync --once` and `audit` serve no callbacks
    from .audit import AuditReport   # audit() imports it: a sync that audits nothing needs none of it
    from .push import Push

log = logging.getLogger(__name__)

# engine states (channel.engine_state)
BASELINING = "baselining"
CATCHING_UP = "catching-up"
LIVE = "live"
POLLING = "polling"
DEGRADED = "degraded"

AGAIN = "again"    # a live pass that wants the next one at once

EXIT_IN_SYNC = 0
EXIT_DIFFERENCES = 1
EXIT_USAGE = 2          # as click's usage errors: here, a folder that knows no Source and none given
EXIT_UNREACHABLE = 3


class NoSourceError(SourceDocumentError):
    """No --source or --capability-list, and DIR's state names no Source (its first sync never
    reached one): a usage error, like a DIR with no state at all."""


class SyncEngine:
    """One Destination folder kept equal to one Capability List's resources.

    `await engine.open()`, then `await engine.sync_once()` (baseline or catch up, then return)
    or `await engine.run(stop)` (live until `stop` is set), or `await engine.audit()`; finally
    `await engine.close()`. Listen to `engine.events.listeners` for typed `SyncEvent`s.
    """

    def __init__(self, root: str | Path, *, source: str | None = None, capability_list: str | None = None,
                 options: SyncOptions | None = None, allow_networks: Iterable[Network] = (),
                 allow_hosts: Iterable[str] = (), push_settings: SubscriberSettings | None = None,
                 status: Callable[[str], None] = lambda message: None, request_timeout: float = 30.0,
                 poll_interval: float = 60.0, retry_base: float = 1.0, audit_every: float | None = None,
                 tries: int = 5, rules: Sequence[RequestRule] = ()) -> None:
        self.root = Path(root)
        self.source = source
        self.capability_list = capability_list
        self.options = options or SyncOptions()
        self.allow_networks = tuple(allow_networks)
        self.allow_hosts = tuple(h.lower() for h in allow_hosts)
        self._capability_list: str | None = None   # the one discovery found (the state keeps it too)
        self.push_settings = push_settings
        self.status = status
        self.request_timeout = request_timeout
        self.poll_interval = poll_interval
        self.retry_base = retry_base
        self.audit_every = audit_every       # seconds between audits run by the live process
        self.tries = tries                      # attempts per resource GET
        self.rules = tuple(rules)   # --rate, --header (sync/headers.py): lists and resources alike
        self.events = Events()
        # A dry run works on a private copy of the state, so it runs exactly like a real one
        # while DIR (files, state, lock) is never written.
        self.state = SyncState.scratch_copy(self.root) if self.options.dry_run else SyncState.in_dir(self.root)
        self.ctx: SyncContext | None = None
        self.channels: tuple[DiscoveredTopic, ...] = ()
        self.push: Push | None = None
        self.bridge_id = 0
        self.wake = asyncio.Event()
        self.source_reachable = True
        self.read_only = False               # an audit beside a running sync: no lock, no writes
        self._audit_task: asyncio.Task[None] | None = None   # an audit the live loop runs beside it
        self._locked = False

    # --- opening: discovery, guard, session ---------------------------------------------------

    async def open(self, *, shared: bool = False) -> None:
        """Discover the Source's lists and channel (or reuse what the state remembers).

        `shared` (audit): when another process holds the folder, open it read-only beside it
        (SQLite WAL lets readers in while the owner writes) instead of refusing.
        Raises SourceUnreachableError when the Source cannot be read and nothing is known yet;
        may be called again after that (a live start retries).
        """
        if self.options.dry_run:
            self._refuse_dry_run_beside_a_sync()
        elif not self._locked and not self.read_only:
            self._locked = self._lock_dir(shared=shared)
            self.read_only = not self._locked
            if self._locked and taken_after_a_kill(self.root):
                self._sweep_partials()
        if not self.read_only:
            self.state.prune_inbox()
        start = self.capability_list or self.source or self.state.get("capability_list")
        if not start:
            raise NoSourceError("no Source: give --source URL or --capability-list URL (DIR's earlier sync never "
                                "reached its Source, so there is none to resume)")
        networks = self.allow_networks + await source_networks(start)
        session = make_session(networks, limit=8, limit_per_host=8, timeout=self.request_timeout,
                               user_agent=USER_AGENT, middlewares=self.rules)
        try:
            await self._discover(session)
        except BaseException:
            await session.close()
            raise
        # The Source is the origin (scheme, host, port) of its Capability List: its lists and
        # resources only from there and from --allow-host (a list elsewhere is refused unread).
        capability_list = self.state.get("capability_list") or self._capability_list
        origins = [capability_list] if capability_list else []
        hosts = set(self.allow_hosts)
        for url in (self.state.get("resourcelist_url"), self.state.get("changelist_url")):
            if url:
                networks += await source_networks(url)
        sink = FolderSink(self.root)
        fetcher = Fetcher(sink, allowed_networks=networks, allowed_hosts=None if "*" in hosts else hosts,
                          allowed_origins=origins, concurrency=self.options.concurrency,
                          timeout=self.request_timeout, retry_base=self.retry_base, tries=self.tries,
                          rules=self.rules, max_bytes=self.options.max_resource_size)
        self.ctx = SyncContext(self.state, sink, fetcher, Applier(self.state, sink, fetcher,
                                                                   dry_run=self.options.dry_run),
                               session, self.events, options=self.options,
                               resourcelist_url=self.state.get("resourcelist_url"),
                               changelist_url=self.state.get("changelist_url"), wake=self.wake,
                               list_origins=ListOrigins(capability_list, None if "*" in hosts else hosts)
                               if capability_list else None)
        self.ctx.applier.report = self.status
        self.ctx.applier.exclusions = Exclusions(self.options.exclude, self.state.get("capability_list"))

    def _sweep_partials(self) -> None:
        """Remove the temp files of the killed process that held DIR before this one."""
        try:
            removed, failed = sweep_partials(self.root)
        except OSError as exc:
            removed, failed = 0, 1
            self.status(f"cannot look for the temp files a killed sync left in {self.root}: {exc}")
        if removed:
            self.status(f"removed {removed:,} temp file(s) that a killed sync left in {self.root}")
        if failed:
            # the lock keeps the killed holder's name at release, so the next start sweeps again
            _unswept.add(self.root.resolve())
            self.status(f"{failed:,} temp file(s) a killed sync left in {self.root} could not be removed; "
                        "the next start tries again")

    def _refuse_dry_run_beside_a_sync(self) -> None:
        """A dry run copies the state files; one being written by a running sync could be torn."""
        if (self.root / STATE_DIR / "lock").is_file():
            holder = lock_holder(self.root)
            if holder is not None:
                raise SourceDocumentError(f"{self.root} is in use by {holder}; a dry run reads a folder no sync "
                                          "is running on")

    def _lock_dir(self, *, shared: bool = False) -> bool:
        """One writer per folder: a second `sync` on it is refused, not interleaved. With
        `shared`, False when another process holds it (the caller then only reads)."""
        holder = lock_holder(self.root, take=True)
        if holder is None:
            return True
        if shared:
            return False
        raise SourceDocumentError(f"{self.root} is in use by {holder}; one sync per folder at a time")

    async def _discover(self, session: aiohttp.ClientSession) -> None:
        try:
            capability_list = self.capability_list
            if capability_list is None and self.source is None:
                # neither given (open() allows it for a folder synced before): the one it remembers
                capability_list = self.state.get("capability_list")
            if capability_list is None and self.source is not None:
                found_source = await find_source(session, self.source)
                lists = found_source.capability_lists
                if not lists:
                    raise SourceDocumentError(f"the Source Description {found_source.url} lists no Capability List")
                if len(lists) > 1:
                    self.status(f"the Source has {len(lists)} Capability Lists; syncing {lists[0]} "
                                "(give --capability-list for another, each in its own --dir)")
                capability_list = lists[0]
            assert capability_list is not None
            found = await discover_capabilities(session, capability_list)
        except DiscoveryError as exc:
            if isinstance(exc, DiscoveryUnreachableError) and self.state.get("capability_list"):
                self.source_reachable = False
                self.status(f"cannot read the Source now ({exc}); using what {self.state.path} remembers")
                self.channels = tuple(DiscoveredTopic(**{**c, "hubs": tuple(c["hubs"])})
                                      for c in self.state.get_json("channels") or [])
                return
            if isinstance(exc, DiscoveryUnreachableError):
                raise SourceUnreachableError(str(exc)) from exc
            # a 404, or a document that is not what it should be: a wrong address, not an outage
            raise SourceDocumentError(str(exc)) from exc
        known = self.state.get("capability_list")
        if known and known != found.capability_list:
            raise SourceDocumentError(f"{self.root} is a copy of {known}, not of {found.capability_list}; "
                                      "use another --dir")
        self.channels = found.channels
        self._capability_list = found.capability_list
        if not self.read_only:
            self.state.set(capability_list=found.capability_list, resourcelist_url=found.resourcelist,
                           changelist_url=found.changelist,
                           channels=[c.__dict__ for c in found.channels])
        parts = [f"resourcelist {found.resourcelist or 'none'}", f"changelist {found.changelist or 'none'}"]
        parts += [f"channel {c.topic} at {', '.join(c.hubs)}" for c in found.channels] or ["no channel"]
        self.status(f"Source capability list {found.capability_list} ({'; '.join(parts)})")

    async def close(self, *, unsubscribe: bool = False) -> None:
        """Stop serving and close the sessions; the state and the lock are released even when
        this is cancelled (a second Ctrl-C) or a close step fails."""
        try:
            if self.push is not None:
                push, self.push = self.push, None
                await push.close(unsubscribe=unsubscribe)
            if self.ctx is not None:
                ctx, self.ctx = self.ctx, None
                await ctx.fetcher.close()
                await ctx.session.close()
        finally:
            self.state.close()
            if self._locked:
                release_lock(self.root)
                self._locked = False

    def _set_state(self, name: str) -> None:
        self.state.set(engine_state=name)

    # --- the steps ---------------------------------------------------------------------------

    async def baseline(self, phase: str = "baseline") -> None:
        assert self.ctx is not None
        self._set_state(BASELINING)
        started = time.time()
        report = await run_baseline(self.ctx, phase=phase)
        self.ctx.progress.phase = "idle"
        self.state.add_run("baseline", started, report.to_json(), "done")
        self.state.set(unrecoverable_gap=None)
        self.status(f"{phase} done in {report.seconds:.1f} s: listed {report.listed:,}, fetched {report.fetched:,}, "
                    f"unchanged {report.unchanged:,}, deleted {report.deleted:,}, failed {report.failed:,}"
                    f"{f', excluded {report.excluded:,}' if report.excluded else ''}"
                    f"; high-water {format_datetime(report.at) if report.at else 'none'}")
        self.events.emit(ev.BASELINE_DONE, phase=phase, **report.to_json())

    async def recover(self, reason: str) -> bool:
        """Catch up from H: Change Lists, else a re-baseline, else report the gap as unrecoverable
        (returns False then).

        Raises SourceUnreachableError / SourceDocumentError when the Source's lists cannot be read.
        """
        assert self.ctx is not None
        self.bridge_id = self.state.last_inbox_id()
        high_water = self.state.high_water
        if high_water is None:
            if self.ctx.resourcelist_url:
                await self.baseline()
                high_water = self.state.high_water
                if high_water is None and self.ctx.changelist_url:
                    # No instant to join the Change Lists to: the copy is the Resource List's, and
                    # every run (and poll) reads the whole list again; said, not silently so.
                    self.status(f"the Resource List {self.ctx.resourcelist_url} has no `at` (the spec requires "
                                "one): its Change Lists cannot be joined to it, so each run reads the whole "
                                "Resource List again")
                if high_water is None or not self.ctx.changelist_url:
                    return True
            else:
                self._unrecoverable(None, None, "the Source has no Resource List to start from")
                return False
        self._set_state(CATCHING_UP)
        self.events.emit(ev.CATCHUP_START, reason=reason, **{"from": format_datetime(high_water)})
        started = time.time()
        try:
            report = await catch_up(self.ctx, high_water)
        except CatchupImpossibleError as exc:
            self.events.emit(ev.CATCHUP_IMPOSSIBLE, reason=str(exc), **{"from": format_datetime(high_water)})
            if not self.ctx.resourcelist_url:
                self._unrecoverable(high_water, None, str(exc))
                return False
            self.status(f"catch-up impossible ({exc}); re-baselining from the Resource List")
            await self.baseline("re-baseline")
            return True
        self.ctx.progress.phase = "idle"
        self.state.add_run("catchup", started, report.to_json(), "done")
        self.status(f"catch-up ({reason}) {format_datetime(report.start) if report.start else '?'} -> "
                    f"{format_datetime(report.end) if report.end else '?'} from {len(report.lists)} change list(s): "
                    f"{report.changes:,} changes, fetched {report.fetched:,}, deleted {report.deleted:,}, "
                    f"unchanged {report.unchanged:,}, failed {report.failed:,} in {report.seconds:.2f} s")
        self.events.emit(ev.CATCHUP_DONE, reason=reason, **report.to_json())
        return True

    def _unrecoverable(self, start: datetime | None, end: datetime | None, reason: str) -> None:
        gap = {"from": format_datetime(start) if start else None, "until": format_datetime(end) if end else None,
               "reason": reason}
        self.state.set(unrecoverable_gap=gap)
        self._set_state(DEGRADED)
        self.status(f"gap: unrecoverable [{gap['from'] or 'start'}, {gap['until'] or 'now'}): {reason}")
        self.events.emit(ev.GAP, kind="unrecoverable", **gap)
        self.events.emit(ev.DEGRADED, reason=reason)

    async def drain_inbox(self) -> str:
        """Apply the inbox; on a gap, recover and go on. Returns the last drain status."""
        assert self.ctx is not None
        for _ in range(5):
            result = await drain(self.ctx, bridge_id=self.bridge_id)
            if result.status != GAP:
                return result.status if result.status != WAIT else WAIT
            if result.kind == "hub-epoch":
                self.status("the hub's sequence restarted (a new hub epoch); catching up from the high-water mark")
            else:
                self.events.emit(ev.GAP, kind="interval",
                                 **{"from": format_datetime(result.gap_from) if result.gap_from else None,
                                    "until": format_datetime(result.gap_until) if result.gap_until else None})
                self.status(f"gap: [{format_datetime(result.gap_from) if result.gap_from else '?'}, "
                            f"{format_datetime(result.gap_until) if result.gap_until else '?'}) not received; "
                            "catching up")
            if not await self.recover(result.kind if result.kind != "interval" else "gap") \
                    and result.gap_until is not None:
                # Nothing can fill it: it stays reported; go on from the notification after it.
                self.state.set_high_water(result.gap_until, force=True)
                self._unrecoverable(result.gap_from, result.gap_until,
                                    "neither a Change List nor a Resource List reaches it")
        return "done"

    def exit_code(self) -> int:
        counts = self.state.counts_by_state()
        troubled = sum(counts.get(s, 0) for s in RETRIED_STATES)   # changes still to apply
        exclusions = self.ctx.applier.exclusions if self.ctx is not None else None
        if troubled and exclusions is not None and exclusions.patterns:
            # an --exclude'd resource is not this run's to keep: a change it holds is no difference
            troubled = sum(1 for loc in self.state.retried_locs() if not exclusions.excludes(loc))
        refused = self.ctx is not None and self.ctx.applier.refusals > 0   # this run refused something
        if self.state.get("unrecoverable_gap") or troubled or refused:
            return EXIT_DIFFERENCES
        return EXIT_IN_SYNC

    # --- the modes ---------------------------------------------------------------------------

    async def sync_once(self) -> int:
        """Baseline or catch up to the Source's lists, apply what the inbox holds; the exit code."""
        assert self.ctx is not None
        if not self.source_reachable:
            return EXIT_UNREACHABLE
        try:
            await self.recover("start")
            await self.drain_inbox()
        except (SourceUnreachableError, SourceDocumentError) as exc:
            self.status(f"the Source cannot be read: {exc}")
            self.events.emit(ev.DEGRADED, reason=str(exc))
            return EXIT_UNREACHABLE if isinstance(exc, SourceUnreachableError) else EXIT_DIFFERENCES
        # A cron run ends here, and the next may be an hour away: whatever the disk held back
        # gets one last try first (a probe before any GET), and what it still refuses is named.
        held, first = await self.ctx.applier.last_try()
        if first is not None:
            self.status(f"{held:,} change(s) held back by the local disk after a last try; first: "
                        f"{first.last_error} (the next run tries again)")
        code = self.exit_code()
        if self.options.dry_run:
            planned = self.ctx.applier.planned
            self.status(f"dry run: would fetch {planned['fetch']:,}, delete {planned['delete']:,}; excluded "
                        f"{planned['excluded']:,}; nothing was written")
            self.events.emit(ev.PLAN_DONE, **planned)
            return code
        if code == EXIT_IN_SYNC and self.state.get("engine_state") != DEGRADED:
            # --once is the pull-only (cron) mode: between runs the copy is kept by polling
            self._set_state(POLLING)
        return code

    async def start_push(self) -> None:
        """Serve callbacks and make (or reuse) the subscription, before any pull, so nothing
        published meanwhile is missed."""
        if self.push_settings is None:
            return
        # imported here: aiohttp.web, the callback core and the client serve live syncs only
        from .push import Push
        self.push = Push(self.state, self.push_settings, self.wake, self.status)
        base = await self.push.start()
        host = self.push_settings.listen_host
        self.state.set(listen=f"[{host}]:{self.push.port}" if ":" in host else f"{host}:{self.push.port}")
        self.status(f"listening on {self.push_settings.listen_host}:{self.push.port}, callbacks under {base}")
        if not self.channels:
            self.status("the Source advertises no change-notification channel: polling its lists")
            self._set_state(POLLING)
            return
        try:
            subscription = await self.push.subscribe(self.channels[0])
        except SubscriberError as exc:
            self.status(f"could not subscribe ({exc}); polling the Source's lists instead")
            self.events.emit(ev.DEGRADED, reason=f"push unavailable: {exc}")
            self._set_state(POLLING)
            return
        self.status(f"subscribed to {subscription.topic} at {subscription.hub} (lease {subscription.lease_seconds} s, "
                    f"{'signed' if subscription.has_secret else 'unsigned'})")
        self.events.emit(ev.SUBSCRIBED, topic=subscription.topic, hub=subscription.hub,
                         lease_seconds=subscription.lease_seconds, callback=subscription.callback)

    async def run(self, stop: asyncio.Event) -> int:
        """Live until `stop` is set: push into the inbox, apply, catch up on every gap; serve
        other processes' requests (audit --repair) and run the periodic audit (--audit-every)."""
        assert self.ctx is not None
        await self.start_push()
        backoff = 1.0
        while not stop.is_set():
            try:
                await self.recover("start" if backoff == 1.0 else "retry")
                break
            except (SourceUnreachableError, SourceDocumentError) as exc:
                self.status(f"the Source cannot be read ({exc}); retrying in {backoff:.0f} s")
                self.events.emit(ev.DEGRADED, reason=str(exc))
                await _wait(stop, backoff)
                backoff = min(backoff * 2, 300.0)
        if stop.is_set():
            return EXIT_IN_SYNC
        self._go_live()
        clock = _LiveClock(time.monotonic(), self.audit_every)
        watcher = asyncio.create_task(self._watch_requests())
        try:
            while not stop.is_set():
                self.wake.clear()
                status = await self._live_pass(clock)
                if status == AGAIN:
                    continue
                timeout = self.options.settle if status == WAIT else self.poll_interval
                if clock.next_audit is not None:
                    timeout = max(0.0, min(timeout, clock.next_audit - time.monotonic()))
                await _wait_any(stop, self.wake, timeout)
                if self.push is not None and self.push.receiver.fatal is not None:
                    raise self.push.receiver.fatal   # the inbox cannot be written: stop (runner says why)
                if time.monotonic() - clock.last_prune > 3600:
                    self.state.prune_inbox()   # applied deliveries are kept a day, then dropped
                    clock.last_prune = time.monotonic()
        finally:
            watcher.cancel()
            await self._stop_audit()
        return EXIT_IN_SYNC

    async def _live_pass(self, clock: _LiveClock) -> str:
        """One pass of the live loop: re-subscribe when push was lost, drain the inbox, poll the
        Source when push is silent, serve requests, audit when due. Returns the drain status, or
        AGAIN to pass once more at once (after a catch-up)."""
        status = "done"
        try:
            if self._push_lost() and time.monotonic() - clock.last_subscribe > self.poll_interval:
                clock.last_subscribe = time.monotonic()
                if await self._resubscribe():
                    await self.recover("resubscribed")
                    self._go_live()
                    return AGAIN
            status = await self.drain_inbox()
            polling = self.push is None or self.push.subscription is None
            if time.monotonic() - clock.last_pull > self.poll_interval and (polling or self._silent()):
                await self.recover("poll")
                clock.last_pull = time.monotonic()
                return AGAIN
            self._reap_audit()
            if self._audit_task is None:
                # An audit is a task of its own: live applies go on while it reads the list and
                # hashes the files (audit.py keeps it exact: what a change touched meanwhile is
                # neither reported nor repaired). Requests and the next periodic one wait for it.
                if self.state.has_open_requests():
                    self._start_audit(self._serve_request())
                elif clock.next_audit is not None and time.monotonic() >= clock.next_audit:
                    clock.audit_ran(time.monotonic())
                    self._start_audit(self._audit_and_report("every"))
        except (SourceUnreachableError, SourceDocumentError) as exc:
            self.status(f"the Source cannot be read ({exc}); retrying")
            self.events.emit(ev.DEGRADED, reason=str(exc))
            status = WAIT
        return status

    def _start_audit(self, work: Coroutine[Any, Any, object]) -> None:
        assert self.ctx is not None
        applier = self.ctx.applier
        applier.watch_changes()    # now: the next drain may start before the task's first step

        async def audit() -> None:
            try:
                await work
            finally:
                applier.unwatch_changes()

        self._audit_task = asyncio.create_task(audit())
        self._audit_task.add_done_callback(lambda _: self.wake.set())   # the live loop reaps it

    def _reap_audit(self) -> None:
        """Forget a finished audit task; an unreadable Source ends only that audit (said and
        emitted), any other error (the state database, a bug) is raised here, in the live loop."""
        task = self._audit_task
        if task is None or not task.done():
            return
        self._audit_task = None
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, (SourceUnreachableError, SourceDocumentError)):
            self.status(f"the Source cannot be read ({exc}); the audit stopped")
            self.events.emit(ev.DEGRADED, reason=str(exc))
        elif exc is not None:
            raise exc

    async def _stop_audit(self) -> None:
        """Cancel an audit under way when the live loop ends; one that already ended is reaped
        (its error said or raised, never left for asyncio to print at exit)."""
        task = self._audit_task
        if task is not None and not task.done():
            self._audit_task = None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._reap_audit()

    async def _watch_requests(self) -> None:
        """Wake the live loop when another process asks for work (audit --repair) and no audit
        is under way (the loop takes the next request when that one ends)."""
        while True:
            await asyncio.sleep(0.3)
            if self._audit_task is None and self.state.has_open_requests():
                self.wake.set()

    async def _serve_request(self) -> None:
        """The next open audit request. One per task: its watch of live changes (_start_audit)
        begins when no change is in flight and ends with it, so what a change touched during one
        audit never hides a difference from the next; the live loop starts the next task."""
        while (request := self.state.take_request()) is not None:
            request_id, kind, args = request
            if kind != "audit":
                self.state.finish_request(request_id, {"error": f"unknown request {kind!r}"})
                continue
            try:
                report = await self._audit_and_report("request", deep=bool(args.get("deep")),
                                                      repair=bool(args.get("repair")))
            except (SourceUnreachableError, SourceDocumentError) as exc:
                self.state.finish_request(request_id, {"error": str(exc),
                                                       "unreachable": isinstance(exc, SourceUnreachableError)})
                raise
            self.state.finish_request(request_id, {"report": report.to_json(), "in_sync": report.in_sync})
            return

    async def _audit_and_report(self, trigger: str, *, deep: bool = False, repair: bool = False) -> AuditReport:
        self.status(f"audit ({'asked by rsnotify audit' if trigger == 'request' else 'periodic'}"
                    f"{', deep' if deep else ''}{', repair' if repair else ''})")
        report = await self.audit(deep=deep, repair=repair, trigger=trigger)
        self.status(f"audit done: {audit_counts(report, deep=deep, repair=repair)}")
        return report

    def _push_lost(self) -> bool:
        lost = self.push is not None and self.push.subscription is None and bool(self.channels)
        if lost and self.state.get("engine_state") == LIVE:
            self._set_state(POLLING)
            self.events.emit(ev.DEGRADED, reason="the subscription was lost; polling the Source's lists")
        return lost

    async def _resubscribe(self) -> bool:
        assert self.push is not None
        try:
            subscription = await self.push.subscribe(self.channels[0])
        except SubscriberError as exc:
            self.status(f"could not subscribe again ({exc}); still polling")
            return False
        self.status(f"subscribed again to {subscription.topic} at {subscription.hub}")
        self.events.emit(ev.SUBSCRIBED, topic=subscription.topic, hub=subscription.hub,
                         lease_seconds=subscription.lease_seconds, callback=subscription.callback)
        return True

    def _silent(self) -> bool:
        rows = self.state._query("SELECT max(received_at) FROM inbox")
        last = rows[0][0] if rows and rows[0][0] else None
        return last is None or time.time() - last > self.poll_interval

    def _go_live(self) -> None:
        high_water = self.state.high_water
        self._set_state(LIVE if self.push and self.push.subscription else POLLING)
        sequences = self.state.last_sequences()
        self.status(f"live (high-water {format_datetime(high_water) if high_water else 'none'}"
                    + (f", sequence {max(sequences.values())}" if sequences else "") + ")")
        self.events.emit(ev.LIVE, high_water=format_datetime(high_water) if high_water else None,
                         sequences=sequences, push=bool(self.push and self.push.subscription))

    async def audit(self, *, deep: bool = False, repair: bool = False, trigger: str = "command") -> AuditReport:
        """Audit against the Resource List (read-only beside a running sync: no run recorded)."""
        assert self.ctx is not None
        from .audit import run_audit
        report = await run_audit(self.ctx, deep=deep, repair=repair, record=not self.read_only)
        self.events.emit(ev.AUDIT_DONE, trigger=trigger, deep=deep, in_sync=report.in_sync, **report.to_json())
        return report


class _LiveClock:
    """When the live loop last pulled, subscribed, pruned, and when the next audit is due."""

    def __init__(self, now: float, audit_every: float | None) -> None:
        self.last_pull = self.last_subscribe = self.last_prune = now
        self.audit_every = audit_every
        self.next_audit = now + audit_every if audit_every else None

    def audit_ran(self, now: float) -> None:
        if self.audit_every:
            self.next_audit = now + self.audit_every


def audit_counts(report: AuditReport, *, deep: bool, repair: bool) -> str:
    """The one-line summary `rsnotify audit` and the live sync print."""
    counts = (f"same {report.same:,}, missing {report.missing:,}"
              f"{f' (symlinks {report.symlinks:,})' if report.symlinks else ''}, changed {report.changed:,}"
              f"{f' (corrupt {report.corrupt:,})' if deep else ''}, extra {report.extra:,}, "
              f"untracked {report.untracked:,}, {f'conflicts {report.conflicts:,}, ' if report.conflicts else ''}"
              f"{f'pending {report.pending:,}, ' if report.pending else ''}"
              f"{f'unapplied notifications {report.unapplied:,}, ' if report.unapplied else ''}newer locally {report.newer_locally:,}, "
              f"unverifiable {report.unverifiable:,}, escaped names {report.escaped:,}"
              f"{f', excluded {report.excluded:,}' if report.excluded else ''}")
    if repair:
        counts += f"; repaired {report.repaired:,}, repair failed {report.repair_failed:,}"
    return counts


_held_locks: dict[Path, IO[str]] = {}


def lock_holder(root: Path, *, take: bool = False) -> str | None:
    """Who holds DIR's lock ("rsnotify (pid N)"), or None when it is free. With `take`, a free
    lock is taken for this process (released by `release_lock`)."""
    path = root / STATE_DIR / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    file = path.open("a+")
    holder = lock_or_holder(file)
    if holder is not None:
        return holder
    if not take:
        unlock(file)
        file.close()
        return None
    file.seek(0)
    if file.read().strip():
        # the last holder wrote its name and never cleared it: it was killed (see release_lock)
        _unreleased.add(root.resolve())
    write_holder(file, f"rsnotify (pid {os.getpid()})")
    _held_locks[root.resolve()] = file
    return None


# folders whose lock this process took after a holder that never released it (killed)
_unreleased: set[Path] = set()
# of those, the folders whose killed holder's temp files could not all be removed
_unswept: set[Path] = set()


def taken_after_a_kill(root: Path) -> bool:
    """This process holds DIR's lock and the holder before it ended without releasing it (kill
    -9, a power cut): it may have left temp files behind."""
    return root.resolve() in _unreleased


def release_lock(root: Path) -> None:
    file = _held_locks.pop(root.resolve(), None)
    _unreleased.discard(root.resolve())
    unswept = root.resolve() in _unswept
    _unswept.discard(root.resolve())
    if file is not None:
        if not unswept:      # else the holder's name stays: the next start sweeps what is left
            try:
                write_holder(file, "")   # an empty lock file: the last holder ended cleanly
            except OSError:
                pass                     # a full or read-only disk: the next start sweeps once for nothing
        file.close()   # releases the lock


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


async def _wait_any(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())}
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()

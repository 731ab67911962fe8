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
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import aiohttp

from rsnotify.datetimes import format_datetime
from rsnotify.filelocks import lock as lock_file
from rsnotify.netguard import Network

from ..discovery import DiscoveredTopic, discover_capabilities, source_capability_lists
from ..errors import DiscoveryError, SubscriberError
from ..settings import SubscriberSettings
from . import events as ev
from .apply import Applier
from .audit import AuditReport, run_audit
from .baseline import run_baseline
from .catchup import CatchupImpossibleError, catch_up
from .context import SyncContext, SyncOptions
from .events import Events
from .fetcher import USER_AGENT, Fetcher
from .live import GAP, WAIT, drain
from .push import Push
from .remote import (
    SourceDocumentError,
    SourceUnreachableError,
    make_session,
    source_networks,
)
from .sink import FolderSink
from .state import CONFLICT, FAILED, REFUSED, STALE, SyncState

log = logging.getLogger(__name__)

# engine states (channel.engine_state)
BASELINING = "baselining"
CATCHING_UP = "catching-up"
LIVE = "live"
POLLING = "polling"
DEGRADED = "degraded"

EXIT_IN_SYNC = 0
EXIT_DIFFERENCES = 1
EXIT_UNREACHABLE = 3


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
                 poll_interval: float = 60.0, retry_base: float = 1.0) -> None:
        self.root = Path(root)
        self.source = source
        self.capability_list = capability_list
        self.options = options or SyncOptions()
        self.allow_networks = tuple(allow_networks)
        self.allow_hosts = tuple(h.lower() for h in allow_hosts)
        self.push_settings = push_settings
        self.status = status
        self.request_timeout = request_timeout
        self.poll_interval = poll_interval
        self.retry_base = retry_base
        self.events = Events()
        self.state = SyncState.in_dir(self.root)
        self.ctx: SyncContext | None = None
        self.channels: tuple[DiscoveredTopic, ...] = ()
        self.push: Push | None = None
        self.bridge_id = 0
        self.wake = asyncio.Event()
        self.source_reachable = True
        self._lock_file: IO[str] | None = None

    # --- opening: discovery, guard, session ---------------------------------------------------

    async def open(self) -> None:
        """Discover the Source's lists and channel (or reuse what the state remembers).

        Raises SourceUnreachableError when the Source cannot be read and nothing is known yet.
        """
        self._lock_dir()
        self.state.prune_inbox()
        start = self.capability_list or self.source or self.state.get("capability_list")
        if not start:
            raise SourceDocumentError("no Source: give --source or --capability-list")
        networks = self.allow_networks + await source_networks(start)
        session = make_session(networks, limit=8, limit_per_host=8, timeout=self.request_timeout,
                               user_agent=USER_AGENT)
        try:
            await self._discover(session)
        except BaseException:
            await session.close()
            raise
        hosts = {urlsplit(u).hostname or "" for u in (self.state.get("capability_list"), self.state.get(
            "resourcelist_url"), self.state.get("changelist_url")) if u} | set(self.allow_hosts)
        for url in (self.state.get("resourcelist_url"), self.state.get("changelist_url")):
            if url:
                networks += await source_networks(url)
        sink = FolderSink(self.root)
        fetcher = Fetcher(sink, allowed_networks=networks, allowed_hosts=None if "*" in hosts else hosts,
                          concurrency=self.options.concurrency, timeout=self.request_timeout,
                          retry_base=self.retry_base)
        self.ctx = SyncContext(self.state, sink, fetcher, Applier(self.state, sink, fetcher,
                                                                   dry_run=self.options.dry_run),
                               session, self.events, options=self.options,
                               resourcelist_url=self.state.get("resourcelist_url"),
                               changelist_url=self.state.get("changelist_url"))

    def _lock_dir(self) -> None:
        """One engine per folder: a second `sync` or `audit` on it is refused, not interleaved."""
        path = self.state.path.with_name("lock")
        self._lock_file = path.open("a+")
        try:
            lock_file(self._lock_file, wait=False)
        except OSError:
            self._lock_file.seek(0)
            holder = self._lock_file.read().strip() or "another process"
            self._lock_file.close()
            self._lock_file = None
            raise SourceDocumentError(f"{self.root} is in use by {holder}; one sync or audit per folder at a time")
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(f"rsnotify (pid {os.getpid()})")
        self._lock_file.flush()

    async def _discover(self, session: aiohttp.ClientSession) -> None:
        try:
            capability_list = self.capability_list
            if capability_list is None and self.source is not None:
                description, lists = await source_capability_lists(session, self.source)
                if not lists:
                    raise DiscoveryError(f"the Source Description {description} lists no Capability List")
                if len(lists) > 1:
                    self.status(f"the Source has {len(lists)} Capability Lists; syncing {lists[0]} "
                                "(give --capability-list for another, each in its own --dir)")
                capability_list = lists[0]
            assert capability_list is not None
            found = await discover_capabilities(session, capability_list)
        except DiscoveryError as exc:
            if self.state.get("capability_list"):
                self.source_reachable = False
                self.status(f"cannot read the Source now ({exc}); using what {self.state.path} remembers")
                self.channels = tuple(DiscoveredTopic(**{**c, "hubs": tuple(c["hubs"])})
                                      for c in self.state.get_json("channels") or [])
                return
            raise SourceUnreachableError(str(exc)) from exc
        known = self.state.get("capability_list")
        if known and known != found.capability_list:
            raise SourceDocumentError(f"{self.root} is a copy of {known}, not of {found.capability_list}; "
                                      "use another --dir")
        self.channels = found.channels
        self.state.set(capability_list=found.capability_list, resourcelist_url=found.resourcelist,
                       changelist_url=found.changelist,
                       channels=[c.__dict__ for c in found.channels])
        parts = [f"resourcelist {found.resourcelist or 'none'}", f"changelist {found.changelist or 'none'}"]
        parts += [f"channel {c.topic} at {', '.join(c.hubs)}" for c in found.channels] or ["no channel"]
        self.status(f"Source capability list {found.capability_list} ({'; '.join(parts)})")

    async def close(self, *, unsubscribe: bool = False) -> None:
        if self.push is not None:
            await self.push.close(unsubscribe=unsubscribe)
            self.push = None
        if self.ctx is not None:
            await self.ctx.fetcher.close()
            await self.ctx.session.close()
        self.state.close()
        if self._lock_file is not None:
            self._lock_file.close()   # releases the flock
            self._lock_file = None

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
            self.events.emit(ev.GAP, kind="interval",
                             **{"from": format_datetime(result.gap_from) if result.gap_from else None,
                                "until": format_datetime(result.gap_until) if result.gap_until else None})
            self.status(f"gap: [{format_datetime(result.gap_from) if result.gap_from else '?'}, "
                        f"{format_datetime(result.gap_until) if result.gap_until else '?'}) not received; catching up")
            if not await self.recover("gap") and result.gap_until is not None:
                # Nothing can fill it: it stays reported; go on from the notification after it.
                self.state.set_high_water(result.gap_until, force=True)
                self._unrecoverable(result.gap_from, result.gap_until,
                                    "neither a Change List nor a Resource List reaches it")
        return "done"

    def exit_code(self) -> int:
        counts = self.state.counts_by_state()
        troubled = sum(counts.get(s, 0) for s in (FAILED, STALE, CONFLICT, REFUSED))
        if self.state.get("unrecoverable_gap") or troubled:
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
        code = self.exit_code()
        if code == EXIT_IN_SYNC and self.state.get("engine_state") != DEGRADED:
            # --once is the pull-only (cron) mode: between runs the copy is kept by polling
            self._set_state(POLLING)
        return code

    async def start_push(self) -> None:
        """Serve callbacks and make (or reuse) the subscription, before any pull, so nothing
        published meanwhile is missed."""
        if self.push_settings is None:
            return
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
        """Live until `stop` is set: push into the inbox, apply, catch up on every gap."""
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
        last_pull = last_subscribe = last_prune = time.monotonic()
        while not stop.is_set():
            self.wake.clear()
            try:
                if self._push_lost() and time.monotonic() - last_subscribe > self.poll_interval:
                    last_subscribe = time.monotonic()
                    if await self._resubscribe():
                        await self.recover("resubscribed")
                        self._go_live()
                        continue
                status = await self.drain_inbox()
                polling = self.push is None or self.push.subscription is None
                if time.monotonic() - last_pull > self.poll_interval and (polling or self._silent()):
                    await self.recover("poll")
                    last_pull = time.monotonic()
                    continue
            except (SourceUnreachableError, SourceDocumentError) as exc:
                self.status(f"the Source cannot be read ({exc}); retrying")
                self.events.emit(ev.DEGRADED, reason=str(exc))
                status = WAIT
            timeout = self.options.settle if status == WAIT else self.poll_interval
            await _wait_any(stop, self.wake, timeout)
            if time.monotonic() - last_prune > 3600:
                self.state.prune_inbox()   # applied deliveries are kept a day, then dropped
                last_prune = time.monotonic()
        return EXIT_IN_SYNC

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

    async def audit(self, *, deep: bool = False, repair: bool = False) -> AuditReport:
        assert self.ctx is not None
        report = await run_audit(self.ctx, deep=deep, repair=repair)
        self.events.emit(ev.AUDIT_DONE, **report.to_json())
        return report


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

"""What `rsnotify sync` and `rsnotify audit` do around the engine: signals, the stderr status
and progress lines, the --json event stream on stdout, exit codes, and `sync status`."""
from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from rsnotify.datetimes import format_datetime
from rsnotify.netguard import Network

from ..errors import SubscriberError
from ..settings import SubscriberSettings
from .context import SyncOptions
from .engine import EXIT_DIFFERENCES, EXIT_IN_SYNC, EXIT_UNREACHABLE, SyncEngine
from .events import SyncEvent
from .remote import SourceDocumentError, SourceUnreachableError
from .state import STATE_DIR, STATE_FILE, SyncState


@dataclass
class SyncCommand:
    root: Path
    source: str | None = None
    capability_list: str | None = None
    options: SyncOptions = field(default_factory=SyncOptions)
    allow_networks: tuple[Network, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    push: SubscriberSettings | None = None      # None: no callback server (--once)
    json_events: bool = False
    unsubscribe_on_exit: bool = False
    poll_interval: float = 60.0
    prog: str = "rsnotify sync"


class Reporter:
    """stderr status lines, the progress ticker, and the JSON event lines on stdout."""

    def __init__(self, prog: str, json_events: bool, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.prog = prog
        self.json_events = json_events
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.stdout_gone = False
        self.on_stdout_gone: Callable[[], None] = lambda: None

    def status(self, message: str) -> None:
        try:
            self.err.write(f"{self.prog}: {message}\n")
            self.err.flush()
        except (OSError, ValueError):
            pass

    def event(self, item: SyncEvent) -> None:
        if not self.json_events or self.stdout_gone:
            return
        try:
            self.out.write(json.dumps(item.to_json(), ensure_ascii=False, default=str) + "\n")
            self.out.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.stdout_gone = True
            self.status("stdout is closed: stopping")
            self.on_stdout_gone()

    async def tick(self, engine: SyncEngine) -> None:
        """A progress line per second on a terminal, every 10 s otherwise, while work runs."""
        every = 1.0 if self.err.isatty() else 10.0
        while True:
            await asyncio.sleep(every)
            progress = engine.ctx.progress if engine.ctx else None
            if progress is not None and progress.phase not in ("idle", "starting"):
                self.status(progress.line())


def _install_signals(stop: asyncio.Event, main: asyncio.Task[Any], reporter: Reporter) -> None:
    loop = asyncio.get_running_loop()
    hits = {"count": 0}

    def on_signal() -> None:
        hits["count"] += 1
        if hits["count"] == 1:
            reporter.status("stopping (again to stop at once)")
            stop.set()
        else:
            main.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)


async def run_sync(command: SyncCommand, *, once: bool) -> int:
    reporter = Reporter(command.prog, command.json_events)
    stop = asyncio.Event()
    main = asyncio.current_task()
    assert main is not None
    reporter.on_stdout_gone = stop.set
    engine = SyncEngine(command.root, source=command.source, capability_list=command.capability_list,
                        options=command.options, allow_networks=command.allow_networks,
                        allow_hosts=command.allow_hosts, push_settings=None if once else command.push,
                        status=reporter.status, poll_interval=command.poll_interval)
    engine.events.listeners.append(reporter.event)
    _install_signals(stop, main, reporter)
    ticker = asyncio.create_task(reporter.tick(engine))
    code = EXIT_IN_SYNC
    try:
        try:
            await engine.open()
        except (SourceUnreachableError, SourceDocumentError) as exc:
            return _source_failed(reporter, exc)
        if once:
            if stop.is_set():
                return EXIT_DIFFERENCES
            code = await engine.sync_once()
            reporter.status({EXIT_IN_SYNC: "in sync", EXIT_DIFFERENCES: "differences remain (see sync status)",
                             EXIT_UNREACHABLE: "the Source is unreachable"}.get(code, str(code)))
        else:
            try:
                code = await engine.run(stop)
            except SubscriberError as exc:   # e.g. the callback address is taken
                reporter.status(str(exc))
                return EXIT_DIFFERENCES
        if reporter.stdout_gone:
            code = EXIT_DIFFERENCES
        return code
    except asyncio.CancelledError:
        reporter.status("stopped at once")
        return EXIT_DIFFERENCES if once else EXIT_IN_SYNC
    finally:
        ticker.cancel()
        await engine.close(unsubscribe=command.unsubscribe_on_exit and not once)


def _source_failed(reporter: Reporter, exc: SourceUnreachableError | SourceDocumentError) -> int:
    """Say why the Source could not be read; the exit code: unreachable, or differences remain."""
    if isinstance(exc, SourceUnreachableError):
        reporter.status(f"the Source cannot be reached: {exc}")
        return EXIT_UNREACHABLE
    reporter.status(str(exc))
    return EXIT_DIFFERENCES


async def run_audit(command: SyncCommand, *, deep: bool, repair: bool) -> int:
    reporter = Reporter("rsnotify audit", command.json_events)
    engine = SyncEngine(command.root, source=command.source, capability_list=command.capability_list,
                        options=command.options, allow_networks=command.allow_networks,
                        allow_hosts=command.allow_hosts, status=reporter.status)
    engine.events.listeners.append(reporter.event)
    ticker = asyncio.create_task(reporter.tick(engine))
    try:
        try:
            await engine.open()
            if not engine.source_reachable:
                return EXIT_UNREACHABLE
            report = await engine.audit(deep=deep, repair=repair)
        except (SourceUnreachableError, SourceDocumentError) as exc:
            return _source_failed(reporter, exc)
        counts = (f"same {report.same:,}, missing {report.missing:,}, changed {report.changed:,}"
                  f"{f' (corrupt {report.corrupt:,})' if deep else ''}, extra {report.extra:,}, "
                  f"untracked {report.untracked:,}, newer locally {report.newer_locally:,}, "
                  f"unverifiable {report.unverifiable:,}")
        if repair:
            counts += f"; repaired {report.repaired:,}, repair failed {report.repair_failed:,}"
        reporter.status(f"{counts} (Resource List at {format_datetime(report.at) if report.at else '?'}, "
                        f"{report.seconds:.1f} s)")
        return EXIT_IN_SYNC if report.in_sync else EXIT_DIFFERENCES
    finally:
        ticker.cancel()
        await engine.close()


def status_of(root: Path) -> dict[str, Any] | None:
    """What `sync status` shows, read from the state database only; None without one."""
    path = root / STATE_DIR / STATE_FILE
    if not path.exists():
        return None
    state = SyncState(path)
    try:
        channel = state.channel()
        high_water = state.high_water
        lag = (datetime.now(UTC) - high_water).total_seconds() if high_water else None
        return {
            "dir": str(root),
            "state": channel.get("engine_state") or "new",
            "capability_list": channel.get("capability_list"),
            "resourcelist": channel.get("resourcelist_url"),
            "changelist": channel.get("changelist_url"),
            "high_water": format_datetime(high_water) if high_water else None,
            "lag_seconds": round(lag, 1) if lag is not None else None,
            "baseline_at": channel.get("baseline_at"),
            "last_sequences": state.last_sequences(),
            "resources": state.counts_by_state(),
            "inbox": state.inbox_counts(),
            "unrecoverable_gap": state.get_json("unrecoverable_gap"),
            "last_baseline": state.last_run("baseline"),
            "last_catchup": state.last_run("catchup"),
            "last_audit": state.last_run("audit"),
        }
    finally:
        state.close()


def format_status(info: dict[str, Any]) -> str:
    def when(run: dict[str, Any] | None) -> str:
        if not run:
            return "never"
        ended = datetime.fromtimestamp(run["ended"], UTC)
        return f"{format_datetime(ended.replace(microsecond=0))} ({run['outcome']}, {json.dumps(run['counts'])})"

    lag = info["lag_seconds"]
    lines = [
        f"dir: {info['dir']}",
        f"state: {info['state']}",
        f"capability list: {info['capability_list'] or '-'}",
        f"resource list: {info['resourcelist'] or '-'}; change list: {info['changelist'] or '-'}",
        f"high-water: {info['high_water'] or 'none'}" + (f" (lag {_duration(lag)})" if lag is not None else ""),
        "last sequence: " + (", ".join(f"{hub} {seq}" for hub, seq in info["last_sequences"].items()) or "-"),
        "resources: " + (", ".join(f"{k} {v:,}" for k, v in sorted(info["resources"].items())) or "none"),
        "inbox: " + (", ".join(f"{k} {v:,}" for k, v in sorted(info["inbox"].items())) or "empty"),
    ]
    gap = info["unrecoverable_gap"]
    if gap:
        lines.append(f"unrecoverable gap [{gap.get('from') or 'start'}, {gap.get('until') or 'now'}): {gap.get('reason')}")
    lines += [f"last baseline: {when(info['last_baseline'])}", f"last catch-up: {when(info['last_catchup'])}",
              f"last audit: {when(info['last_audit'])}"]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def saved_listen(root: Path) -> str | None:
    """The HOST:PORT the last live run listened on (so the callback URL stays the same)."""
    path = root / STATE_DIR / STATE_FILE
    if not path.exists():
        return None
    state = SyncState(path)
    try:
        return state.get("listen")
    finally:
        state.close()


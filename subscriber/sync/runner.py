"""What `rsnotify sync` and `rsnotify audit` do around the engine: signals, the stderr status
and progress lines, the --json event stream on stdout, exit codes, and `sync status`."""
from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import signal
import sqlite3
import sys
import tempfile
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
from .engine import (
    EXIT_DIFFERENCES,
    EXIT_IN_SYNC,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    NoSourceError,
    SyncEngine,
    audit_counts,
    lock_holder,
)
from .events import AUDIT_DONE as AUDIT_DONE_EVENT
from .events import DEGRADED as DEGRADED_EVENT
from .events import PLAN as PLAN_EVENT
from .events import SyncEvent
from .headers import Header, RequestRule, SourceHeaders
from .politeness import RateLimit
from .remote import SourceDocumentError, SourceUnreachableError
from .sink import write_problem
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
    audit_every: float | None = None            # --audit-every, in seconds
    prog: str = "rsnotify sync"
    headers: tuple[Header, ...] = field(default=(), repr=False)   # to the Source's origin only; may hold tokens
    timeout: float = 30.0          # seconds a request may wait to connect, or between two reads
    tries: int = 5                 # attempts per resource GET
    rate: float | None = None      # requests a second to one host at most (None: no limit)

    def engine(self, **mode: Any) -> SyncEngine:
        """A SyncEngine on DIR and the Source with this command's trust and request options
        (timeout, tries, the Source's headers, the rate); `mode`: what sync or audit adds."""
        source = self.source or self.capability_list
        rules: list[RequestRule] = []
        if self.rate is not None:   # first: a throttled request waits before anything is added to it
            rules.append(RateLimit(self.rate))
        if self.headers and source:
            rules.append(SourceHeaders(source, self.headers))
        return SyncEngine(self.root, source=self.source, capability_list=self.capability_list, options=self.options,
                          allow_networks=self.allow_networks, allow_hosts=self.allow_hosts,
                          request_timeout=self.timeout, tries=self.tries, rules=tuple(rules), **mode)


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
        if self.stdout_gone:
            return
        if self.json_events:
            line = json.dumps(item.to_json(), ensure_ascii=False, default=str)
        elif item.event == PLAN_EVENT:   # --dry-run in text mode: "fetch LOC -> PATH" / "delete LOC (PATH)"
            data = item.data
            line = (f"fetch {data['loc']} -> {data['path']}" if data["action"] == "fetch"
                    else f"delete {data['loc']} ({data['path']})")
        else:
            return
        try:
            self.out.write(line + "\n")
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


STOP_GRACE = 1.0        # seconds the work gets to end by itself after the first Ctrl-C/SIGTERM
CLOSE_TIMEOUT = 0.8     # closing the callback server and sessions, at most (more to unsubscribe)


class _Stopper:
    """First Ctrl-C/SIGTERM: set `stop`, and cancel the work if it has not ended STOP_GRACE
    later (a baseline or an audit in full swing); the state is committed batch by batch, so a
    cancel loses nothing the next start cannot redo cheaply. Second: cancel at once."""

    def __init__(self, stop: asyncio.Event, reporter: Reporter) -> None:
        self.stop = stop
        self.reporter = reporter
        self.hits = 0
        self.task: asyncio.Task[Any] | None = None

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.on_signal)

    def on_signal(self) -> None:
        self.hits += 1
        if self.hits == 1:
            self.reporter.status("stopping (again to stop at once)")
            self.stop.set()
            asyncio.get_running_loop().call_later(STOP_GRACE, self._cancel, self.task)
        else:
            self.reporter.status("stopping at once")
            self._cancel(self.task)

    @staticmethod
    def _cancel(task: asyncio.Task[Any] | None) -> None:
        if task is not None and not task.done():
            task.cancel()


def quiet_exit_on_signals(code: int) -> None:
    """After the event loop: a Ctrl-C while Python waits for worker threads exits at once with
    `code`, not with a KeyboardInterrupt traceback."""
    def exit_now(signum: int, frame: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, exit_now)


def disk_problem(exc: OSError | sqlite3.Error, root: Path) -> str:
    """One line naming the path and the cause of a local write/read failure."""
    if isinstance(exc, sqlite3.Error):
        # SQLite's own words ("unable to open database file") rarely say why: try a write beside
        # it, of a page (an empty file still fits on a full disk).
        folder = root / STATE_DIR
        try:
            with tempfile.TemporaryFile(dir=folder, buffering=0) as probe_file:
                probe_file.write(b"\0" * 4096)
        except OSError as probe:
            return f"{write_problem(probe, folder)} (state database: {exc})"
        return f"cannot use the state database {folder / STATE_FILE}: {exc}"
    return write_problem(exc, exc.filename or root)


async def run_sync(command: SyncCommand, *, once: bool) -> int:
    reporter = Reporter(command.prog, command.json_events)
    stop = asyncio.Event()
    stopper = _Stopper(stop, reporter)
    stopper.install()
    reporter.on_stdout_gone = stop.set
    try:
        engine = command.engine(push_settings=None if once else command.push, status=reporter.status,
                                poll_interval=command.poll_interval, audit_every=None if once else command.audit_every)
    except (OSError, sqlite3.Error) as exc:
        reporter.status(disk_problem(exc, command.root))
        return EXIT_DIFFERENCES
    engine.events.listeners.append(reporter.event)
    # The cycle collector took 5-7 % of a baseline's CPU (py-spy --native): every 700 new
    # objects it walked the hundred-odd requests in flight, and its full passes walked all that
    # the start made (modules, the engine), which lives until exit. Frozen, the start is never
    # walked again; a collection every 20,000 objects walks those in flight 30 times less often
    # (a cycle's garbage waits a little longer: a few MB at most).
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    ticker = asyncio.create_task(reporter.tick(engine))
    work = asyncio.create_task(_sync_work(engine, reporter, stop, once=once))
    stopper.task = work
    try:
        code = await asyncio.shield(work)
    except asyncio.CancelledError:
        # the work was cancelled by a stop (the shield keeps this task itself alive)
        code = EXIT_DIFFERENCES if once else EXIT_IN_SYNC
        reporter.status("stopped; the state is saved and the next start resumes")
    except (OSError, sqlite3.Error) as exc:
        # What reaches here is the state database or DIR itself (a resource's own disk error
        # is held back in its record and retried): going on would lose records, so stop.
        reporter.status(f"{disk_problem(exc, command.root)}; stopped, the next start resumes from the saved state")
        code = EXIT_DIFFERENCES
    finally:
        ticker.cancel()
    if reporter.stdout_gone:
        code = EXIT_DIFFERENCES
    closing = asyncio.create_task(engine.close(unsubscribe=command.unsubscribe_on_exit and not once))
    stopper.task = closing
    try:
        await asyncio.wait_for(asyncio.shield(closing), CLOSE_TIMEOUT * (6 if command.unsubscribe_on_exit else 1))
    except (TimeoutError, asyncio.CancelledError):
        closing.cancel()      # its finally still closes the state and frees the folder
        await asyncio.gather(closing, return_exceptions=True)
    except (OSError, sqlite3.Error) as exc:
        reporter.status(disk_problem(exc, command.root))
        code = EXIT_DIFFERENCES
    return code


async def _sync_work(engine: SyncEngine, reporter: Reporter, stop: asyncio.Event, *, once: bool) -> int:
    """Open (a live start retries an unreachable Source with backoff), then --once or live."""
    backoff = 1.0
    while True:
        try:
            await engine.open()
            break
        except SourceUnreachableError as exc:
            if once:
                return _source_failed(reporter, exc)
            reporter.status(f"the Source cannot be reached: {exc}; retrying in {backoff:.0f} s")
            engine.events.emit(DEGRADED_EVENT, reason=str(exc))
            try:
                await asyncio.wait_for(stop.wait(), backoff)
                return EXIT_IN_SYNC
            except TimeoutError:
                backoff = min(backoff * 2, 300.0)
        except SourceDocumentError as exc:
            return _source_failed(reporter, exc)
    if once:
        if stop.is_set():
            return EXIT_DIFFERENCES
        code = await engine.sync_once()
        reporter.status({EXIT_IN_SYNC: "in sync", EXIT_DIFFERENCES: "differences remain (see sync status)",
                         EXIT_UNREACHABLE: "the Source is unreachable"}.get(code, str(code)))
        return code
    try:
        return await engine.run(stop)
    except SubscriberError as exc:   # e.g. the callback address is taken
        reporter.status(str(exc))
        return EXIT_DIFFERENCES


def _source_failed(reporter: Reporter, exc: SourceUnreachableError | SourceDocumentError) -> int:
    """Say why the Source could not be read; the exit code: unreachable, or differences remain."""
    if isinstance(exc, SourceUnreachableError):
        reporter.status(f"the Source cannot be reached: {exc}")
        return EXIT_UNREACHABLE
    reporter.status(str(exc))
    return EXIT_USAGE if isinstance(exc, NoSourceError) else EXIT_DIFFERENCES


async def run_audit(command: SyncCommand, *, deep: bool, repair: bool) -> int:
    """Audit DIR. Beside a running sync it only reads; `--repair` then asks that sync to audit
    and repair (a request row it picks up), waits for its answer, and takes the folder itself
    only if the sync ends before taking the request.

    Ctrl-C or SIGTERM cancels it (the hashing threads stop between files, the state and the
    folder are closed): one "interrupted" line and exit 128 + the signal, never 1, which would
    read as "differences"."""
    reporter = Reporter("rsnotify audit", command.json_events)
    work = asyncio.create_task(_audit_work(command, reporter, deep=deep, repair=repair))
    loop = asyncio.get_running_loop()
    caught: list[int] = []

    def interrupt(signum: int) -> None:
        if not caught:
            reporter.status("interrupted")
        caught.append(signum)
        work.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupt, signum)
    try:
        return await work
    except asyncio.CancelledError:
        if not caught:
            raise
        return 128 + caught[0]
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def _audit_work(command: SyncCommand, reporter: Reporter, *, deep: bool, repair: bool) -> int:
    try:
        engine = command.engine(status=reporter.status)
    except (OSError, sqlite3.Error) as exc:
        reporter.status(disk_problem(exc, command.root))
        return EXIT_DIFFERENCES
    engine.events.listeners.append(reporter.event)
    ticker = asyncio.create_task(reporter.tick(engine))
    try:
        if repair and lock_holder(command.root) is not None:
            handed = await _hand_repair(engine, reporter, deep=deep)
            if handed is not None:
                return handed
        try:
            await engine.open(shared=not repair)
            if not engine.source_reachable:
                reporter.status("the Source cannot be reached: nothing was audited")  # the verdict line
                return EXIT_UNREACHABLE
            if engine.read_only:
                reporter.status(f"{command.root} is owned by a running sync: auditing it read-only")
            report = await engine.audit(deep=deep, repair=repair)
        except (SourceUnreachableError, SourceDocumentError) as exc:
            return _source_failed(reporter, exc)
        reporter.status(f"{audit_counts(report, deep=deep, repair=repair)} (Resource List at "
                        f"{format_datetime(report.at) if report.at else '?'}, {report.seconds:.1f} s)")
        return EXIT_IN_SYNC if report.in_sync else EXIT_DIFFERENCES
    except (OSError, sqlite3.Error) as exc:
        reporter.status(disk_problem(exc, command.root))
        return EXIT_DIFFERENCES
    finally:
        ticker.cancel()
        await engine.close()


async def _hand_repair(engine: SyncEngine, reporter: Reporter, *, deep: bool) -> int | None:
    """Ask the sync that holds the folder to audit and repair it; its exit code, or None when
    the folder came free before the answer (the caller then repairs it itself). It waits while
    the sync is busy (a baseline under way); it never answers "busy" with an exit code."""
    holder = lock_holder(engine.root)
    request_id = engine.state.add_request("audit", {"deep": deep, "repair": True})
    reporter.status(f"{engine.root} is owned by a running sync ({holder}): asked it to audit and repair")
    announced = False
    while True:
        taken, result = engine.state.request_result(request_id)
        if result is not None:
            return _handed_result(reporter, result, deep=deep)
        if taken and not announced:
            reporter.status("the running sync is auditing")
            announced = True
        if not taken and lock_holder(engine.root) is None and engine.state.withdraw_request(request_id):
            reporter.status("the sync ended before taking the request: repairing here")
            return None
        if taken and lock_holder(engine.root) is None:
            reporter.status("the sync stopped before finishing the repair: repairing here")
            return None
        await asyncio.sleep(0.2)


def _handed_result(reporter: Reporter, result: dict[str, Any], *, deep: bool) -> int:
    if "error" in result:
        reporter.status(f"the running sync could not audit: {result['error']}")
        return EXIT_UNREACHABLE if result.get("unreachable") else EXIT_DIFFERENCES
    from .audit import AuditReport   # here: `rsnotify sync` audits nothing
    data = result["report"]
    report = AuditReport(**{k: v for k, v in data.items() if k in _REPORT_COUNTS})
    reporter.event(SyncEvent(AUDIT_DONE_EVENT, {"trigger": "request", "deep": deep, **data}))
    reporter.status(f"{audit_counts(report, deep=deep, repair=True)} (by the running sync; Resource List at "
                    f"{data.get('at') or '?'}, {data.get('seconds', 0):.1f} s)")
    return EXIT_IN_SYNC if result.get("in_sync") else EXIT_DIFFERENCES


_REPORT_COUNTS = ("listed", "same", "missing", "changed", "extra", "untracked", "newer_locally", "pending", "unapplied",
                  "unverifiable", "corrupt", "escaped", "symlinks", "conflicts", "excluded", "repaired", "repair_failed",
                  "seconds")


def parse_duration(text: str) -> float:
    """Seconds from "90", "90s", "15m", "2h" or "1d"; ValueError otherwise."""
    value = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600, "d": 86_400}.get(value[-1:], None)
    number = value[:-1] if scale else value
    seconds = float(number) * (scale or 1)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return seconds


def status_of(root: Path) -> dict[str, Any] | None:
    """What `sync status` shows, read from the state database only; None without one."""
    path = root / STATE_DIR / STATE_FILE
    if not path.exists():
        return None
    state = SyncState(path)
    try:
        channel = state.channel()
        high_water = state.high_water
        # Lag on the Source's clock: how far the copy is behind the Source's last known change
        # (0 when an idle Source is fully applied), never the local clock minus H.
        latest = state.source_latest()
        lag = max(0.0, (latest - high_water).total_seconds()) if high_water and latest else None
        return {
            "dir": str(root),
            "state": channel.get("engine_state") or "new",
            "capability_list": channel.get("capability_list"),
            "resourcelist": channel.get("resourcelist_url"),
            "changelist": channel.get("changelist_url"),
            "high_water": format_datetime(high_water) if high_water else None,
            "source_latest": format_datetime(latest) if latest else None,
            "lag_seconds": round(lag, 1) if lag is not None else None,
            "hub_epochs": state.get_json("hub_epochs") or {},
            "baseline_at": channel.get("baseline_at"),
            "last_sequences": state.last_sequences(),
            "resources": _counts_with_holders(state),
            "inbox": state.inbox_counts(),
            "unrecoverable_gap": state.get_json("unrecoverable_gap"),
            "last_baseline": state.last_run("baseline"),
            "last_catchup": state.last_run("catchup"),
            "last_audit": state.last_run("audit"),
            **state.problem_summary(),
        }
    finally:
        state.close()


def _counts_with_holders(state: SyncState) -> dict[str, int]:
    """Records by state, where a loc that keeps a path another loc maps to counts as a
    `conflict` too (its file is kept; both sides of the collision are shown)."""
    counts = state.counts_by_state()
    holders = state.count_conflict_holders()
    if holders:
        counts["conflict"] = counts.get("conflict", 0) + holders
        counts["ok"] = counts.get("ok", 0) - holders
        if not counts["ok"]:
            del counts["ok"]
    return counts


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
        f"high-water: {info['high_water'] or 'none'}" + (f" (lag {_duration(lag)} behind the Source's last known "
                                                         f"change {info['source_latest']})" if lag is not None else ""),
        "last sequence: " + (", ".join(f"{hub} {seq}" for hub, seq in info["last_sequences"].items()) or "-")
        + "".join(f" ({hub}: numbering restarted {e['count']}x, last at {e['restarted_at']} after {e['after']})"
                  for hub, e in info.get("hub_epochs", {}).items()),
        "resources: " + (", ".join(f"{k} {v:,}" for k, v in sorted(info["resources"].items())) or "none"),
        "inbox: " + (", ".join(f"{k} {v:,}" for k, v in sorted(info["inbox"].items())) or "empty"),
    ]
    gap = info["unrecoverable_gap"]
    if gap:
        lines.append(f"unrecoverable gap [{gap.get('from') or 'start'}, {gap.get('until') or 'now'}): {gap.get('reason')}")
    lines += problem_lines(info)
    lines += [f"last baseline: {when(info['last_baseline'])}", f"last catch-up: {when(info['last_catchup'])}",
              f"last audit: {when(info['last_audit'])}"]
    return "\n".join(lines)


def problem_lines(info: dict[str, Any]) -> list[str]:
    """Escaped names, refusals and the resources not ok (with why), for the text status."""
    lines = [f"escaped names: {info['escaped_names']:,}",
             "refused: " + (", ".join(f"{rule} {n:,}" for rule, n in sorted(info["refusals"].items())) or "none")]
    for item in info["last_refusals"][-5:]:
        lines.append(f"  refused ({item['rule']}): {item['loc']}: {item['detail']}")
    for item in info["troubled"]:
        retry = item["next_retry_at"]
        lines.append(f"  {item['state']}: {item['loc']}: {item['error'] or '-'}"
                     + (f" (try {item['attempts']}, next in {_duration(retry - datetime.now(UTC).timestamp())})"
                        if retry else ""))
    return lines


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


"""Bounded polls for work another thread or process does (a hub, a worker, a server thread):
there is no event to wait on, so poll a condition; on timeout say what never happened."""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# pytest-timeout's bound for a test that drives a whole system of real processes (a Source, a hub,
# syncs, Sentinels) through a minute of work on a quiet machine: pyproject's 120 s, a guard against
# hangs sized for the rest, was reached at load 19 on 2 cores by tests that passed there, their
# waits all for state. Mark such a module `pytestmark = pytest.mark.timeout(LONG_TEST_TIMEOUT)`.
LONG_TEST_TIMEOUT = 360


def wait_until(condition: Callable[[], T], timeout: float = 30.0, what: str = "the condition",
               logs: Iterable[Path] | Path = ()) -> T:
    """Poll `condition` until it is true and return what it gave; on timeout fail with `what` and
    the tail of each log (a directory: its *.log files then), so a failure shows what the processes
    said. The polls start 20 ms apart and grow to 100 ms: a quick answer is seen at once, and a long
    wait does not keep a hub busy answering (most conditions are HTTP requests to one)."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{log_tails(logs)}")
        time.sleep(pause)
        pause = min(pause * 1.5, 0.1)
    return result


async def eventually(condition: Callable[[], T], timeout: float = 30.0, what: str = "the condition",
                     logs: Iterable[Path] | Path = ()) -> T:
    """`wait_until` for async tests: the loop keeps running (in-loop servers go on answering)."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{log_tails(logs)}")
        await asyncio.sleep(0.02)
    return result


def log_tails(logs: Iterable[Path] | Path, chars: int = 3000) -> str:
    if isinstance(logs, Path):
        logs = sorted(logs.glob("*.log"))
    return "".join(f"\n--- {path.name}\n{path.read_text(errors='replace')[-chars:]}"
                   for path in logs if path.exists())


def slowdown() -> float:
    """How many times longer than on an idle machine a wall-clock step may take now: the processes
    that want a core per core (the 1-minute load average, or the count runnable this moment when
    higher), at least 1. On 2 cores at load 20 a process gets a tenth of a core, so an answer
    that takes 0.1 s on a quiet machine takes about 1 s there."""
    running = 0.0
    try:
        running = float(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):      # not Linux: the load average alone
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1.0, max(os.getloadavg()[0], running) / cores)


def loaded(seconds: float) -> float:
    """`seconds`, a bound on a quiet machine, stretched by `slowdown()`: what a check of "answered
    within N s" allows on the machine as loaded as it is now (measure after the step, so the load
    that slowed it counts). Quiet, it is `seconds` exactly; a hang stays a failure at any load."""
    return seconds * slowdown()

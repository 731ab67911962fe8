"""A clock a test controls: injected wherever the code takes `now` (leases, retries, renewals,
signature windows), so no test sleeps to make time pass."""
from __future__ import annotations

import time
from datetime import datetime, timedelta

# A fixed instant (2023-11-14 22:13:20 UTC), so stored timestamps are the same in every run.
EPOCH = 1_700_000_000.0


class Clock:
    """Reads epoch seconds (a float), or datetimes when started at a datetime.

    `Clock()` stands still at EPOCH until the test moves it; `Clock(start, tick=1.0)` also moves
    `tick` seconds after each reading; `Clock.real()` follows `time.time()`. `advance(seconds)`
    moves any of them on; `set(instant)` jumps to an instant of the kind the clock reads.
    """

    def __init__(self, start: float | datetime = EPOCH, *, tick: float = 0.0) -> None:
        self.start = start
        self.elapsed = 0.0          # seconds added since the start (by advance, set and ticks)
        self.tick = tick
        self.follows_real_time = False

    @classmethod
    def real(cls) -> Clock:
        """Real time plus what the test adds: for code that also waits on real timers."""
        clock = cls(0.0)
        clock.follows_real_time = True
        return clock

    def __call__(self):  # type: ignore[no-untyped-def]  # float or datetime, as started
        value = self.peek()
        self.elapsed += self.tick
        return value

    def peek(self):  # type: ignore[no-untyped-def]
        """The reading, without a tick."""
        if self.follows_real_time:
            return time.time() + self.elapsed
        if isinstance(self.start, datetime):
            return self.start + timedelta(seconds=self.elapsed)
        return self.start + self.elapsed

    def advance(self, seconds: float) -> None:
        self.elapsed += seconds

    def set(self, instant: float | datetime) -> None:
        """Jump to `instant`; it must be the kind this clock reads."""
        if isinstance(self.start, datetime) != isinstance(instant, datetime):
            raise TypeError(f"this clock reads {type(self.peek()).__name__}s; set() got {instant!r}")
        if isinstance(instant, datetime):
            self.elapsed = (instant - self.start).total_seconds()    # type: ignore[operator]
        else:
            self.elapsed += instant - self.peek()

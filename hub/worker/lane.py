"""A worker's verification lane as data: its slots, the challenges it holds (by callback host),
and the bell that wakes it. verifying.py runs it; the worker context holds one."""
from __future__ import annotations

import asyncio
from collections import Counter


class VerificationLane:
    """This worker's verification lane: its slots, what it holds, and the bell that wakes it."""

    def __init__(self, wid: str, concurrency: int) -> None:
        self.wid = wid
        self.slots = asyncio.Semaphore(concurrency)
        self.held = 0
        self.sent_back = 0           # challenges put back in line since the lane last looked
        self.by_host: Counter[str] = Counter()
        self.bell = asyncio.Event()
        self.room = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @property
    def is_running(self) -> bool:
        return self.task is not None and not self.task.done()

    def wake(self) -> None:
        self.bell.set()

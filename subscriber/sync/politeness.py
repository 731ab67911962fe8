"""`rsnotify sync/audit --rate N`: at most N requests a second to any one host (scheme, host,
port), as a harvester's politeness. A RequestRule (sync/headers.py), applied by the aiohttp
session of the Source's lists and by the fetcher's client of its resources, so the lists, the
resources and each redirect hop all count, against one schedule. No I/O here beyond waiting.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, MutableMapping

from .headers import Origin, RequestRule, origin


class RateLimit(RequestRule):
    """Requests to one origin start at least 1/`rate` seconds apart (concurrent ones queue up)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = 1.0 / rate
        self.clock = clock
        self.next_start: dict[Origin, float] = {}

    async def apply(self, url: str, headers: MutableMapping[str, str]) -> None:
        key = origin(url)
        now = self.clock()
        # Reserve the slot before waiting, so concurrent requests line up instead of all waking at once.
        start = max(now, self.next_start.get(key, now))
        self.next_start[key] = start + self.interval
        if start > now:
            await asyncio.sleep(start - now)


__all__ = ["RateLimit"]

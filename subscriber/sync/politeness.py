"""`rsnotify sync/audit --rate N`: at most N requests a second to any one host (scheme, host,
port), as a harvester's politeness. An aiohttp client middleware, so the Source's lists, its
resources and each redirect hop all count. No I/O here beyond waiting.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import (
    ClientHandlerType,
    ClientMiddlewareType,
    ClientRequest,
    ClientResponse,
)

from .headers import Origin, origin


def rate_limit_middleware(rate: float, clock: Callable[[], float] = time.monotonic) -> ClientMiddlewareType:
    """Requests to one origin start at least 1/`rate` seconds apart (concurrent ones queue up)."""
    interval = 1.0 / rate
    next_start: dict[Origin, float] = {}

    async def throttle(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        key = origin(str(request.url))
        now = clock()
        # Reserve the slot before waiting, so concurrent requests line up instead of all waking at once.
        start = max(now, next_start.get(key, now))
        next_start[key] = start + interval
        if start > now:
            await asyncio.sleep(start - now)
        return await handler(request)

    return throttle


__all__ = ["rate_limit_middleware"]

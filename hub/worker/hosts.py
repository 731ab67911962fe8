"""Per-callback-host caps: one worker has at most `host_concurrency` requests (deliveries and
verifications) in flight to one callback host (host:port), so one host's hanging or black-hole
endpoints can hold only their share of the worker, never every slot.

Waiting for a host costs nothing but a future: callers take their lane's slot only once the
host lets them in (see fanout._attempt and lanes.verify_taken). No I/O here.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from yarl import URL


def host_of(url: URL | str) -> str:
    """The callback host a request goes to: host:port (an origin, so two ports are two hosts)."""
    parsed = url if isinstance(url, URL) else URL(url)
    return f"{parsed.host or ''}:{parsed.port or ''}"


class HostGates:
    """Admits at most `cap` requests per host at once; the others wait their turn, in order."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._busy: dict[str, int] = {}
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}

    def is_open(self, host: str) -> bool:
        """True when `enter(host)` would not wait."""
        return self._busy.get(host, 0) < self.cap and not self._waiters.get(host)

    def waiting(self, host: str) -> int:
        return len(self._waiters.get(host, ()))

    async def enter(self, host: str) -> None:
        if self.is_open(host):
            self._busy[host] = self._busy.get(host, 0) + 1
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(host, deque()).append(future)
        try:
            await future                 # `leave` hands its place over: the busy count stays
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.leave(host)         # admitted just as we were cancelled: pass the place on
            else:
                waiters = self._waiters.get(host)
                if waiters is not None and future in waiters:
                    waiters.remove(future)
                    if not waiters:
                        del self._waiters[host]
            raise

    def leave(self, host: str) -> None:
        waiters = self._waiters.get(host)
        while waiters:
            future = waiters.popleft()
            if not waiters:
                del self._waiters[host]
            if not future.done():
                future.set_result(None)
                return
            waiters = self._waiters.get(host)
        count = self._busy.get(host, 0) - 1
        if count > 0:
            self._busy[host] = count
        else:
            self._busy.pop(host, None)

    @asynccontextmanager
    async def hold(self, host: str) -> AsyncIterator[None]:
        await self.enter(host)
        try:
            yield
        finally:
            self.leave(host)

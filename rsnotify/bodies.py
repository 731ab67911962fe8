"""A response body read under a size bound, chunk by chunk, the one loop every role's client
shares (discovery, `rsnotify inspect`, `rsnotify validate URL`, the sync engine's lists; its
resources come through rsnotify.outbound, which bounds them itself). Each caller keeps its own words for "too large": the bound is theirs, the loop is not.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp

CHUNK_BYTES = 256 * 1024
# bytes/s a body must average over each window of `window` seconds (the read timeout): aiohttp's
# sock_read bounds only the gap between two reads, so a server sending a byte every window - 1 s
# held the reader for as long as the body is long (a 50 MB list: over a year). With this floor a
# document ends within about its size / MIN_RATE; a slow but real link (5 KiB/s) is never cut.
# The same floor as the sync's resource GETs (sync/fetcher.py).
MIN_RATE = 1024.0
DEFAULT_WINDOW = 30.0


async def bounded_chunks(response: aiohttp.ClientResponse, limit: int,
                         too_large: Callable[[int], BaseException], *,
                         window: float | None = None) -> AsyncIterator[bytes]:
    """The body of `response` to its end, a chunk at a time (StreamReader.read(n) stops at what
    is buffered, often 64 KiB); raises `too_large(size)` as soon as more than `limit` bytes came,
    before that chunk is yielded, and aiohttp.ServerTimeoutError (a TimeoutError and a
    ClientError: what a read timeout raises) when a window of `window` seconds (default 30)
    brought fewer than MIN_RATE bytes a second."""
    window = window or DEFAULT_WINDOW
    size = 0
    window_start, window_size = time.monotonic(), 0
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise too_large(size)
        now = time.monotonic()
        if now - window_start >= window:
            if size - window_size < MIN_RATE * (now - window_start):
                raise aiohttp.ServerTimeoutError(
                    f"the answer came at under {MIN_RATE:g} bytes/s for {window:g} s or more "
                    f"(too slow; {size} bytes of it came)")
            window_start, window_size = now, size
        yield chunk


async def head_within(get: Awaitable[aiohttp.ClientResponse], redirects: int,
                      window: float | None = None) -> aiohttp.ClientResponse:
    """The answer of `get` (a GET that follows up to `redirects` redirects) once its head came,
    within one read window (`window`, default 30 s) per hop and one to spare: aiohttp's sock_read
    bounds only the gap between two reads, so a head dripped a byte at a time held the reader for
    hours. A real server's head comes at once when its answer is ready. Past that deadline,
    aiohttp.ServerTimeoutError saying so; a read timeout of `get`'s own is raised as it is."""
    deadline = (redirects + 2) * (window or DEFAULT_WINDOW)
    timer = asyncio.timeout(deadline)
    try:
        async with timer:
            return await get
    except TimeoutError:
        if not timer.expired():
            raise
        raise aiohttp.ServerTimeoutError(f"the answer's head did not come within {deadline:g} s (too slow)") from None

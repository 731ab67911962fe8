"""A response body read under a size bound, chunk by chunk, the one loop every role's client
shares (discovery, `rsnotify inspect`, `rsnotify validate URL`, the sync engine's lists; its
resources come through rsnotify.outbound, which bounds them itself). Each caller keeps its own words for "too large": the bound is theirs, the loop is not.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp

CHUNK_BYTES = 256 * 1024


async def bounded_chunks(response: aiohttp.ClientResponse, limit: int,
                         too_large: Callable[[int], BaseException]) -> AsyncIterator[bytes]:
    """The body of `response` to its end, a chunk at a time (StreamReader.read(n) stops at what
    is buffered, often 64 KiB); raises `too_large(size)` as soon as more than `limit` bytes came,
    before that chunk is yielded."""
    size = 0
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise too_large(size)
        yield chunk

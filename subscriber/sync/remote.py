"""Reading a Source's lists over HTTP (on the guarded session of sync/session.py): each document
is streamed to a temp file (bounded), then read with `rsnotify.lists.open_list` in a worker
thread, a chunk of entries at a time, so memory stays flat however many resources it has.
"""
from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, BinaryIO, cast
from urllib.parse import urlsplit

import aiohttp

from rsnotify.bodies import bounded_chunks, head_within
from rsnotify.errors import DocumentParseError
from rsnotify.lists import Entry, ListInfo, ListStream, open_list

from .fetcher import MAX_REDIRECTS, RedirectRefusedError, get_in_origin
from .headers import origin

__all__ = ["ListOrigins", "RemoteList", "SourceDocumentError", "SourceUnreachableError"]

MAX_LIST_BYTES = 52_428_800 + 1_048_576   # the Sitemap limit, with room for an XML prologue
_SPOOL = 1_048_576


class SourceUnreachableError(Exception):
    """A Source document could not be fetched (connection, timeout, 5xx, 429)."""


class SourceDocumentError(Exception):
    """A Source document was fetched but is not usable (4xx, not a list, too big)."""


class ListOrigins:
    """Where the Source's lists may be: the origin (scheme, host, port) of its Capability List,
    which is the Source, or a host the user named with --allow-host. A list elsewhere (named by
    the Capability List, an index, a Source Description) is refused before it is read: what it
    lists would decide what the copy takes and, in a baseline or an audit's repair, what it
    deletes, and the Source cannot vouch for another server's documents."""

    def __init__(self, capability_list: str, allowed_hosts: Iterable[str] | None) -> None:
        self.source = origin(capability_list)
        self.allowed_hosts = None if allowed_hosts is None else frozenset(allowed_hosts)   # None: any

    def refusal(self, url: str) -> str | None:
        """Why the list at `url` is refused, or None."""
        try:
            scheme, host, port = where = origin(url)
        except ValueError:
            return "it has no valid host and port"
        if where == self.source or self.allowed_hosts is None or host in self.allowed_hosts \
                or f"{host}:{port}" in self.allowed_hosts:
            return None
        own_scheme, own_host, own_port = self.source
        return (f"it is on another origin ({scheme}://{host}:{port}) than the Source's Capability List "
                f"({own_scheme}://{own_host}:{own_port}); if it is the Source's, allow it with "
                f"--allow-host {host}:{port}")


class RemoteList:
    """One downloaded list document. `info` is its head; `chunks()` yields its entries."""

    def __init__(self, url: str, file: IO[bytes], stream: ListStream, entries_hint: int,
                 thread: ThreadPoolExecutor) -> None:
        self.url = url
        self._thread = thread
        self.info: ListInfo = stream.info
        self.entries_hint = entries_hint      # '<url>'/'<sitemap>' tags counted while downloading
        self._file = file
        self._stream = stream

    @classmethod
    async def open(cls, session: aiohttp.ClientSession, url: str, what: str,
                   origins: ListOrigins | None = None) -> RemoteList:
        """Download the list at `url`; with `origins`, one on another origin is refused first."""
        if urlsplit(url).scheme.lower() not in ("http", "https"):
            # a Capability List or index naming file:, ftp: or javascript: is the Source's
            # mistake (exit 1), not an outage: aiohttp's error for it named only the URL
            raise SourceDocumentError(f"{what} {url[:200]!r} is not an http or https URL; refused")
        refused = origins.refusal(url) if origins is not None else None
        if refused is not None:
            raise SourceDocumentError(f"{what} {url[:200]} refused: {refused}")
        file = tempfile.SpooledTemporaryFile(max_size=_SPOOL)  # noqa: SIM115 - closed by RemoteList.close
        count = 0
        tail = b""
        try:
            async with await head_within(get_in_origin(session, url), MAX_REDIRECTS,
                                         session.timeout.sock_read) as response:
                if response.status >= 500 or response.status == 429:
                    raise SourceUnreachableError(f"{what} {url} answered {response.status}")
                if response.status != 200:
                    raise SourceDocumentError(f"{what} {url} answered {response.status}; expected 200")
                async for chunk in bounded_chunks(response, MAX_LIST_BYTES, lambda _: SourceDocumentError(
                        f"{what} {url} is larger than {MAX_LIST_BYTES} bytes"), window=session.timeout.sock_read):
                    window = tail + chunk
                    count += window.count(b"<url>") + window.count(b"<sitemap>") \
                        - tail.count(b"<url>") - tail.count(b"<sitemap>")
                    tail = window[-9:]
                    file.write(chunk)
        except RedirectRefusedError as exc:
            file.close()
            raise SourceDocumentError(f"{what} {exc}") from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            file.close()
            raise SourceUnreachableError(f"cannot fetch {what} {url}: {exc or type(exc).__name__}") from exc
        except BaseException:
            file.close()
            raise
        file.seek(0)
        # lxml parsers belong to the thread that made them: one thread reads this list throughout.
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rsnotify-list")
        try:
            stream = await asyncio.get_running_loop().run_in_executor(thread, open_list, cast(BinaryIO, file))
        except DocumentParseError as exc:
            file.close()
            thread.shutdown(wait=False)
            raise SourceDocumentError(f"{what} {url} cannot be read: {exc}") from exc
        return cls(url, file, stream, count, thread)

    async def chunks(self, size: int = 1000) -> AsyncIterator[list[Entry]]:
        try:
            while True:
                chunk = await asyncio.get_running_loop().run_in_executor(self._thread, self._stream.take, size)
                if not chunk:
                    return
                yield chunk
        except DocumentParseError as exc:
            raise SourceDocumentError(f"{self.url} cannot be read: {exc}") from exc
        finally:
            self.close()

    def close(self) -> None:
        self._file.close()
        self._thread.shutdown(wait=False)


"""What `OutboundClient.open()` hands back: an answer's status and header fields, then its body,
read whole or streamed to the caller's writer in chunks, with the content coding (gzip, deflate)
undone and the decoded bytes bounded, so a compression bomb is cut where a plain body would be.

No pooling or connecting here (outbound.py), no parsing (outbound_wire.py). The errors a caller
of `open()` handles are defined here, so it needs neither of the other two modules for them.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any, Self

from .outbound_wire import HeadedConnection


class RequestFailedError(Exception):
    """A request got no HTTP answer, or its body broke off: a connection error, a timeout, a
    refused address (`is_refused`: the message is then rsnotify.netguard's alone)."""

    def __init__(self, message: str, *, is_refused: bool = False) -> None:
        super().__init__(message)
        self.is_refused = is_refused


class BodyTooLongError(Exception):
    """A body (decoded) ran past the caller's limit; `received` bytes of it had come, more than
    the limit; the rest is not read."""

    def __init__(self, received: int, limit: int) -> None:
        super().__init__(f"the body is over {limit} bytes (more than {received} came)")
        self.received = received
        self.limit = limit


class ContentEncodingError(Exception):
    """An answer's Content-Encoding is not one we decode (identity, gzip, x-gzip, deflate), or its
    coded body is corrupt."""


class _Decoder:
    """gzip (several members too) or deflate (zlib-wrapped, or raw as some servers send it)."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._inflater: Any = zlib.decompressobj(zlib.MAX_WBITS | 16) if coding == "gzip" else None

    def decode(self, data: bytes, limit: int) -> bytes:
        """Up to `limit` bytes decoded from `data` plus what an earlier call left; more than
        `limit` only to say it went past (never more than limit + 1 held)."""
        if self._inflater is None:              # deflate: the first bytes tell which form
            wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._inflater = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        out: list[bytes] = []
        size = 0
        try:
            while data and size <= limit:
                inflater = self._inflater
                piece = inflater.decompress(data, limit + 1 - size)
                out.append(piece)
                size += len(piece)
                data = inflater.unconsumed_tail
                if inflater.eof and inflater.unused_data:
                    if self.coding != "gzip":
                        break                   # bytes after a deflate stream: ignored, as zlib does
                    data = inflater.unused_data  # the next gzip member
                    self._inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        except zlib.error as exc:
            raise ContentEncodingError(f"its {self.coding} body is corrupt ({exc})") from None
        return b"".join(out)

    def is_done(self) -> bool:
        return self._inflater is not None and bool(self._inflater.eof)


def decoder_for(content_encoding: str) -> _Decoder | None:
    """None for an uncoded body; ContentEncodingError for a coding we do not decode."""
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in ("gzip", "x-gzip"):
        return _Decoder("gzip")
    if coding == "deflate":
        return _Decoder("deflate")
    raise ContentEncodingError(f"Content-Encoding {content_encoding.strip()[:40]!r} is not one rsnotify decodes "
                               "(gzip, deflate)")


class Response:
    """One answer from `OutboundClient.open()`: `status`, `headers` (names in lower case), then
    the body by `read()` or `stream()`, once. Always `close()` it (or use `async with`): the
    connection goes back to the pool when its body was read to the end, else it is closed."""

    __slots__ = ("_conn", "_describe", "_release", "_used", "headers", "status")

    def __init__(self, conn: HeadedConnection, release: Callable[[HeadedConnection], None],
                 describe: Callable[[HeadedConnection], str]) -> None:
        assert conn.status is not None
        self.status: int = conn.status
        self.headers: dict[str, str] = conn.headers
        self._conn: HeadedConnection | None = conn
        self._release = release
        self._describe = describe        # why an exchange ended without its whole answer
        self._used = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._release(conn)

    async def read(self, limit: int) -> bytes:
        """The whole body, decoded; BodyTooLongError past `limit` decoded bytes,
        ContentEncodingError, RequestFailedError if it broke off."""
        conn = self._conn
        if (conn is not None and not self._used and conn.is_complete and not conn.is_stopped
                and "content-encoding" not in self.headers):
            # the usual small resource: its whole body came with the head, uncoded
            self._used = True
            body = conn.body
            self.close()
            if len(body) > limit:
                raise BodyTooLongError(len(body), limit)
            return body
        parts: list[bytes] = []
        await self.stream(parts.append, limit)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def stream(self, write: Callable[[bytes], object], limit: int) -> int:
        """Hand the body, decoded, to `write` chunk by chunk as it comes (on the event loop: a
        `write` that blocks holds the loop); the number of bytes written. Errors as `read()`,
        and any exception of `write` itself; the connection is released either way."""
        conn = self._conn
        if conn is None or self._used:
            raise RuntimeError("the body of this answer was read already or the answer is closed")
        self._used = True
        try:
            decoder = decoder_for(self.headers.get("content-encoding", ""))
            return await self._pump(conn, write, limit, decoder)
        finally:
            self.close()

    async def _pump(self, conn: HeadedConnection, write: Callable[[bytes], object], limit: int,
                    decoder: _Decoder | None) -> int:
        size = 0
        over = False
        problem: BaseException | None = None

        def sink(data: bytes) -> bool:
            # Runs inside the parser's callback: it must not raise (httptools would turn any
            # exception into "invalid answer"), so whatever `write` or the decoder raises, a bug
            # included, is kept and raised as it is once the exchange is over.
            nonlocal size, over, problem
            try:
                if decoder is not None:
                    data = decoder.decode(data, limit - size)
                if size + len(data) > limit:
                    over = True
                    size += len(data)
                    return False
                size += len(data)
                if data:
                    write(data)
            except Exception as exc:  # noqa: BLE001 - re-raised below, never swallowed
                problem = exc
                return False
            return True

        waiter = conn.waiter
        conn.attach(sink)
        if waiter is not None and not waiter.done():
            await waiter
        if problem is not None:
            raise problem
        if over:
            raise BodyTooLongError(size, limit)
        if not _is_whole(conn):
            raise RequestFailedError(self._describe(conn))
        if decoder is not None and not decoder.is_done():
            raise ContentEncodingError(f"its {decoder.coding} body ends before its coded stream does")
        return size


def _is_whole(conn: HeadedConnection) -> bool:
    """The whole body came: llhttp saw its end, or, with neither Content-Length nor chunked
    framing, the server closed the connection after it (an HTTP/1.0-style body)."""
    if conn.is_complete:
        return True
    headers = conn.headers
    framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower()
    return not framed and not conn.timed_out and not conn.failure and conn.status is not None \
        and not conn.is_stopped

"""A hostile Source's raw answers to the sync's resource GETs (sync/fetcher.py on rsnotify/outbound.py),
sent byte for byte by loopback servers: each one ends as a clear per-resource failure or refusal,
within a bound in time and in memory, with no file and no partial file left, and the next
resource still comes. The last test runs them through a real `rsnotify sync --once`."""
from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rsnotify.lists import ListInfo, Resource
from rsnotify.netguard import parse_networks
from rsnotify.notification import CapabilityEntry, CapabilityList
from rsnotify.subscriber.sync.fetcher import FetchResult, Fetcher
from rsnotify.subscriber.sync.sink import FolderSink
from rsnotify.xml import capability_list_to_xml
from tests.support.ports import free_port
from tests.support.rawhttp import RawServer, answering
from tests.support.sources import list_bytes

LOOPBACK = parse_networks(["127.0.0.0/8"])
RSNOTIFY = str(Path(sys.executable).with_name("rsnotify"))
HELLO = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
Writer = asyncio.StreamWriter
Handler = Callable[[RawServer, asyncio.StreamReader, Writer], Awaitable[None]]


def gzipped(body: bytes, *, extra: bytes = b"", coding: str = "gzip") -> bytes:
    coded = gzip.compress(body) + extra
    return (f"HTTP/1.1 200 OK\r\nContent-Encoding: {coding}\r\nContent-Length: {len(coded)}\r\n\r\n").encode() + coded


def endless(head: bytes, piece: bytes, sent: dict[str, int] | None = None) -> Handler:
    """Answer with `head`, then `piece` again and again until the client goes (counting bytes in `sent`)."""
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.next_request(reader)
        writer.write(head)
        while True:
            writer.write(piece)
            await writer.drain()
            if sent is not None:
                sent["bytes"] = sent.get("bytes", 0) + len(piece)
            await asyncio.sleep(0)
    return handler


def then_close(data: bytes) -> Handler:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.next_request(reader)
        writer.write(data)
        await writer.drain()
    return handler


def dripping(head: bytes, body: bytes, every: float) -> Handler:
    """`head`, then the body one byte every `every` s: each read in time, the whole nearly never."""
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.next_request(reader)
        writer.write(head)
        for byte in body:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(every)
    return handler


def silent() -> Handler:
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: Writer) -> None:
        await server.next_request(reader)
        while await reader.read(1024):        # never answers; ends when the client hangs up
            pass
    return handler


def by_path(routes: dict[str, Handler]) -> Handler:
    """One server, each connection's first request routed by its path's first letter."""
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: Writer) -> None:
        head, _ = await _read_head(reader)
        if head:
            server.requests.append((head, str(time.monotonic()).encode()))
            await routes[head.split(b" ", 2)[1][1:2].decode()](_Replay(server, head), reader, writer)
    return handler


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[RawServer]]]:
    servers: list[RawServer] = []
    writers: list[Writer] = []

    def tracked(handler: Handler) -> Handler:
        async def run(server: RawServer, reader: asyncio.StreamReader, writer: Writer) -> None:
            writers.append(writer)
            await handler(server, reader, writer)
        return run

    async def start(handler: Handler) -> RawServer:
        servers.append(await RawServer(tracked(handler)).start())
        return servers[-1]

    yield start
    for server in servers:
        await server.stop()
    # end every handler before the test's loop closes: an aborted socket fails its next read or write
    for writer in writers:
        writer.transport.abort()
    await asyncio.sleep(0.4)


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


async def fetch(fetcher: Fetcher, loc: str, **announced: object) -> FetchResult:
    # a hang fails the test instead of holding it: every answer here must end well within this
    return await asyncio.wait_for(fetcher.fetch(loc, fetcher.sink.path_for(loc), **announced), 20)  # type: ignore[arg-type]


# (name, the Source's answer, outcome, what the detail says); each fetched with tries=1
CASES: list[tuple[str, bytes | Handler, str, str]] = [
    ("header flood, one name repeated", b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 5000 + b"Content-Length: 5\r\n\r\nhello",
     "failed", "more than 100 header fields"),
    ("one huge header line", endless(b"HTTP/1.1 200 OK\r\nX-Big: ", b"a" * 65536), "failed", "head is over 64 KiB"),
    ("header without a colon", b"HTTP/1.1 200 OK\r\nNoColon\r\nContent-Length: 5\r\n\r\nhello", "failed",
     "invalid HTTP answer: Invalid header token"),
    ("obs-fold", b"HTTP/1.1 200 OK\r\nX-A: b\r\n c\r\nContent-Length: 5\r\n\r\nhello", "failed", "invalid HTTP answer"),
    ("NUL in a header", b"HTTP/1.1 200 OK\r\nX-A: b\x00c\r\nContent-Length: 5\r\n\r\nhello", "failed",
     "invalid HTTP answer"),
    ("bare CR in a header", b"HTTP/1.1 200 OK\r\nX-A: b\rc\r\nContent-Length: 5\r\n\r\nhello", "failed",
     "invalid HTTP answer"),
    ("two equal Content-Length", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", "failed",
     "Duplicate Content-Length"),
    ("two different Content-Length", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 3\r\n\r\nhello",
     "failed", "Duplicate Content-Length"),
    ("Content-Length and chunked", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"5\r\nhello\r\n0\r\n\r\n", "failed", "Transfer-Encoding can't be present with Content-Length"),
    ("negative Content-Length", b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello", "failed",
     "Invalid character in Content-Length"),
    ("huge Content-Length", b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\nhello", "failed",
     "Content-Length overflow"),
    ("non-numeric Content-Length", b"HTTP/1.1 200 OK\r\nContent-Length: five\r\n\r\nhello", "failed",
     "Invalid character in Content-Length"),
    ("chunk extension forever", endless(CHUNKED + b"5;a=", b"b" * 65536), "failed",
     "over 64 KiB of chunk framing or trailers without a byte of its body"),
    ("chunk-size line forever", endless(CHUNKED, b"0" * 65536), "failed", "over 64 KiB of chunk framing"),
    ("chunk size overflow", CHUNKED + b"FFFFFFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n", "failed",
     "invalid HTTP answer body: Chunk size overflow"),
    ("missing final CRLF, then close", then_close(CHUNKED + b"5\r\nhello\r\n0\r\n"), "failed",
     "connection closed after 5 bytes of the body, before its end"),
    ("trailers flood", endless(CHUNKED + b"5\r\nhello\r\n0\r\n", b"X-T: y\r\n" * 8000), "failed",
     "over 64 KiB of chunk framing or trailers"),
    ("one endless trailer value", endless(CHUNKED + b"5\r\nhello\r\n0\r\nX-T: ", b"y" * 65536), "failed",
     "over 64 KiB of chunk framing or trailers"),
    ("1xx flood", endless(b"", b"HTTP/1.1 100 Continue\r\n\r\n" * 2000), "failed", "head is over 64 KiB"),
    ("101 Switching Protocols", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\nhi",
     "failed", "answered 101; expected 200"),
    ("204 with a body", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello", "failed", "answered 204"),
    ("304 with a body", b"HTTP/1.1 304 Not Modified\r\n\r\nhello", "failed", "answered 304"),
    ("stacked gzip, gzip", gzipped(gzip.compress(b"hello"), coding="gzip, gzip"), "failed",
     "Content-Encoding 'gzip, gzip' is not one rsnotify decodes"),
    ("unknown coding", gzipped(b"hello", coding="br"), "failed", "Content-Encoding 'br' is not one rsnotify decodes"),
    ("gzip with trailing garbage", gzipped(b"hello", extra=b"GARBAGE!"), "failed", "its gzip body is corrupt"),
    ("status line garbage", b"HTTP/1.1 2OO OK\r\nContent-Length: 5\r\n\r\nhello", "failed", "Invalid status code"),
    ("HTTP/0.9 body alone", b"hello world", "failed", "invalid HTTP answer: Expected HTTP/"),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "failed", "invalid HTTP answer: Expected HTTP/"),
    ("TLS record on the http port", bytes.fromhex("160303002a020000260303") + bytes(38), "failed",
     "invalid HTTP answer: Expected HTTP/"),
    ("close in the head", then_close(b"HTTP/1.1 200 OK\r\nContent-Le"), "failed",
     "connection closed before the answer's head was complete"),
    ("close in the body", then_close(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello"), "failed",
     "connection closed after 5 bytes of the body, before its end"),
    ("accepts and never answers", silent(), "failed", "no data for 1 s (read timeout)"),
    ("Retry-After in latin-1 digits", b"HTTP/1.1 503 Busy\r\nRetry-After: \xb2\r\nContent-Length: 0\r\n\r\n",
     "failed", "answered 503"),
    ("Location to file:", b"HTTP/1.1 302 F\r\nLocation: file:///etc/passwd\r\nContent-Length: 0\r\n\r\n", "refused",
     "redirected to another host (file:///etc/passwd); refused"),
    ("Location to javascript:", b"HTTP/1.1 302 F\r\nLocation: javascript:alert(1)\r\nContent-Length: 0\r\n\r\n",
     "refused", "redirected to another host (javascript:alert(1)); refused"),
    ("Location to a private net", b"HTTP/1.1 302 F\r\nLocation: http://10.0.0.1/x\r\nContent-Length: 0\r\n\r\n",
     "refused", "redirected to another host (http://10.0.0.1/x); refused"),
    ("Location with an unclosed IPv6 bracket", b"HTTP/1.1 302 F\r\nLocation: http://[::1/x\r\nContent-Length: 0\r\n\r\n",
     "refused", "redirected to 'http://[::1/x', not a URL; refused"),
    ("Location with a CR", b"HTTP/1.1 302 F\r\nLocation: /a\rSet: x\r\nContent-Length: 0\r\n\r\n", "failed",
     "invalid HTTP answer"),
    ("redirect loop", b"HTTP/1.1 302 F\r\nLocation: /r\r\nContent-Length: 0\r\n\r\n", "failed",
     "redirected more than 5 times"),
]


@pytest.mark.parametrize(("answer", "outcome", "said"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
async def test_a_hostile_answer_is_a_clear_failure_and_leaves_no_file(serve, tmp_path, answer, outcome, said):
    server = await serve(answer if callable(answer) else answering(answer))
    good = await serve(answering(HELLO))
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, timeout=1.0, tries=1) as fetcher:
        started = time.monotonic()
        result = await fetch(fetcher, str(server.url("/r")))
        assert (result.outcome, said in result.detail) == (outcome, True), result
        assert time.monotonic() - started < 10
        assert leftovers(tmp_path) == []
        # the run goes on: the next resource is fetched and stored
        assert (await fetch(fetcher, str(good.url("/ok")))).outcome == "stored"
    assert [p.read_bytes() for p in leftovers(tmp_path)] == [b"hello"]


async def test_a_chunk_extension_is_read_past_and_the_body_stored(serve, tmp_path):
    server = await serve(answering(CHUNKED + b"5;a=b;c\r\nhello\r\n0\r\n\r\n"))
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, timeout=1.0, tries=1) as fetcher:
        loc = str(server.url("/r"))
        assert (await fetch(fetcher, loc, length=5)).outcome == "stored"
        assert fetcher.sink.path_for(loc).read_bytes() == b"hello"


async def test_framing_and_trailer_floods_end_within_a_bounded_number_of_bytes(serve, tmp_path):
    # before the framing bound, these went on for as long as the Source wished, and an endless
    # trailer value grew in httptools' buffer (~200 MB in 20 s on loopback)
    for head, piece in [(CHUNKED + b"5\r\nhello\r\n0\r\nX-T: ", b"y" * 65536), (CHUNKED + b"5;a=", b"b" * 65536)]:
        sent: dict[str, int] = {}
        server = await serve(endless(head, piece, sent))
        async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, timeout=5.0, tries=1) as fetcher:
            result = await fetch(fetcher, str(server.url("/r")))
        assert result.outcome == "failed" and "chunk framing or trailers" in result.detail
        await asyncio.sleep(0.2)                      # the server notices the close
        # what the socket buffers held besides: the client read at most ~64 KiB + one read past the bound
        assert sent["bytes"] < 16 * 1024 * 1024, sent


async def test_a_drip_that_keeps_every_read_in_time_still_ends_as_too_slow(serve, tmp_path):
    # one byte every 0.3 s with a 1 s read timeout: aiohttp's sock_read never fired, and
    # 1,000 bytes took 5 minutes; at 1 byte per 29 s with --timeout 30 a GET never ended
    body = b"x" * 1000
    server = await serve(dripping(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", body, 0.3))
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, timeout=1.0, tries=1) as fetcher:
        started = time.monotonic()
        result = await fetch(fetcher, str(server.url("/r")), length=1000)
        took = time.monotonic() - started
    assert result.outcome == "failed" and "under 1024 bytes/s for 1 s or more (too slow;" in result.detail, result
    assert 1.0 <= took < 5.0, took
    assert leftovers(tmp_path) == []


async def test_a_dripping_head_is_too_slow_as_well(serve, tmp_path):
    server = await serve(dripping(b"", b"HTTP/1.1 200 OK\r\nX-Slow: " + b"s" * 500, 0.3))
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, timeout=1.0, tries=1) as fetcher:
        result = await fetch(fetcher, str(server.url("/r")))
    assert result.outcome == "failed" and "too slow" in result.detail, result


async def test_a_second_answer_after_the_body_is_never_taken_for_the_next_request(serve, tmp_path):
    # body longer than its Content-Length, the rest a whole answer: on a reused connection it
    # would answer the next GET ("response smuggling")
    smuggler = HELLO + b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil"
    server = await serve(answering(smuggler, HELLO.replace(b"hello", b"right")))
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, timeout=1.0, tries=1) as fetcher:
        first, second = str(server.url("/first")), str(server.url("/second"))
        assert (await fetch(fetcher, first, length=5)).outcome == "stored"
        assert (await fetch(fetcher, second)).outcome == "stored"
        assert fetcher.sink.path_for(first).read_bytes() == b"hello"
        assert fetcher.sink.path_for(second).read_bytes() == b"hello"    # its own answer, on a new connection
    assert server.connections == 2


async def test_a_gzip_bomb_inside_a_chunked_body_is_cut_at_max_resource_size(serve, tmp_path):
    bomb = gzip.compress(b"\0" * 50_000_000, compresslevel=9)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(bomb[i:i + 4096]), bomb[i:i + 4096]) for i in range(0, len(bomb), 4096))
    answer = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    server = await serve(answering(answer))
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, max_bytes=1_000_000, tries=1) as fetcher:
        result = await fetch(fetcher, str(server.url("/r")))
    assert result.outcome == "refused" and result.rule == "size" and "over --max-resource-size" in result.detail
    assert leftovers(tmp_path) == []


async def test_redirects_to_other_hosts_are_refused_unsent(serve, tmp_path):
    other = await serve(answering(HELLO))
    port = other.port
    locations = [f"//127.0.0.2:{port}/x", f"http://127.0.0.1:{port}@127.0.0.2:{port}/x",
                 f"http://user:pw@127.0.0.2:{port}/x", f"http://127.0.0.1:{port}\\@127.0.0.2:{port}/x",
                 f"http://[::ffff:127.0.0.2]:{port}/x"]
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, tries=1) as fetcher:
        for location in locations:
            source = await serve(answering(f"HTTP/1.1 302 F\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
                                           .encode()))
            result = await fetch(fetcher, str(source.url("/r")))
            assert result.outcome == "refused" and result.rule == "redirect", (location, result)
    assert other.connections == 0 and leftovers(tmp_path) == []


async def test_slow_answers_at_full_concurrency_all_end_and_hold_no_more_connections(serve, tmp_path):
    server = await serve(by_path({"s": silent(),
                                  "d": dripping(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", b"x" * 1000, 0.3),
                                  "o": then_close(HELLO)}))
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, timeout=1.0, tries=1,
                       concurrency=4) as fetcher:
        started = time.monotonic()
        locs = [str(server.url(f"/s{n}")) for n in range(6)] + [str(server.url(f"/d{n}")) for n in range(6)]
        results = await asyncio.gather(*(fetch(fetcher, loc) for loc in locs), fetch(fetcher, str(server.url("/ok"))))
        took = time.monotonic() - started
    assert [r.outcome for r in results] == ["failed"] * 12 + ["stored"], results
    # 13 GETs, 4 at a time, each slow one ended about 1-2 s in (read timeout, rate floor)
    assert took < 15, took
    # the cap: the first 4 GETs arrive at once, the 5th only once one of them ended (>= 1 s);
    # the server's own count of open connections lags behind the client's closes, so not that
    arrivals = sorted(float(when) for _, when in server.requests)
    assert len(arrivals) == 13 and arrivals[4] - arrivals[0] >= 0.8, arrivals


# -- the real CLI


class RawSource:
    """A Source whose lists are well formed and whose resources answer raw bytes, served by a
    loopback RawServer on a thread of its own (the sync runs in a child process)."""

    def __init__(self, resources: dict[str, bytes | Handler]) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.resources = resources
        self.loop = asyncio.new_event_loop()
        self.server: RawServer | None = None
        self.writers: list[Writer] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def list_answer(self, path: str) -> bytes | None:
        if path == "/caps.xml":
            body = capability_list_to_xml(CapabilityList((CapabilityEntry(self.base + "/resourcelist.xml",
                                                                          "resourcelist"),)))
        elif path == "/resourcelist.xml":
            body = list_bytes(ListInfo("resourcelist", at=_T0), [Resource(self.base + p) for p in self.resources])
        else:
            return None
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def handle(self, server: RawServer, reader: asyncio.StreamReader, writer: Writer) -> None:
        self.writers.append(writer)
        while True:
            head, _ = await _read_head(reader)
            if not head:
                return
            path = head.split(b" ", 2)[1].decode()
            answer = self.resources.get(path) or self.list_answer(path)
            if answer is None:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            elif callable(answer):
                await answer(_Replay(server, head), reader, writer)
                return
            else:
                writer.write(answer)
            await writer.drain()

    def __enter__(self) -> RawSource:
        self.thread.start()

        async def start() -> None:
            self.server = RawServer(self.handle)
            self.server.server = await asyncio.start_server(self.server._serve, "127.0.0.1", self.port)

        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        async def stop() -> None:
            assert self.server is not None and self.server.server is not None
            self.server.server.close()
            for writer in self.writers:
                writer.transport.abort()
            deadline = time.monotonic() + 5     # the handlers see their sockets gone and end
            while self.server.open_now and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()                   # else "unclosed event loop" when it is collected


class _Replay(RawServer):
    """Hands a handler written for RawServer the request already read."""

    def __init__(self, server: RawServer, head: bytes) -> None:
        super().__init__(server.handler)
        self._head: bytes | None = head

    async def next_request(self, reader: asyncio.StreamReader) -> bool:
        head, self._head = self._head, None
        return head is not None


async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    try:
        return await reader.readuntil(b"\r\n\r\n"), b""
    except (asyncio.IncompleteReadError, ConnectionError):
        return b"", b""


_T0 = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
def raw_source() -> Iterator[Callable[[dict[str, bytes | Handler]], RawSource]]:
    made: list[RawSource] = []

    def make(resources: dict[str, bytes | Handler]) -> RawSource:
        made.append(RawSource(resources).__enter__())
        return made[-1]

    yield make
    for source in made:
        source.__exit__()


def test_sync_once_reports_each_hostile_answer_and_stores_the_good_ones(raw_source, tmp_path):
    source = raw_source({
        "/good-1.txt": HELLO,
        "/trailer-value": endless(CHUNKED + b"5\r\nhello\r\n0\r\nX-T: ", b"y" * 65536),
        "/chunk-ext": endless(CHUNKED + b"5;a=", b"b" * 65536),
        "/drip": dripping(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", b"x" * 1000, 0.3),
        "/header-flood": b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 5000 + b"Content-Length: 5\r\n\r\nhello",
        "/retry-after": b"HTTP/1.1 503 Busy\r\nRetry-After: \xb2\r\nContent-Length: 0\r\n\r\n",
        "/bad-location": b"HTTP/1.1 302 F\r\nLocation: http://[::1/x\r\nContent-Length: 0\r\n\r\n",
        "/chunk-overflow": CHUNKED + b"FFFFFFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n",
        "/smuggler": HELLO + b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
        "/good-2.txt": HELLO.replace(b"hello", b"world"),
    })
    dest = tmp_path / "dest"
    started = time.monotonic()
    done = subprocess.run([RSNOTIFY, "sync", "--capability-list", source.base + "/caps.xml", "--dir", str(dest),
                           "--once", "--json", "--tries", "1", "--timeout", "1", "--concurrency", "4"],
                          capture_output=True, text=True, timeout=120, check=False)
    took = time.monotonic() - started
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, (done.returncode, done.stderr)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    bad = {e["loc"].rsplit("/", 1)[1]: e for e in events if e["event"] in ("resource.failed", "refused")}
    assert sorted(bad) == ["bad-location", "chunk-ext", "chunk-overflow", "drip", "header-flood", "retry-after",
                           "trailer-value"], events
    folder = dest / f"127.0.0.1_{source.port}"
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert files == {"good-1.txt": b"hello", "good-2.txt": b"world", "smuggler": b"hello"}, files
    assert took < 60, took
    assert not [p for p in dest.rglob("*") if p.name.startswith(".partial-")]
    assert os.path.isdir(folder)


def test_a_list_redirected_to_no_url_is_refused_with_a_message(raw_source, tmp_path):
    # get_in_origin's urljoin raised ValueError on "http://[::1/x" (an unclosed IPv6 bracket): a traceback
    source = raw_source({"/resourcelist.xml": b"HTTP/1.1 302 Found\r\nLocation: http://[::1/x\r\nContent-Length: 0\r\n\r\n"})
    done = subprocess.run([RSNOTIFY, "sync", "--capability-list", source.base + "/caps.xml", "--dir",
                           str(tmp_path / "dest"), "--once", "--tries", "1", "--timeout", "1"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode != 0 and "redirected to 'http://[::1/x', not a URL; refused" in done.stderr, \
        (done.returncode, done.stderr)

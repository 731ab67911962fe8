"""`OutboundClient.open()` (rsnotify/outbound.py), the sync's resource GETs, against raw loopback
servers that answer the way real, broken and hostile Sources do: the answer's header fields,
bodies streamed in chunks and cut at a limit, gzip and deflate undone with the decoded bytes
capped (a compression bomb is cut), a per-read inactivity timeout with no bound on the whole,
bodies that break off, TLS verification and the address guard. On asyncio's loop and uvloop's."""
from __future__ import annotations

import asyncio
import gzip
import hashlib
import ssl
import time
import zlib

import pytest
from yarl import URL

from rsnotify.netguard import parse_networks
from rsnotify.outbound import Limits, OutboundClient, RequestFailedError
from rsnotify.outbound_answer import BodyTooLongError, ContentEncodingError
from tests.support.rawhttp import (
    LOOPS,
    Certificates,
    Handler,
    RawServer,
    answering,
    make_certificates,
    raw_servers,
)

LOOPBACK = parse_networks(["127.0.0.0/8"])
HINT = "allow it with --allow-network CIDR"
# No test here waits for these to fire (the read timeouts under test have limits of their own):
# generous, so that a loaded machine's slow loop is not taken for a server that never answers
# (a 1 s connect timeout failed a whole-suite run at load 12 on 2 cores).
LIMITS = Limits(connect_timeout=10.0, total_timeout=None, max_body=64 * 1024 * 1024, read_timeout=10.0)


pytestmark = pytest.mark.asyncio(loop_factories=LOOPS)     # each test on asyncio's loop and uvloop's


@pytest.fixture
async def serve():
    async with raw_servers() as start:
        yield start


@pytest.fixture
async def client():
    made: list[OutboundClient] = []

    def make(**options) -> OutboundClient:
        made.append(OutboundClient(allowed=options.pop("allowed", LOOPBACK), hint=HINT, user_agent="rsnotify-sync (test)",
                                   keep_headers=True, **options))
        return made[-1]

    yield make
    for each in made:
        await each.close()


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def chunked(body: bytes, *headers: str, piece: int = 65536) -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    parts = [f"{len(body[i:i + piece]):x}\r\n".encode() + body[i:i + piece] + b"\r\n"
             for i in range(0, len(body), piece)]
    return f"HTTP/1.1 200 OK\r\n{head}Transfer-Encoding: chunked\r\n\r\n".encode() + b"".join(parts) + b"0\r\n\r\n"


async def get(client: OutboundClient, url: URL, limit: int = 1 << 30, limits: Limits = LIMITS,
              headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    async with await client.open("GET", url, headers or {}, limits) as response:
        return response.status, response.headers, await response.read(limit)


# -- the head


async def test_the_answers_status_and_header_fields_come_back(serve, client) -> None:
    server = await serve(answering(
        b"HTTP/1.1 100 Continue\r\nX-Interim: yes\r\n\r\n"
        + answer(b"hello", "ETag: \"v1\"", "Cache-Control: no-cache", "Cache-Control: private",
                 "Retry-After: 7", status="203 Non-Authoritative Information")))
    status, headers, body = await get(client(), server.url("/r?x=1"), headers={"Accept-Encoding": "gzip"})
    assert (status, body) == (203, b"hello")
    assert headers["etag"] == '"v1"' and headers["retry-after"] == "7" and headers["content-length"] == "5"
    assert headers["cache-control"] == "no-cache, private"          # a repeated field, joined
    assert "x-interim" not in headers                               # the 100's fields are not the answer's
    [(head, _)] = server.requests
    lines = head.decode().split("\r\n")
    assert lines[0] == "GET /r?x=1 HTTP/1.1" and "Accept-Encoding: gzip" in lines
    assert "User-Agent: rsnotify-sync (test)" in lines and not any(line.startswith("Content-Length") for line in lines)


async def test_an_answer_with_too_many_header_fields_is_refused(serve, client) -> None:
    flood = [f"X-F{n}: {n}" for n in range(150)]
    server = await serve(answering(answer(b"x", *flood)))
    with pytest.raises(RequestFailedError, match="more than 100 header fields"):
        await client().open("GET", server.url(), {}, LIMITS)


async def test_a_head_over_64_kib_is_refused(serve, client) -> None:
    server = await serve(answering(answer(b"x", "X-Big: " + "a" * 70_000)))
    with pytest.raises(RequestFailedError, match="head is over 64 KiB"):
        await client().open("GET", server.url(), {}, LIMITS)


async def test_open_needs_a_client_that_keeps_headers(serve) -> None:
    plain = OutboundClient(allowed=LOOPBACK, hint=HINT)
    try:
        with pytest.raises(ValueError, match="keep_headers"):
            await plain.open("GET", URL("http://127.0.0.1:9/"), {}, LIMITS)
    finally:
        await plain.close()


# -- bodies


async def test_a_big_chunked_body_is_streamed_in_chunks_with_its_exact_bytes(serve, client) -> None:
    body = bytes(range(256)) * 32768                                # 8 MiB
    server = await serve(answering(chunked(body, piece=100_000)))
    outbound = client()
    chunks: list[int] = []
    digest = hashlib.sha256()

    def write(chunk: bytes) -> None:
        chunks.append(len(chunk))
        digest.update(chunk)

    async with await outbound.open("GET", server.url(), {}, LIMITS) as response:
        assert await response.stream(write, len(body)) == len(body)
    assert digest.digest() == hashlib.sha256(body).digest()
    assert len(chunks) > 8 and max(chunks) < len(body) // 4        # handed over as it came, not whole
    assert (await get(outbound, server.url()))[2] == body           # the connection was reused
    assert server.connections == 1


async def test_a_body_past_the_limit_is_cut_and_its_connection_closed(serve, client) -> None:
    body = b"z" * 3_000_000
    server = await serve(answering(chunked(body)))
    outbound = client()
    written = 0

    def write(chunk: bytes) -> None:
        nonlocal written
        written += len(chunk)

    async with await outbound.open("GET", server.url(), {}, LIMITS) as response:
        with pytest.raises(BodyTooLongError) as cut:
            await response.stream(write, 1_000_000)
    assert cut.value.received > 1_000_000 and written <= 1_000_000
    await get(outbound, server.url(), limit=len(body))
    assert server.connections == 2                                  # the cut one was not reused
    small = await serve(answering(answer(b"s" * 100)))              # whole with its head: read at once
    with pytest.raises(BodyTooLongError) as cut:
        await get(outbound, small.url(), limit=99)
    assert cut.value.received == 100


async def test_a_body_cut_short_by_the_server_is_an_error_and_one_ended_by_a_close_is_whole(serve, client) -> None:
    short = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 50, then_close=True))
    with pytest.raises(RequestFailedError, match="after 50 bytes of the body"):
        await get(client(), short.url())
    unframed = await serve(answering(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"y" * 5000, then_close=True))
    assert (await get(client(), unframed.url()))[2] == b"y" * 5000


async def test_gzip_and_both_deflate_forms_are_decoded(serve, client) -> None:
    body = b"the resource's own bytes\n" * 4000
    raw = zlib.compressobj(wbits=-15)
    for coding, coded in (("gzip", gzip.compress(body)), ("x-gzip", gzip.compress(body[:10]) + gzip.compress(body[10:])),
                          ("deflate", zlib.compress(body)), ("deflate", raw.compress(body) + raw.flush())):
        server = await serve(answering(answer(coded, f"Content-Encoding: {coding}")))
        assert (await get(client(), server.url()))[2] == body, coding


async def test_a_compression_bomb_is_cut_at_the_limit_of_decoded_bytes(serve, client) -> None:
    bomb = gzip.compress(b"\0" * 20_000_000, compresslevel=9)      # ~20 KB that would decode to 20 MB
    server = await serve(answering(answer(bomb, "Content-Encoding: gzip")))
    written = 0

    def write(chunk: bytes) -> None:
        nonlocal written
        written += len(chunk)

    async with await client().open("GET", server.url(), {}, LIMITS) as response:
        with pytest.raises(BodyTooLongError) as cut:
            await response.stream(write, 1_000_000)
    assert written <= 1_000_000 and 1_000_000 < cut.value.received <= 1_000_001


async def test_a_coding_we_do_not_decode_or_a_corrupt_one_is_refused_clearly(serve, client) -> None:
    brotli = await serve(answering(answer(b"\x1b\x03\x00", "Content-Encoding: br")))
    with pytest.raises(ContentEncodingError, match="Content-Encoding 'br' is not one rsnotify decodes"):
        await get(client(), brotli.url())
    corrupt = await serve(answering(answer(b"\x1f\x8b\x08\x00garbage-not-deflate", "Content-Encoding: gzip")))
    with pytest.raises(ContentEncodingError, match="gzip body is corrupt"):
        await get(client(), corrupt.url())
    truncated = await serve(answering(answer(gzip.compress(b"a" * 100_000)[:-30], "Content-Encoding: gzip")))
    with pytest.raises(ContentEncodingError, match="ends before its coded stream"):
        await get(client(), truncated.url())


# -- time


def dripping(body: bytes, every: float, stall_after: int | None = None) -> Handler:
    """Send the head at once, then the body a few bytes at a time, `every` s apart; with
    `stall_after`, go silent after that many bytes (the connection stays open)."""
    async def handler(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        for start in range(0, len(body), 10):
            if stall_after is not None and start >= stall_after:
                await asyncio.sleep(30)
            writer.write(body[start:start + 10])
            await writer.drain()
            await asyncio.sleep(every)
    return handler


async def test_a_slow_drip_is_read_to_its_end_while_each_read_comes_in_time(serve, client) -> None:
    body = b"0123456789" * 12
    server = await serve(dripping(body, every=0.1))
    limits = Limits(connect_timeout=10.0, total_timeout=None, max_body=1 << 20, read_timeout=0.5)
    started = time.monotonic()
    assert (await get(client(), server.url(), limits=limits))[2] == body
    assert time.monotonic() - started > 1.0                         # longer than any one read may take


async def test_a_body_that_goes_silent_ends_at_the_read_timeout(serve, client) -> None:
    server = await serve(dripping(b"0123456789" * 12, every=0.05, stall_after=40))
    limits = Limits(connect_timeout=10.0, total_timeout=None, max_body=1 << 20, read_timeout=0.4)
    started = time.monotonic()
    with pytest.raises(RequestFailedError, match=r"no data for 0.4 s \(read timeout\)"):
        await get(client(), server.url(), limits=limits)
    assert 0.4 <= time.monotonic() - started < 2.0


async def test_a_server_that_never_answers_ends_at_the_read_timeout(serve, client) -> None:
    async def silent(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
        await asyncio.sleep(30)

    server = await serve(silent)
    limits = Limits(connect_timeout=10.0, total_timeout=None, max_body=1 << 20, read_timeout=0.3)
    with pytest.raises(RequestFailedError, match="read timeout"):
        await client().open("GET", server.url(), {}, limits)


# -- TLS and the guard


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


async def test_an_https_source_is_verified_and_named_by_sni(serve, client, certificates) -> None:
    server = await serve(answering(answer(b"secure", "Content-Type: text/plain")), certificates.server)
    with pytest.raises(RequestFailedError, match="TLS failed with localhost: certificate verify failed"):
        await client().open("GET", server.url("/r", scheme="https", host="localhost"), {}, LIMITS)
    assert server.requests == []
    trusting = ssl.create_default_context(cafile=str(certificates.ca_file))
    status, headers, body = await get(client(ssl_context=trusting), server.url("/r", scheme="https", host="localhost"))
    assert (status, headers["content-type"], body) == (200, "text/plain", b"secure")
    assert certificates.names_seen[-1] == "localhost"



async def test_the_guard_refuses_a_loopback_source_not_allowed(serve, client) -> None:
    server = await serve(answering(answer(b"x")))
    with pytest.raises(RequestFailedError, match="allow it with --allow-network CIDR") as refused:
        await client(allowed=()).open("GET", server.url(), {}, LIMITS)
    assert refused.value.is_refused and server.connections == 0

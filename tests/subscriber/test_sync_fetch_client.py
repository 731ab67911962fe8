"""The sync's resource GETs (sync/fetcher.py on rsnotify/outbound.py) against real aiohttp Sources
on loopback: the copy holds the resource's bytes when it is sent gzip-coded, a bomb and a big
body are cut at --max-resource-size with nothing left behind, a body that drips slowly is read
while one that goes silent fails at the per-read timeout, --header reaches the Source's origin
only (redirect hops included) and --rate spaces the GETs, a redirect to another origin is
refused unsent, and Retry-After is waited out."""
from __future__ import annotations

import asyncio
import gzip
import hashlib
import time
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rsnotify.netguard import parse_networks
from rsnotify.subscriber.sync.fetcher import Fetcher
from rsnotify.subscriber.sync.headers import SourceHeaders
from rsnotify.subscriber.sync.politeness import RateLimit
from rsnotify.subscriber.sync.sink import FolderSink
from tests.support.ports import free_port

LOOPBACK = parse_networks(["127.0.0.0/8"])
TOKEN = "Bearer s3cret"


class Source:
    """A loopback aiohttp server whose routes a test sets; it records (path, Authorization, time)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.routes: dict[str, Callable[[web.Request], object]] = {}
        self.seen: list[tuple[str, str | None, float]] = []
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        self.server = TestServer(app, host=host, port=free_port())

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path, request.headers.get("Authorization"), time.monotonic()))
        route = self.routes.get(request.path)
        if route is None:
            raise web.HTTPNotFound()
        answer = route(request)
        return await answer if asyncio.iscoroutine(answer) else answer  # type: ignore[return-value]

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))


@pytest.fixture
async def source() -> AsyncIterator[Source]:
    made = Source()
    await made.server.start_server()
    yield made
    await made.server.close()


@pytest.fixture
async def elsewhere() -> AsyncIterator[Source]:
    made = Source("127.0.0.2")
    await made.server.start_server()
    yield made
    await made.server.close()


async def fetch(fetcher: Fetcher, loc: str, **announced):  # type: ignore[no-untyped-def]
    return await fetcher.fetch(loc, fetcher.sink.path_for(loc), **announced)


def partials(root) -> list:  # type: ignore[no-untyped-def]
    return [p for p in root.rglob("*") if p.name.startswith(".partial-")]


async def test_a_gzip_coded_resource_is_stored_as_its_own_bytes(source, tmp_path):
    body = b"a resource that compresses well\n" * 5000
    source.routes["/doc.txt"] = lambda _: web.Response(body=gzip.compress(body), headers={"Content-Encoding": "gzip"})
    source.routes["/small.txt"] = lambda _: web.Response(body=gzip.compress(b"tiny\n"),
                                                         headers={"Content-Encoding": "gzip"})
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK) as fetcher:
        loc = source.url("/doc.txt")
        result = await fetch(fetcher, loc, length=len(body), hashes=(("md5", hashlib.md5(body).hexdigest()),))
        assert result.outcome == "stored", result.detail
        assert fetcher.sink.path_for(loc).read_bytes() == body and result.length == len(body)
        small = source.url("/small.txt")
        assert (await fetch(fetcher, small, length=5)).outcome == "stored"
        assert fetcher.sink.path_for(small).read_bytes() == b"tiny\n"


async def test_a_gzip_bomb_is_cut_at_max_resource_size_and_nothing_is_left(source, tmp_path):
    bomb = gzip.compress(b"\0" * 20_000_000, compresslevel=9)      # 20 x the cap once decoded
    source.routes["/bomb"] = lambda _: web.Response(body=bomb, headers={"Content-Encoding": "gzip"})
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, max_bytes=1_000_000) as fetcher:
        result = await fetch(fetcher, source.url("/bomb"))
    assert result.outcome == "refused" and result.rule == "size", result
    assert "over --max-resource-size 1000000: cut there" in result.detail
    assert not fetcher.sink.path_for(source.url("/bomb")).exists() and not partials(tmp_path)


async def test_a_big_streamed_body_is_stored_whole_and_one_past_the_cap_is_cut(source, tmp_path):
    body = hashlib.sha256(b"seed").digest() * 100_000                   # 3.2 MB, sent chunked

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, len(body), 200_000):
            await response.write(body[start:start + 200_000])
        await response.write_eof()
        return response

    source.routes["/big"] = stream
    async with Fetcher(FolderSink(tmp_path / "whole"), allowed_networks=LOOPBACK) as fetcher:
        result = await fetch(fetcher, source.url("/big"), hashes=(("sha-256", hashlib.sha256(body).hexdigest()),))
        assert result.outcome == "stored" and fetcher.sink.path_for(source.url("/big")).read_bytes() == body
    async with Fetcher(FolderSink(tmp_path / "capped"), allowed_networks=LOOPBACK, max_bytes=1_000_000) as fetcher:
        result = await fetch(fetcher, source.url("/big"))
        assert result.outcome == "refused" and result.rule == "size"
        assert result.detail.startswith(f"{source.url('/big')} sent more than ")
        assert not fetcher.sink.path_for(source.url("/big")).exists() and not partials(tmp_path)


async def test_a_slow_drip_is_stored_and_a_silent_body_fails_at_the_read_timeout(source, tmp_path):
    body = b"0123456789" * 10

    def dripping(stall: bool) -> Callable[[web.Request], object]:
        async def drip(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Length": str(len(body))})
            await response.prepare(request)
            for start in range(0, len(body), 10):
                if stall and start == 50:
                    await asyncio.sleep(5)
                await response.write(body[start:start + 10])
                await asyncio.sleep(0.12)
            return response
        return drip

    source.routes["/drip"] = dripping(stall=False)
    source.routes["/stall"] = dripping(stall=True)
    # ~80 bytes/s: below the default floor (MIN_RATE, tested in test_sync_hostile_answers.py), so a lower one here
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, timeout=0.6, tries=1, min_rate=10) as fetcher:
        started = time.monotonic()
        assert (await fetch(fetcher, source.url("/drip"), length=len(body))).outcome == "stored"
        assert time.monotonic() - started > 1.0                     # longer than the timeout, all of it
        started = time.monotonic()
        result = await fetch(fetcher, source.url("/stall"))
        assert result.outcome == "failed" and "no data for 0.6 s (read timeout)" in result.detail, result
        assert time.monotonic() - started < 4.0 and not partials(tmp_path)


async def test_header_reaches_the_source_and_its_redirects_but_never_another_origin(source, elsewhere, tmp_path):
    source.routes["/moved"] = lambda _: web.Response(status=302, headers={"Location": "/here"})
    source.routes["/here"] = lambda _: web.Response(body=b"here")
    elsewhere.routes["/there"] = lambda _: web.Response(body=b"there")
    rules = [SourceHeaders(source.url("/"), [("Authorization", TOKEN)])]
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, rules=rules) as fetcher:
        assert (await fetch(fetcher, source.url("/moved"))).outcome == "stored"
        assert (await fetch(fetcher, elsewhere.url("/there"))).outcome == "stored"
    assert [(path, auth) for path, auth, _ in source.seen] == [("/moved", TOKEN), ("/here", TOKEN)]
    assert [(path, auth) for path, auth, _ in elsewhere.seen] == [("/there", None)]


async def test_a_redirect_to_another_origin_is_refused_and_never_followed(source, elsewhere, tmp_path):
    source.routes["/away"] = lambda _: web.Response(status=302, headers={"Location": elsewhere.url("/trap")})
    rules = [SourceHeaders(source.url("/"), [("Authorization", TOKEN)])]
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, rules=rules) as fetcher:
        result = await fetch(fetcher, source.url("/away"))
    assert result.outcome == "refused" and result.rule == "redirect"
    assert f"redirected to another host ({elsewhere.url('/trap')}); refused" in result.detail
    assert elsewhere.seen == []


async def test_retry_after_is_waited_out_before_the_next_try(source, tmp_path):
    def busy(_: web.Request) -> web.Response:
        if len(source.seen) == 1:
            return web.Response(status=503, headers={"Retry-After": "1"})
        return web.Response(body=b"at last")

    source.routes["/busy"] = busy
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, retry_base=0.01) as fetcher:
        result = await fetch(fetcher, source.url("/busy"))
        assert result.outcome == "stored" and fetcher.throttled == 1
    first, second = source.seen[0][2], source.seen[1][2]
    assert second - first >= 0.95                                   # Retry-After: 1, not retry_base's 0.01 s


async def test_rate_spaces_the_resource_gets_to_one_origin(source, tmp_path):
    for n in range(5):
        source.routes[f"/r{n}"] = lambda _: web.Response(body=b"r")
    async with Fetcher(FolderSink(tmp_path), allowed_networks=LOOPBACK, concurrency=8,
                       rules=[RateLimit(10)]) as fetcher:
        results = await asyncio.gather(*(fetch(fetcher, source.url(f"/r{n}")) for n in range(5)))
    assert all(r.outcome == "stored" for r in results)
    times = sorted(t for _, _, t in source.seen)
    # started 0.1 s apart by the client; as they arrive one may come a little early after a late one
    assert len(times) == 5 and times[-1] - times[0] >= 0.35, times


async def test_a_refused_address_says_how_to_allow_it(source, tmp_path):
    source.routes["/x"] = lambda _: web.Response(body=b"x")
    async with Fetcher(FolderSink(tmp_path), allowed_networks=(), tries=1) as fetcher:
        result = await fetch(fetcher, source.url("/x"))
    assert result.outcome == "failed" and result.detail.startswith(f"cannot fetch {source.url('/x')}: ")
    assert "not a public address" in result.detail and "allow it with --allow-network CIDR" in result.detail
    assert source.seen == []

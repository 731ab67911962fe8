"""`rsnotify sync --header` against a Source that answers 401 without its token: the copy is
made, and the token never reaches another origin (a second server on 127.0.0.2, allowed with
--allow-host) for a resource that lives there: checked on the receiving servers. (A redirect to
another origin is not followed at all: tests/subscriber/test_sync_trust.py.) Also from the
environment (out of `ps`), and bad header lines refused with one line."""
from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from aiohttp import web

from rsnotify.lists import ListInfo, Resource
from rsnotify.notification import CapabilityEntry, CapabilityList, SourceDescription
from rsnotify.subscriber.cli import _allowed_hosts
from rsnotify.subscriber.sync.fetcher import Fetcher
from rsnotify.subscriber.sync.sink import FolderSink
from rsnotify.xml import capability_list_to_xml, source_description_to_xml
from tests.support import cli
from tests.support.ports import free_port
from tests.support.servers import ThreadedServer
from tests.support.sources import list_bytes

TOKEN = "Bearer s3cret-token"
FILES = {"/a.txt": b"alpha\n", "/b.txt": b"bravo\n"}          # on the Source, behind its token
ELSEWHERE = {"/c.txt": b"lives elsewhere\n"}                  # on 127.0.0.2, open
_AT = datetime(2026, 1, 1, tzinfo=UTC)


class Recording:
    """A loopback server that records each request's path and Authorization header."""

    def __init__(self, host: str, handle_path) -> None:  # type: ignore[no-untyped-def]
        self.seen: list[tuple[str, str | None]] = []
        self.handle_path = handle_path
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self.handle)
        self.server = ThreadedServer(app, port=free_port(), host=host)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path, request.headers.get("Authorization")))
        return await self.handle_path(request)


@pytest.fixture
def servers() -> Iterator[tuple[Recording, Recording]]:
    elsewhere = Recording("127.0.0.2", lambda request: _serve_elsewhere(request, source.server.base,
                                                                        elsewhere.server.base))
    source = Recording("127.0.0.1", lambda request: _serve_source(request, source.server.base, elsewhere.server.base))
    elsewhere.server.start()
    source.server.start()
    yield source, elsewhere
    source.server.stop()
    elsewhere.server.stop()


async def _serve_elsewhere(request: web.Request, base: str, elsewhere: str) -> web.Response:
    """The other origin: one resource the Source's list names."""
    if request.path in ELSEWHERE:
        return web.Response(body=ELSEWHERE[request.path], content_type="text/plain")
    raise web.HTTPNotFound()


def _resource_list(base: str, elsewhere: str) -> bytes:
    return list_bytes(ListInfo("resourcelist", at=_AT), [
        Resource(origin + path, hashes=(("md5", hashlib.md5(body).hexdigest()),), length=len(body))
        for origin, files in ((base, FILES), (elsewhere, ELSEWHERE)) for path, body in sorted(files.items())])


async def _serve_source(request: web.Request, base: str, elsewhere: str) -> web.StreamResponse:
    if request.headers.get("Authorization") != TOKEN:
        raise web.HTTPUnauthorized(text="this Source needs its access token", headers={"WWW-Authenticate": "Bearer"})
    xml = "application/xml"
    if request.path == "/.well-known/resourcesync":
        document = SourceDescription((CapabilityEntry(base + "/capabilitylist.xml", "capabilitylist"),))
        return web.Response(body=source_description_to_xml(document), content_type=xml)
    if request.path == "/capabilitylist.xml":
        capabilities = CapabilityList((CapabilityEntry(base + "/resourcelist.xml", "resourcelist"),),
                                      up=base + "/.well-known/resourcesync")
        return web.Response(body=capability_list_to_xml(capabilities), content_type=xml)
    if request.path == "/resourcelist.xml":
        return web.Response(body=_resource_list(base, elsewhere), content_type=xml)
    if request.path in FILES:
        return web.Response(body=FILES[request.path], content_type="text/plain")
    raise web.HTTPNotFound()




def _copy(dest, base: str) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    host, port = base.removeprefix("http://").split(":")
    root = dest / f"{host}_{port}"
    return {"/" + p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _copies(dest, source: Recording, elsewhere: Recording) -> tuple[dict[str, bytes], dict[str, bytes]]:  # type: ignore[no-untyped-def]
    return _copy(dest, source.server.base), _copy(dest, elsewhere.server.base)


def test_header_reaches_a_protected_source_and_never_another_origin(servers, tmp_path):
    source, elsewhere = servers
    base = source.server.base
    common = ["--source", base + "/", "--allow-network", "127.0.0.2/32", "--allow-host", "127.0.0.2", "--once"]

    refused = cli.run("sync", "--dir", str(tmp_path / "no-token"), *common)
    assert refused.returncode in (1, 3), refused.stderr
    assert "401" in refused.stderr and "Traceback" not in refused.stderr
    assert source.seen and all(auth is None for _, auth in source.seen)

    source.seen.clear()
    synced = cli.run("sync", "--dir", str(tmp_path / "copy"), *common, "--header", f"Authorization: {TOKEN}")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert _copies(tmp_path / "copy", source, elsewhere) == (FILES, ELSEWHERE)
    paths = {path for path, _ in source.seen}
    assert {"/.well-known/resourcesync", "/capabilitylist.xml", "/resourcelist.xml", "/a.txt", "/b.txt"} <= paths
    assert all(auth == TOKEN for _, auth in source.seen), source.seen
    # the resource on the other origin: fetched, without the token
    assert sorted(elsewhere.seen) == [("/c.txt", None)], elsewhere.seen

    # The same from the environment, so the token stays out of `ps`; audit takes it too.
    source.seen.clear()
    from_env = cli.run("sync", "--dir", str(tmp_path / "env-copy"), *common,
                       env={"RSNOTIFY_SYNC_HEADER": f"Authorization: {TOKEN}\nX-Harvester: test"})
    assert from_env.returncode == 0, from_env.stderr
    assert _copies(tmp_path / "env-copy", source, elsewhere) == (FILES, ELSEWHERE)
    assert all(auth == TOKEN for _, auth in source.seen)
    audited = cli.run("audit", "--dir", str(tmp_path / "copy"), "--source", base + "/", "--allow-network",
                      "127.0.0.2/32", "--allow-host", "127.0.0.2", "--header", f"Authorization: {TOKEN}")
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert len(elsewhere.seen) >= 1 and all(auth is None for _, auth in elsewhere.seen)


@pytest.mark.parametrize(("header", "message"), [
    ("Authorization Bearer x", "expected 'Name: value'"),
    ("Bad Name: x", "'Bad Name' is not a header name"),
    ("Host: example.org", "Host is set by the HTTP client itself"),
])
def test_bad_header_lines_are_refused_before_any_request(tmp_path, header, message):
    result = cli.run("sync", "--dir", str(tmp_path / "d"), "--source", f"http://127.0.0.1:{free_port()}/",
                     "--once", "--header", header)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "d").exists()


def test_timeout_and_tries_reach_the_requests(tmp_path):
    """--timeout bounds a Source that does not answer; --tries is how often a resource is asked."""
    gets: dict[str, int] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        gets[request.path] = gets.get(request.path, 0) + 1
        if request.path == "/slow/capabilitylist.xml":
            await asyncio.sleep(20)
        if request.path == "/capabilitylist.xml":
            capabilities = CapabilityList((CapabilityEntry(server.base + "/resourcelist.xml", "resourcelist"),),
                                          up=server.base + "/.well-known/resourcesync")
            return web.Response(body=capability_list_to_xml(capabilities), content_type="application/xml")
        if request.path == "/resourcelist.xml":
            body = list_bytes(ListInfo("resourcelist", at=_AT), [Resource(server.base + "/flaky.txt", length=3)])
            return web.Response(body=body, content_type="application/xml")
        if request.path == "/flaky.txt":      # fails twice, then answers
            if gets[request.path] % 3:
                raise web.HTTPBadGateway()
            return web.Response(body=b"ok\n")
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    server = ThreadedServer(app, port=free_port()).start()
    try:
        started = time.monotonic()
        slow = cli.run("sync", "--dir", str(tmp_path / "slow"), "--capability-list",
                       server.base + "/slow/capabilitylist.xml", "--once", "--timeout", "1")
        assert slow.returncode == 3, slow.stderr
        assert time.monotonic() - started < 15, "--timeout 1 waited for the 20 s answer"

        once = cli.run("sync", "--dir", str(tmp_path / "one-try"), "--capability-list",
                       server.base + "/capabilitylist.xml", "--once", "--tries", "1")
        assert once.returncode == 1 and "failed 1" in once.stderr, once.stderr
        assert gets["/flaky.txt"] == 1
        gets["/flaky.txt"] = 0      # again from the start: two failures, then the answer
        thrice = cli.run("sync", "--dir", str(tmp_path / "three-tries"), "--capability-list",
                         server.base + "/capabilitylist.xml", "--once", "--tries", "3")
        assert thrice.returncode == 0, thrice.stderr
        assert gets["/flaky.txt"] == 3
    finally:
        server.stop()


def test_rate_spaces_the_requests_to_one_host(tmp_path):
    """--rate 5: requests to the Source start at least 0.2 s apart, as the Source saw them."""
    arrivals: list[float] = []
    files = {f"/r{i}.txt": f"resource {i}\n".encode() for i in range(8)}

    async def handle(request: web.Request) -> web.StreamResponse:
        arrivals.append(time.monotonic())
        if request.path == "/capabilitylist.xml":
            capabilities = CapabilityList((CapabilityEntry(server.base + "/resourcelist.xml", "resourcelist"),),
                                          up=server.base + "/.well-known/resourcesync")
            return web.Response(body=capability_list_to_xml(capabilities), content_type="application/xml")
        if request.path == "/resourcelist.xml":
            body = list_bytes(ListInfo("resourcelist", at=_AT),
                              [Resource(server.base + path, length=len(data)) for path, data in sorted(files.items())])
            return web.Response(body=body, content_type="application/xml")
        if request.path in files:
            return web.Response(body=files[request.path])
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    server = ThreadedServer(app, port=free_port()).start()
    try:
        result = cli.run("sync", "--dir", str(tmp_path / "polite"), "--capability-list",
                         server.base + "/capabilitylist.xml", "--once", "--rate", "5", "--concurrency", "8")
        assert result.returncode == 0, result.stderr
        assert len(arrivals) == 2 + len(files)
        gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:])]
        # lists and resources share one limit per host: every start 0.2 s after the one before,
        # whatever --concurrency allows. Seen at the Source a gap shrinks by however late the
        # request before it arrived (0.12 s seen in a whole run at load 18), and the span by how late
        # the first one did; unlimited, 8 come at once (gaps of a few ms)
        assert min(gaps) >= 0.05, gaps
        assert arrivals[-1] - arrivals[0] >= 0.2 * (len(arrivals) - 1) * 0.9, gaps
        bad = cli.run("sync", "--dir", str(tmp_path / "x"), "--capability-list", server.base + "/capabilitylist.xml",
                      "--once", "--rate", "0")
        assert bad.returncode == 2 and "--rate" in bad.stderr
    finally:
        server.stop()


def test_an_allowed_host_written_as_people_read_it_admits_its_dns_spelling(tmp_path):
    loc = "http://xn--bcher-kva.example/books/1.txt"      # how a Source's list spells bücher.example
    bad = cli.run("sync", "--dir", str(tmp_path / "d"), "--source", f"http://127.0.0.1:{free_port()}/",
                  "--once", "--allow-host", "bad..hosté")
    assert bad.returncode == 2 and "--allow-host has an invalid internationalized host name" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "d").exists()

    async def verdicts() -> list[object]:
        found = []
        for given in ((), ("Bücher.example",), ("bücher.example:80",), ("bücher.example:8080",)):
            async with Fetcher(FolderSink(tmp_path / "copy"), allowed_hosts=_allowed_hosts(given)) as fetcher:
                refusal = fetcher.refusal(loc)
                found.append(None if refusal is None else refusal[0].value)
        return found

    assert asyncio.run(verdicts()) == ["host", None, None, "host"]

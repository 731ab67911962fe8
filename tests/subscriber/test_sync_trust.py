"""Nothing a Source says can touch anything outside its own resources: one test per trust rule,
each against a hostile Source (an aiohttp server on loopback serving crafted lists) and a real
`rsnotify sync --once` process. Each asserts that nothing outside the rule was touched, that
the run ended without a traceback, that the refusal was reported (a `refused`/`conflict` event,
a count in `sync status`) and that --once exits 1. A notification relayed by a hub goes through
the same rules (the last test)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rsnotify.lists import ListInfo, Resource
from rsnotify.notification import (
    CapabilityEntry,
    CapabilityList,
    ChangeNotification,
    ChangeType,
    ResourceChange,
)
from rsnotify.subscriber.sync import SyncEngine
from rsnotify.subscriber.sync.runner import status_of
from rsnotify.xml import capability_list_to_xml, to_xml
from tests.support.ports import free_port
from tests.support.servers import ThreadedServer
from tests.support.sources import list_bytes

RSNOTIFY = str(Path(sys.executable).with_name("rsnotify"))
T0 = datetime(2026, 3, 1, tzinfo=UTC)
T1 = T0 + timedelta(minutes=1)

Body = bytes | Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class HostileSource:
    """Serves a Capability List, a Resource List and a Change List built from what the test
    says, and bodies by raw request path (so `x%41` and `xA` are told apart)."""

    port: int
    listed: list[Resource] = field(default_factory=list)
    changes: list[ResourceChange] = field(default_factory=list)
    bodies: dict[str, Body] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    list_redirect: str | None = None     # where /resourcelist.xml redirects to, if anywhere

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, path: str, body: bytes, *, length: int | None = -1, raw: str | None = None) -> None:
        """List `path` (a raw URL path) with its md5 and length, served with `body`."""
        self.listed.append(Resource(self.base + path, hashes=(("md5", hashlib.md5(body).hexdigest()),),
                                    length=len(body) if length == -1 else length))
        self.bodies[raw or path] = body

    def delete(self, loc: str) -> None:
        self.changes.append(ResourceChange(loc, ChangeType.DELETED, changed_at=T1))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.raw_path
        self.hits.append(path)
        if path == "/caps.xml":
            entries = (CapabilityEntry(self.base + "/resourcelist.xml", "resourcelist"),
                       CapabilityEntry(self.base + "/changelist.xml", "changelist"))
            return web.Response(body=capability_list_to_xml(CapabilityList(entries)), content_type="application/xml")
        if path == "/resourcelist.xml" and self.list_redirect:
            raise web.HTTPFound(self.list_redirect)
        if path == "/resourcelist.xml":
            return web.Response(body=list_bytes(ListInfo("resourcelist", at=T0), self.listed))
        if path == "/changelist.xml":
            return web.Response(body=list_bytes(ListInfo("changelist", from_=T0), self.changes))
        body = self.bodies.get(path)
        if body is None:
            raise web.HTTPNotFound()
        if callable(body):
            return await body(request)
        return web.Response(body=body)

    def app(self) -> web.Application:
        app = web.Application()
        # through the attribute, so a test may put its own handler in front (an async def: aiohttp
        # deprecates plain functions as handlers)
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self.handle(request)

        app.router.add_route("GET", "/{tail:.*}", handle)
        return app


@pytest.fixture
def hostile() -> Iterator[HostileSource]:
    source = HostileSource(free_port())
    server = ThreadedServer(source.app(), port=source.port).start()
    yield source
    server.stop()


@dataclass
class Run:
    code: int
    stderr: str
    events: list[dict]

    def of(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == name]

    def lines(self, start: str) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith(start)]


def sync_once(source: Any, dest: Path, *extra: str, timeout: float = 120) -> Run:
    """`rsnotify sync --once --json` of `source` (anything with the `base` its /caps.xml is below)."""
    done = subprocess.run([RSNOTIFY, "sync", "--capability-list", source.base + "/caps.xml", "--dir", str(dest),
                           "--once", "--json", *extra], capture_output=True, text=True, timeout=timeout, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return Run(done.returncode, done.stderr, [json.loads(line) for line in done.stdout.splitlines() if line.strip()])


def status(dest: Path) -> dict:
    """What `rsnotify sync status --dir DEST --json` prints (read in-process: no extra start-up)."""
    info = status_of(dest)
    assert info is not None
    return json.loads(json.dumps(info, default=str))


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def copy_of(source: HostileSource, dest: Path) -> Path:
    return dest / f"127.0.0.1_{source.port}"


def test_a_delete_aimed_at_the_state_or_outside_the_host_folder_touches_nothing(hostile, tmp_path):
    dest = tmp_path / "dest"
    hostile.add("/a.txt", b"a")
    hostile.delete("http://.rsnotify/state.db")                       # a valid host to urlsplit
    hostile.delete(hostile.base + "/../../.rsnotify/state.db")        # ".." segments
    hostile.delete(hostile.base + "/%2E%2E/%2E%2E/.rsnotify/state.db")
    first = sync_once(hostile, dest)
    state = dest / ".rsnotify" / "state.db"
    assert state.is_file() and (copy_of(hostile, dest) / "a.txt").read_bytes() == b"a"
    assert first.code == 1, first.stderr
    refused = first.of("refused")
    assert [e["rule"] for e in refused] == ["host"] and refused[0]["loc"] == "http://.rsnotify/state.db"
    assert "refused (host): http://.rsnotify/state.db" in first.stderr
    assert status(dest)["refusals"] == {"host": 1}
    assert status(dest)["resources"]["ok"] == 1


def test_deletes_keep_to_allowed_hosts_and_tracked_files(hostile, tmp_path):
    dest = tmp_path / "dest"
    victim = dest / "victimhost" / "notes.txt"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"the user's own notes")
    mine = copy_of(hostile, dest) / "mine.txt"          # untracked, inside the Source's own folder
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"put here by hand")
    hostile.add("/a.txt", b"a")
    hostile.delete("http://victimhost/notes.txt")
    hostile.delete(hostile.base + "/mine.txt")
    run = sync_once(hostile, dest)
    assert victim.read_bytes() == b"the user's own notes" and mine.read_bytes() == b"put here by hand"
    assert run.code == 1
    assert sorted((e["rule"], e["loc"]) for e in run.of("refused")) == [
        ("host", "http://victimhost/notes.txt"), ("untracked", hostile.base + "/mine.txt")]
    assert status(dest)["refusals"] == {"host": 1, "untracked": 1}


def test_a_symlink_inside_dir_is_refused_never_followed(hostile, tmp_path):
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_bytes(b"outside DIR")
    folder = copy_of(hostile, dest)
    folder.mkdir(parents=True)
    (folder / "link").symlink_to(outside, target_is_directory=True)
    (folder / "file.txt").symlink_to(outside / "target.txt")
    hostile.add("/link/new.txt", b"would land outside")
    hostile.add("/link/target.txt", b"would overwrite outside")
    hostile.add("/file.txt", b"would write through the link")
    hostile.add("/ok.txt", b"fine")
    before = snapshot(outside)
    run = sync_once(hostile, dest)
    assert snapshot(outside) == before and sorted(os.listdir(outside)) == ["target.txt"]
    assert (folder / "ok.txt").read_bytes() == b"fine" and (folder / "file.txt").is_symlink()
    assert run.code == 1
    refused = sorted(e["loc"].rsplit("/", 1)[1] for e in run.of("refused") if e["rule"] == "symlink")
    assert refused == ["file.txt", "new.txt", "target.txt"], run.events
    assert status(dest)["refusals"] == {"symlink": 3}
    assert not [p for p in folder.rglob(".partial-*")]


def test_a_body_longer_than_announced_is_cut_and_removed(hostile, tmp_path):
    dest = tmp_path / "dest"
    sent = {"bytes": 0}

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()   # chunked: no Content-Length to warn the client
        await response.prepare(request)
        chunk = b"x" * (1 << 20)
        try:
            for _ in range(400):          # 400 MiB if nobody stops it
                await response.write(chunk)
                sent["bytes"] += len(chunk)
        except (ConnectionResetError, RuntimeError):
            pass
        return response

    hostile.listed.append(Resource(hostile.base + "/liar.bin", length=10))
    hostile.bodies["/liar.bin"] = endless
    hostile.listed.append(Resource(hostile.base + "/big.bin"))               # no length: --max-resource-size
    hostile.bodies["/big.bin"] = endless
    hostile.add("/ok.txt", b"fine")
    run = sync_once(hostile, dest, "--max-resource-size", "2MiB")
    folder = copy_of(hostile, dest)
    assert run.code == 1
    assert sorted(os.listdir(folder)) == ["ok.txt"]          # no partial file left, nothing installed
    assert sent["bytes"] < 64 * (1 << 20), sent               # cut early, not streamed to the end
    rules = {e["loc"].rsplit("/", 1)[1]: e["rule"] for e in run.of("refused")}
    assert rules == {"liar.bin": "length", "big.bin": "size"}
    assert status(dest)["refusals"] == {"length": 1, "size": 1}


def test_a_length_refusal_ends_once_the_source_announces_the_bytes_it_serves_or_deletes_it(hostile, tmp_path):
    # A Source that saw a file mid-write announces the length it saw then (0 here) and the real
    # one with its next change, or deletes the file before that. The body over the first is
    # refused (rule "length"); once the next change lands, `sync status` counts the loc refused
    # no more (an e2e run under load saw it counted after both, until the next baseline).
    dest = tmp_path / "dest"
    body = b"eleven byte"
    for name in ("grown.txt", "gone.txt"):
        hostile.listed.append(Resource(f"{hostile.base}/{name}", length=0))
        hostile.bodies[f"/{name}"] = body
    hostile.add("/ok.txt", b"fine")
    first = sync_once(hostile, dest)
    assert first.code == 1 and [e["rule"] for e in first.of("refused")] == ["length", "length"]
    assert status(dest)["refusals"] == {"length": 2}
    assert not (copy_of(hostile, dest) / "grown.txt").exists()
    hostile.changes.append(ResourceChange(hostile.base + "/grown.txt", ChangeType.UPDATED, changed_at=T1,
                                          length=len(body)))
    hostile.delete(hostile.base + "/gone.txt")
    del hostile.bodies["/gone.txt"]
    second = sync_once(hostile, dest)
    assert (copy_of(hostile, dest) / "grown.txt").read_bytes() == body, second.stderr
    assert status(dest)["refusals"] == {}, second.stderr


@contextmanager
def another_server(body: bytes) -> Iterator[tuple[ThreadedServer, list[str]]]:
    """A server on another port answering `body` to every GET, and the paths it was asked for."""
    hits: list[str] = []

    async def record(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(body=body)

    app = web.Application()
    app.router.add_get("/{tail:.*}", record)
    server = ThreadedServer(app, port=free_port()).start()
    try:
        yield server, hits
    finally:
        server.stop()


def test_only_the_sources_own_scheme_host_and_port_are_fetched(hostile, tmp_path):
    dest = tmp_path / "dest"
    with another_server(b"from another port") as (other, other_hits):
        hostile.listed.append(Resource(f"http://127.0.0.1:{other.port}/x.txt"))
        hostile.listed.append(Resource(f"https://127.0.0.1:{hostile.port}/y.txt"))
        hostile.bodies["/jump.txt"] = _redirect(f"http://127.0.0.1:{other.port}/z.txt")
        hostile.listed.append(Resource(hostile.base + "/jump.txt"))
        hostile.add("/ok.txt", b"fine")
        run = sync_once(hostile, dest)
        assert other_hits == []
        assert run.code == 1
        assert sorted(e["rule"] for e in run.of("refused")) == ["origin", "origin", "redirect"]
        assert not (dest / f"127.0.0.1_{other.port}").exists()
        assert sorted(os.listdir(copy_of(hostile, dest))) == ["ok.txt"]
        # allowed explicitly, the other port is fetched
        allowed = sync_once(hostile, dest, "--allow-host", f"127.0.0.1:{other.port}")
        assert other_hits == ["/x.txt"] and (dest / f"127.0.0.1_{other.port}" / "x.txt").read_bytes() == \
            b"from another port"
        assert allowed.code == 1      # the https one and the redirect are still refused


def test_a_list_redirected_to_another_port_is_refused(hostile, tmp_path):
    with another_server(b"<urlset/>") as (other, other_hits):
        hostile.list_redirect = f"http://127.0.0.1:{other.port}/resourcelist.xml"
        run = sync_once(hostile, tmp_path / "dest")
        assert other_hits == [] and run.code == 1
        assert "redirected to http://127.0.0.1:" in run.stderr and "another scheme, host or port" in run.stderr


def _redirect(location: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(location)
    return handler


def test_two_locs_for_one_name_are_both_reported_and_neither_lost(hostile, tmp_path):
    dest = tmp_path / "dest"
    hostile.add("/xA.txt", b"plain")
    hostile.add("/x%41.txt", b"percent-encoded A")      # decodes to the same name
    hostile.add("/x%20y.txt", b"a space")              # x y.txt
    hostile.add("/x%2520y.txt", b"a percent sign")     # x%20y.txt: a different file
    run = sync_once(hostile, dest)
    folder = copy_of(hostile, dest)
    assert (folder / "x y.txt").read_bytes() == b"a space"
    assert (folder / "x%20y.txt").read_bytes() == b"a percent sign"
    assert (folder / "xA.txt").read_bytes() in (b"plain", b"percent-encoded A")
    assert run.code == 1
    pair = {hostile.base + "/xA.txt", hostile.base + "/x%41.txt"}
    conflicts = run.of("conflict")     # both sides, each naming the other; the keeper says so
    assert {e["loc"] for e in conflicts} == pair and all({e["loc"], e["with"]} == pair for e in conflicts)
    [kept] = [e for e in conflicts if e["kept"]]
    assert (folder / "xA.txt").read_bytes() == (b"plain" if kept["loc"].endswith("/xA.txt") else b"percent-encoded A")
    assert run.stderr.count("rsnotify sync: conflict: ") == 2, run.stderr
    info = status(dest)
    assert info["resources"] == {"ok": 2, "conflict": 2}
    assert {t["loc"] for t in info["troubled"]} == pair and {t["state"] for t in info["troubled"]} == {"conflict"}
    assert any("both map to" in t["error"] for t in info["troubled"])
    assert any(t["error"].startswith("keeps ") for t in info["troubled"])
    again = sync_once(hostile, dest)   # still reported on the next run, still exit 1, the file kept
    assert again.code == 1 and {e["loc"] for e in again.of("conflict")} == pair
    assert (folder / "xA.txt").read_bytes() == (b"plain" if kept["loc"].endswith("/xA.txt") else b"percent-encoded A")
    audit = subprocess.run([RSNOTIFY, "audit", "--capability-list", hostile.base + "/caps.xml", "--dir", str(dest),
                            "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert audit.returncode == 1 and "conflicts 2" in audit.stderr, audit.stderr
    [done] = [json.loads(line) for line in audit.stdout.splitlines() if '"audit.done"' in line]
    assert set(done["examples"]["conflict"]) == pair and done["same"] == 2


def test_two_locs_for_one_name_in_different_list_chunks_are_a_conflict_too(hostile, tmp_path):
    # A baseline reads who holds which path once per chunk of 1,000 entries: the second loc,
    # 1,500 entries later, meets the first one's claim (in flight or not yet committed) or its
    # committed record, never an empty path.
    dest = tmp_path / "dest"
    hostile.add("/xA.txt", b"plain")
    for n in range(1500):
        hostile.add(f"/f/{n}", b"%d" % n)
    hostile.add("/x%41.txt", b"percent-encoded A")      # decodes to the same name
    run = sync_once(hostile, dest)
    folder = copy_of(hostile, dest)
    assert run.code == 1
    pair = {hostile.base + "/xA.txt", hostile.base + "/x%41.txt"}
    conflicts = run.of("conflict")
    assert {e["loc"] for e in conflicts} == pair and all({e["loc"], e["with"]} == pair for e in conflicts)
    [kept] = [e for e in conflicts if e["kept"]]
    assert (folder / "xA.txt").read_bytes() == (b"plain" if kept["loc"].endswith("/xA.txt") else b"percent-encoded A")
    assert sorted(os.listdir(folder / "f"), key=int) == [str(n) for n in range(1500)]
    assert status(dest)["resources"] == {"ok": 1500, "conflict": 2}     # the keeper counts as one too


async def test_the_host_rule_judged_once_per_origin_prefix_gives_every_verdict_it_gave_per_loc(tmp_path):
    # Fetcher.refusal remembers only that a plain "scheme://host:port" prefix is allowed; locs
    # that share a prefix's text but not its origin must still be refused, each with its own loc.
    from rsnotify.subscriber.sync.fetcher import Fetcher
    from rsnotify.subscriber.sync.sink import FolderSink

    source = "http://127.0.0.1:8000/caps.xml"
    fetcher = Fetcher(FolderSink(tmp_path / "copy"), allowed_hosts=(), allowed_origins=(source,))
    try:
        locs = ["http://127.0.0.1:8000/a", "http://127.0.0.1:8000/b?q=1", "http://127.0.0.1:8000@evil.example/a",
                "http://127.0.0.1:8000.evil.example/a", "https://127.0.0.1:8000/a", "http://127.0.0.1:8001/a",
                "http://127.0.0.1:99999/a", "http://127.0.0.1/a", "http://evil.example/a", "HTTP://127.0.0.1:8000/a",
                "http://[::1]:8000/a", "http://127.0.0.1:8000#x/a", "ftp://127.0.0.1:8000/a", " http://127.0.0.1:8000/a"]
        expected = [fetcher._refusal(loc) for loc in locs]        # judged one by one, nothing remembered
        assert expected[0] is None and expected[2] is not None and expected[4][0] == "origin"
        for _ in range(2):                                        # first and remembered prefixes alike
            assert [fetcher.refusal(loc) for loc in locs] == expected
    finally:
        await fetcher.close()


def test_an_over_long_name_is_escaped_and_reported_not_a_crash(hostile, tmp_path):
    dest = tmp_path / "dest"
    long_name = "n" * 300 + ".txt"
    hostile.add(f"/d/{long_name}", b"a long name")
    hostile.add("/d/a%2Fb", b"a slash in a name")
    hostile.add("/d/%%x.txt".replace("%%", "%25%25"), b"starts with the escape")
    run = sync_once(hostile, dest)
    assert run.code == 0, run.stderr
    folder = copy_of(hostile, dest) / "d"
    names = sorted(os.listdir(folder))
    assert all(len(n.encode()) <= 255 for n in names)
    assert {"%%a%2Fb", "%%%25%25x.txt"} <= set(names)
    [hashed] = [n for n in names if n.startswith("%%nnn")]
    assert (folder / hashed).read_bytes() == b"a long name" and hashed.count("%%") == 2
    assert len(run.of("name.escaped")) == 3 and "escaped name:" in run.stderr
    assert status(dest)["escaped_names"] == 3
    assert os.listdir(tmp_path) == ["dest"]
    audit = subprocess.run([RSNOTIFY, "audit", "--capability-list", hostile.base + "/caps.xml", "--dir", str(dest),
                            "--deep"], capture_output=True, text=True, timeout=120, check=False)
    assert audit.returncode == 0 and "same 3" in audit.stderr and "escaped names 3" in audit.stderr, audit.stderr


async def test_a_relayed_notification_meets_the_same_rules(hostile, tmp_path):
    dest = tmp_path / "dest"
    victim = dest / "victimhost" / "notes.txt"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"the user's own notes")
    hostile.add("/a.txt", b"a")
    engine = SyncEngine(dest, capability_list=hostile.base + "/caps.xml")
    seen: list = []
    engine.events.listeners.append(seen.append)
    await engine.open()
    try:
        assert await engine.sync_once() == 0
        t2 = T0 + timedelta(minutes=2)
        notification = ChangeNotification(T0, t2, (
            ResourceChange("http://.rsnotify/state.db", ChangeType.DELETED, changed_at=T1),
            ResourceChange("http://victimhost/notes.txt", ChangeType.DELETED, changed_at=T1),
            ResourceChange(f"http://127.0.0.1:{free_port()}/x.txt", ChangeType.CREATED, changed_at=T1),
            ResourceChange(hostile.base + "/a.txt", ChangeType.DELETED, changed_at=T1),   # a fair one
        ))
        engine.state.add_to_inbox("http://hub.example/", 1, "n-1", "application/xml", to_xml(notification))
        await engine.drain_inbox()
        assert (dest / ".rsnotify" / "state.db").is_file() and victim.read_bytes() == b"the user's own notes"
        assert not (copy_of(hostile, dest) / "a.txt").exists()
        assert sorted(e.data["rule"] for e in seen if e.event == "refused") == ["host", "host", "origin"]
        assert engine.state.high_water == t2 and engine.exit_code() == 1
    finally:
        await engine.close()

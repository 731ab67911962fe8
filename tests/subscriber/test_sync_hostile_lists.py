"""Hostile lists through a real `rsnotify sync --once` process: a loopback Source serving raw XML
documents (dates no model can hold, locs no writer would write), and what the run does with
each: its exit code, one line on stderr, no traceback, nothing written outside the copy, and
the copy unchanged (or correct)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rsnotify.subscriber.sync.runner import status_of
from tests.subscriber.test_sync_trust import sync_once
from tests.support.ports import free_port
from tests.support.servers import ThreadedServer

RSNOTIFY = str(Path(sys.executable).with_name("rsnotify"))
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"'
T0 = "2026-01-01T00:00:00Z"


@dataclass
class RawSource:
    """Serves documents by raw request path, as bytes the test wrote; a Capability List at
    /caps.xml naming /rl.xml and /cl.xml."""

    port: int
    docs: dict[str, Any] = field(default_factory=dict)    # bytes, or an aiohttp handler
    hits: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def caps(self) -> None:
        self.docs["/caps.xml"] = (
            f'<?xml version="1.0"?><urlset {NS}><rs:md capability="capabilitylist"/>'
            f'<url><loc>{self.base}/rl.xml</loc><rs:md capability="resourcelist"/></url>'
            f'<url><loc>{self.base}/cl.xml</loc><rs:md capability="changelist"/></url></urlset>').encode()

    def resource_list(self, entries: str, at: str = T0, path: str = "/rl.xml") -> None:
        self.docs[path] = (f'<?xml version="1.0"?><urlset {NS}><rs:md capability="resourcelist" at="{at}"/>'
                           f'{entries}</urlset>').encode()

    def change_list(self, entries: str, from_: str = T0, until: str | None = None, path: str = "/cl.xml") -> None:
        bound = f' until="{until}"' if until else ""
        self.docs[path] = (f'<?xml version="1.0"?><urlset {NS}><rs:md capability="changelist" from="{from_}"'
                           f'{bound}/>{entries}</urlset>').encode()

    def body(self, path: str, data: bytes) -> str:
        """Serve `data` at `path`; a <url> entry listing it with its md5 and length."""
        self.docs[path] = data
        return url(self.base + path, md5=hashlib.md5(data).hexdigest(), length=len(data))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits.append(request.raw_path)
        doc = self.docs.get(request.raw_path)
        if doc is None:
            raise web.HTTPNotFound()
        if callable(doc):
            return await doc(request)
        return web.Response(body=doc, content_type="application/xml")


def url(loc: str, *, md5: str | None = None, length: int | None = None, change: str | None = None,
        when: str | None = None) -> str:
    md = "".join(f' {name}="{value}"' for name, value in (("hash", md5 and f"md5:{md5}"), ("length", length),
                                                          ("change", change), ("datetime", when)) if value is not None)
    return f"<url><loc>{loc}</loc><rs:md{md}/></url>"


@pytest.fixture
def raw() -> Iterator[RawSource]:
    source = RawSource(free_port())
    source.caps()
    app = web.Application()

    async def handle(request: web.Request) -> web.StreamResponse:
        return await source.handle(request)

    app.router.add_route("GET", "/{tail:.*}", handle)
    server = ThreadedServer(app, port=source.port).start()
    yield source
    server.stop()


def files(root: Path) -> dict[str, bytes]:
    """Every file below `root` but the state folder, by relative path."""
    found = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".rsnotify"]
        for name in names:
            path = Path(folder, name)
            found[path.relative_to(root).as_posix()] = path.read_bytes()
    return found


def high_water(dest: Path) -> str | None:
    info = status_of(dest)
    assert info is not None
    return json.loads(json.dumps(info, default=str))["high_water"]


# --- dates -------------------------------------------------------------------------------------


@pytest.mark.parametrize("at", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_date_out_of_range_in_utc_is_a_clear_refusal_not_a_traceback(raw, tmp_path, at):
    # Valid W3C text whose UTC instant is in year 0 or 10000: no datetime holds it.
    dest = tmp_path / "dest"
    entry = raw.body("/a.txt", b"A")
    raw.resource_list(entry, at=at)
    raw.change_list("")
    run = sync_once(raw, dest)
    assert run.code == 1
    [said] = run.lines("rsnotify sync: the Source cannot be read: ")
    assert f"has at='{at}'; expected a W3C datetime" in said, run.stderr
    assert files(dest) == {}
    raw.resource_list(entry)                        # a good Resource List, a bad Change List entry
    raw.change_list(url(raw.base + "/a.txt", change="updated", when=at))
    run = sync_once(raw, dest)
    assert run.code == 1
    [said] = run.lines("rsnotify sync: the Source cannot be read: ")
    assert f"has datetime='{at}'; expected a W3C datetime" in said, run.stderr
    assert files(dest) == {f"127.0.0.1_{raw.port}/a.txt": b"A"}


def test_a_resource_list_of_year_one_is_kept_and_read_back(raw, tmp_path):
    # The state database's datetime text must read back for every year a list may carry.
    dest = tmp_path / "dest"
    raw.resource_list(raw.body("/a.txt", b"A"), at="0001-01-01T00:00:00Z")
    raw.change_list("")
    first = sync_once(raw, dest)
    assert files(dest) == {f"127.0.0.1_{raw.port}/a.txt": b"A"}
    assert first.code == 0, first.stderr
    assert high_water(dest).startswith("0001-01-01T00:00:00")
    again = sync_once(raw, dest)                    # reads the stored high-water mark back
    assert again.code == 0, again.stderr


def _later(days: float) -> str:
    return (datetime.now(UTC) + timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("where", ["resourcelist at", "changelist until", "change datetime", "index until"])
def test_a_list_dated_in_the_future_is_refused_and_the_high_water_mark_stays(raw, tmp_path, where):
    # A date past the sync's clock would become the high-water mark (or a record's changed_at), and
    # every real change after it would look old: the copy would never change again.
    dest = tmp_path / "dest"
    raw.resource_list(raw.body("/a.txt", b"A"))
    raw.change_list("")
    assert sync_once(raw, dest).code == 0
    before = high_water(dest)
    raw.docs["/a.txt"] = b"B"
    changed = url(raw.base + "/a.txt", md5=hashlib.md5(b"B").hexdigest(), length=1, change="updated",
                  when="2026-01-01T00:00:01Z")
    far = "9999-12-31T23:59:59Z"
    if where == "resourcelist at":
        raw.resource_list(raw.body("/a.txt", b"B"), at=far)
        dest = tmp_path / "fresh"         # a first baseline meets it
    elif where == "changelist until":
        raw.change_list(changed, until=far)
    elif where == "change datetime":
        raw.change_list(url(raw.base + "/a.txt", change="updated", when=_later(2)) + changed)
    else:
        raw.change_list(changed, path="/cl1.xml")
        raw.docs["/cl.xml"] = (f'<?xml version="1.0"?><sitemapindex {NS}><rs:md capability="changelist"/>'
                               f'<sitemap><loc>{raw.base}/cl1.xml</loc><rs:md from="{T0}" until="{far}"/>'
                               '</sitemap></sitemapindex>').encode()
    run = sync_once(raw, dest)
    assert run.code == 1
    [said] = run.lines("rsnotify sync: the Source cannot be read: ")
    assert "in the future" in said and "the Source's clock is wrong" in said, run.stderr
    if where == "resourcelist at":
        assert files(dest) == {} and high_water(dest) is None
        return
    assert files(dest) == {f"127.0.0.1_{raw.port}/a.txt": b"A"}
    assert high_water(dest) == before
    raw.change_list(changed)                        # the Source's clock fixed: the change arrives
    assert sync_once(raw, dest).code == 0
    assert files(dest) == {f"127.0.0.1_{raw.port}/a.txt": b"B"}


# --- documents of the wrong kind ---------------------------------------------------------------


def _index(source: RawSource, capability: str, parts: list[str]) -> bytes:
    return (f'<?xml version="1.0"?><sitemapindex {NS}><rs:md capability="{capability}" at="{T0}"/>'
            + "".join(f"<sitemap><loc>{source.base}{part}</loc></sitemap>" for part in parts)
            + "</sitemapindex>").encode()


@pytest.mark.parametrize("served", ["a change list", "a nested index", "an index of itself"])
def test_a_resource_list_that_is_no_resource_list_deletes_nothing(raw, tmp_path, served):
    # Read as a Resource List, each of these lists no resource: a re-baseline (or an audit repair)
    # would then delete the whole copy as "no longer listed", and report it in sync.
    dest = tmp_path / "dest"
    raw.resource_list(raw.body("/a.txt", b"A") + raw.body("/b.txt", b"B"), path="/real.xml")
    raw.docs["/rl.xml"] = raw.docs["/real.xml"]
    raw.change_list("")
    assert sync_once(raw, dest).code == 0
    copy = files(dest)
    assert len(copy) == 2
    if served == "a change list":
        raw.change_list(url(raw.base + "/a.txt", change="updated", when="2026-01-01T00:00:01Z"), path="/rl.xml")
        expected = f"{raw.base}/rl.xml is a changelist document; expected a Resource List"
    elif served == "a nested index":
        raw.docs["/rl.xml"] = _index(raw, "resourcelist", ["/nested.xml"])
        raw.docs["/nested.xml"] = _index(raw, "resourcelist", ["/real.xml"])
        expected = f"{raw.base}/nested.xml is an index inside a Resource List Index; expected a Resource List"
    else:
        raw.docs["/rl.xml"] = _index(raw, "resourcelist", ["/rl.xml"])
        expected = f"{raw.base}/rl.xml is an index inside a Resource List Index; expected a Resource List"
    raw.change_list("", from_="2026-06-01T00:00:00Z")      # starts after H: a re-baseline
    run = sync_once(raw, dest)
    assert run.code == 1 and expected in run.stderr, run.stderr
    assert files(dest) == copy
    audit = subprocess.run([RSNOTIFY, "audit", "--capability-list", raw.base + "/caps.xml", "--dir", str(dest),
                            "--repair"], capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in audit.stderr and audit.returncode != 0 and expected in audit.stderr, audit.stderr
    assert files(dest) == copy


def test_a_change_list_that_is_a_resource_list_is_refused_not_read_as_no_change(raw, tmp_path):
    dest = tmp_path / "dest"
    raw.resource_list(raw.body("/a.txt", b"A"))
    raw.change_list("")
    assert sync_once(raw, dest).code == 0
    raw.docs["/cl.xml"] = raw.docs["/rl.xml"]
    run = sync_once(raw, dest)
    assert run.code == 1 and f"{raw.base}/cl.xml is a resourcelist document; expected a Change List" in run.stderr


# --- order and intervals -----------------------------------------------------------------------


def test_a_change_list_out_of_order_still_ends_with_the_newest_change(raw, tmp_path):
    # The spec wants forward chronological order; a Source that breaks it must not leave the copy
    # on its older change (nor stale forever, its announced hash never served again).
    dest = tmp_path / "dest"
    raw.resource_list(raw.body("/a.txt", b"A1"))
    raw.change_list("")
    assert sync_once(raw, dest).code == 0
    raw.docs["/a.txt"] = b"A3"
    raw.change_list(url(raw.base + "/a.txt", md5=hashlib.md5(b"A3").hexdigest(), length=2, change="updated",
                        when="2026-01-01T00:00:05Z")
                    + url(raw.base + "/a.txt", md5=hashlib.md5(b"A2").hexdigest(), length=2, change="updated",
                          when="2026-01-01T00:00:02Z"))
    run = sync_once(raw, dest)
    assert run.code == 0, run.stderr
    assert files(dest) == {f"127.0.0.1_{raw.port}/a.txt": b"A3"}


def test_a_change_list_ending_before_it_starts_is_refused(raw, tmp_path):
    dest = tmp_path / "dest"
    raw.resource_list(raw.body("/a.txt", b"A"))
    raw.change_list("")
    assert sync_once(raw, dest).code == 0
    before = high_water(dest)
    raw.change_list(url(raw.base + "/a.txt", change="deleted", when="2026-01-01T00:00:05Z"),
                    from_="2026-01-01T00:00:00Z", until="2025-01-01T00:00:00Z")
    run = sync_once(raw, dest)
    assert run.code == 1
    assert (f"Change List {raw.base}/cl.xml has until=2025-01-01T00:00:00Z before from=2026-01-01T00:00:00Z"
            in run.stderr), run.stderr
    assert files(dest) == {f"127.0.0.1_{raw.port}/a.txt": b"A"} and high_water(dest) == before


# --- notifications pushed by a hostile hub ---------------------------------------------------


def _notification(from_: str, until: str, entries: str) -> bytes:
    return (f'<?xml version="1.0"?><urlset {NS}><rs:md capability="change-notification" from="{from_}" '
            f'until="{until}"/>{entries}</urlset>').encode()


async def test_hostile_notifications_through_the_live_inbox_touch_nothing_outside_and_keep_it_running(
        raw, fake_hub, tmp_path):
    # The Source names a hub of its choosing (here one the test plays), which relays what it likes
    # to the running sync's own callback, signed with the secret the sync gave it.
    import asyncio

    dest, outside = tmp_path / "dest", tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_bytes(b"the user's own")
    topic = raw.base + "/changes"
    raw.docs["/caps.xml"] = raw.docs["/caps.xml"].replace(b"</urlset>", (
        f'<url><loc>{topic}</loc><rs:ln rel="hub" href="{fake_hub.url}"/>'
        '<rs:md capability="change-notification"/></url></urlset>').encode())
    raw.resource_list(raw.body("/a.txt", b"A") + raw.body("/keep.txt", b"K"))
    raw.change_list("")
    port = free_port()
    log = tmp_path / "sync.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([RSNOTIFY, "sync", "--capability-list", raw.base + "/caps.xml", "--dir", str(dest),
                                 "--listen", f"127.0.0.1:{port}", "--poll-interval", "60"],
                                stdout=err, stderr=err)
    try:
        for _ in range(300):
            if fake_hub.subscriptions and "rsnotify sync: live" in log.read_text():
                break
            assert proc.poll() is None, log.read_text()
            await asyncio.sleep(0.1)
        [subscription] = fake_hub.subscriptions.values()
        copy = dest / f"127.0.0.1_{raw.port}"
        assert files(copy) == {"a.txt": b"A", "keep.txt": b"K"}, log.read_text()
        raw.docs["/new.txt"] = b"N"
        other = free_port()
        t1 = "2026-01-01T00:00:01Z"
        hostile = "".join(url(loc, change=change, when=t1) for loc, change in [
            (f"{raw.base}/../../../outside/victim.txt", "deleted"),
            (f"{raw.base}/%2e%2e/%2e%2e/%2e%2e/outside/escape.txt", "created"),
            ("http://.rsnotify/state.db", "deleted"),
            (f"{raw.base}/.rsnotify/state.db", "deleted"),
            (f"http://127.0.0.1:{other}/x.txt", "created"),
            (f"{raw.base}/a%5C..%5C..%5Cx.txt", "created"),
            (f"{raw.base}/a.txt", "deleted"),                # fair
            (f"{raw.base}/new.txt", "created"),              # fair
            (f"{raw.base}/new.txt/inside", "created"),       # a file that would need new.txt a folder
        ])

        async def deliver(body: bytes, sequence: int) -> tuple[int, str]:
            return await fake_hub.deliver(subscription.callback, body, secret=subscription.secret,
                                          notification_id=f"n-{sequence}", sequence=sequence, topic=topic)

        status, reply = await deliver(_notification(T0, "2026-01-01T00:01:00Z", hostile), 1)
        assert 200 <= status < 300, reply
        for _ in range(100):
            if files(copy).get("new.txt") == b"N" and "a.txt" not in files(copy):
                break
            await asyncio.sleep(0.1)
        assert files(copy) == {"keep.txt": b"K", "new.txt": b"N"}, log.read_text()
        assert (outside / "victim.txt").read_bytes() == b"the user's own" and os.listdir(outside) == ["victim.txt"]
        assert (dest / ".rsnotify" / "state.db").is_file()
        assert sorted(os.listdir(tmp_path)) == ["dest", "outside", "sync.log"]
        # dated far ahead, not XML at all, a body of a million entries' worth: refused, still running
        future = _notification("2026-01-01T00:01:00Z", _later(3), url(f"{raw.base}/keep.txt", change="deleted",
                                                                       when=_later(2)))
        status, reply = await deliver(future, 2)
        assert status == 400 and "in the future" in reply, reply
        # a body that is no notification is kept as an `invalid` inbox row and handled as a gap
        # (a catch-up from H), so the hub is not asked to send it again: 2xx
        status, reply = await deliver(b"<urlset><not-closed>", 3)
        assert 200 <= status < 300, reply
        status, reply = await deliver(b"<x/>" * 5_000_000, 4)           # 20 MB: over the size cap
        assert status < 500, reply
        assert proc.poll() is None and files(copy) == {"keep.txt": b"K", "new.txt": b"N"}
    finally:
        proc.send_signal(2)
        proc.wait(30)
    said = log.read_text()
    assert "Traceback" not in said and proc.returncode == 0, said
    assert "refused (host): http://.rsnotify/state.db" in said
    assert f"refused (origin): http://127.0.0.1:{other}/x.txt" in said or "refused (host)" in said


def test_a_loc_listed_a_thousand_times_is_fetched_once_per_list_chunk(raw, tmp_path):
    dest = tmp_path / "dest"
    raw.resource_list(raw.body("/a.txt", b"A") * 999 + raw.body("/b.txt", b"B"))   # one chunk of 1,000
    raw.change_list("")
    run = sync_once(raw, dest)
    assert run.code == 0, run.stderr
    assert files(dest) == {f"127.0.0.1_{raw.port}/a.txt": b"A", f"127.0.0.1_{raw.port}/b.txt": b"B"}
    assert raw.hits.count("/a.txt") == 1, raw.hits.count("/a.txt")


@pytest.mark.parametrize("document", ["/rl.xml", "/cl.xml"])
def test_a_list_dripped_a_byte_at_a_time_ends_as_too_slow_not_a_hang(raw, tmp_path, document):
    # Each byte comes well within --timeout, so a read timeout alone never fires: the list would
    # take as many seconds as it has bytes (a 50 MB list: over a year), the folder locked meanwhile.
    import asyncio

    dest = tmp_path / "dest"
    raw.resource_list(raw.body("/a.txt", b"A"))
    raw.change_list("")
    if document == "/cl.xml":
        assert sync_once(raw, dest).code == 0
    whole = raw.docs[document]

    async def drip(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse(headers={"Content-Type": "application/xml"})
        await answer.prepare(request)
        try:
            for byte in whole:
                await answer.write(bytes([byte]))
                await asyncio.sleep(0.5)
        except (ConnectionResetError, RuntimeError):
            pass
        return answer

    raw.docs[document] = drip
    before = files(dest) if dest.exists() else {}
    run = sync_once(raw, dest, "--timeout", "2", timeout=30)
    assert run.code == 3, run.stderr
    [said] = run.lines("rsnotify sync: the Source cannot be read: ")
    assert f"{raw.base}{document}" in said and "under 1024 bytes/s for 2 s or more (too slow" in said, said
    assert (files(dest) if dest.exists() else {}) == before


@pytest.mark.parametrize("document", ["resource list", "capability list"])
def test_a_list_whose_head_is_dripped_ends_as_too_slow_not_a_hang(raw, tmp_path, document):
    # The head, not the body: a status line and a thousand header fields, a byte every 0.2 s.
    import socket
    import threading
    import time

    listener = socket.create_server(("127.0.0.1", free_port()))
    stop = threading.Event()
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-F%d: %s\r\n" % (n, b"v" * 50) for n in range(1000))

    def drip(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                for byte in head:
                    if stop.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(0.2)
            except OSError:
                pass

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        started = time.monotonic()
        if document == "capability list":
            # discovery's own GET: a capability list redirects there (its heads have 12 read timeouts)
            dripping = f"http://127.0.0.1:{listener.getsockname()[1]}/caps.xml"
            done = subprocess.run([RSNOTIFY, "sync", "--capability-list", dripping, "--dir", str(tmp_path / "dest"),
                                   "--once", "--timeout", "0.5"], capture_output=True, text=True, timeout=40,
                                  check=False)
            assert done.returncode == 3 and time.monotonic() - started < 30, done.stderr
            assert "Traceback" not in done.stderr and dripping in done.stderr, done.stderr
            return
        elsewhere = f"http://127.0.0.1:{listener.getsockname()[1]}/rl.xml"
        raw.docs["/caps.xml"] = raw.docs["/caps.xml"].replace(f"{raw.base}/rl.xml".encode(), elsewhere.encode())
        raw.change_list("")
        # on another port: the Source's only with --allow-host (a list elsewhere is refused unread)
        run = sync_once(raw, tmp_path / "dest", "--timeout", "1", "--allow-host",
                        f"127.0.0.1:{listener.getsockname()[1]}", timeout=40)
        assert run.code == 3 and time.monotonic() - started < 30, run.stderr
        [said] = run.lines("rsnotify sync: the Source cannot be read: ")
        assert elsewhere in said and "the answer's head did not come within 7 s (too slow)" in said, said
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize("where", ["file:///etc/passwd", "ftp://127.0.0.1/rl.xml", "javascript:alert(1)"])
def test_a_list_url_that_is_not_http_is_the_sources_mistake_not_an_outage(raw, tmp_path, where):
    raw.docs["/caps.xml"] = raw.docs["/caps.xml"].replace(f"{raw.base}/rl.xml".encode(), where.encode())
    raw.change_list("")
    run = sync_once(raw, tmp_path / "dest")
    assert run.code == 1, run.stderr
    [said] = run.lines("rsnotify sync: the Source cannot be read: ")
    assert said.endswith(f"Resource List {where!r} is not an http or https URL; refused"), said


def test_a_resource_list_without_at_is_said_once_per_run_and_each_run_reads_it_again(raw, tmp_path):
    dest = tmp_path / "dest"
    raw.docs["/rl.xml"] = (f'<?xml version="1.0"?><urlset {NS}><rs:md capability="resourcelist"/>'
                           f'{raw.body("/a.txt", b"A")}</urlset>').encode()
    raw.change_list("")
    for _ in range(2):
        run = sync_once(raw, dest)
        assert run.code == 0, run.stderr
        assert run.lines(f"rsnotify sync: the Resource List {raw.base}/rl.xml has no `at`"), run.stderr
        assert files(dest) == {f"127.0.0.1_{raw.port}/a.txt": b"A"} and high_water(dest) is None

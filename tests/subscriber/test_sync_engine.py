"""The sync engine in-process against a loopback Source built with ListWriter: what it fetches,
what it refuses, which Change Lists it reads, what audit finds, and the inbox's 503."""
from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rsnotify.lists import ListInfo, ListRef, Resource
from rsnotify.netguard import parse_networks
from rsnotify.notification import (
    CapabilityEntry,
    CapabilityList,
    ChangeType,
    ResourceChange,
)
from rsnotify.subscriber.callback.core import CallbackRequest
from rsnotify.subscriber.settings import SubscriberSettings
from rsnotify.subscriber.store import Subscription
from rsnotify.subscriber.sync import SyncEngine, SyncOptions, SyncState
from rsnotify.subscriber.sync.fetcher import Fetcher
from rsnotify.subscriber.sync.push import Push
from rsnotify.subscriber.sync.remote import SourceDocumentError
from rsnotify.subscriber.sync.sink import FolderSink
from rsnotify.xml import capability_list_to_xml
from tests.support.sources import list_bytes

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def md5(body: bytes) -> tuple[tuple[str, str], ...]:
    return (("md5", hashlib.md5(body).hexdigest()),)


class ListSource:
    """Resources, a Resource List at `at`, and Change Lists (an index when more than one)."""

    def __init__(self) -> None:
        self.resources: dict[str, bytes] = {}
        self.at = T0
        self.changelists: list[tuple[datetime, datetime | None, list[ResourceChange]]] = []
        self.requests: list[str] = []
        self.base = ""
        self.overrides: dict[str, web.Response] = {}

    def url(self, path: str) -> str:
        return self.base + path

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.raw_path.partition("?")[0]   # as sent: "x%20y" and "x y" differ
        self.requests.append(path)
        if path in self.overrides:
            return self.overrides[path]
        if path == "/caps.xml":
            entries = [CapabilityEntry(self.url("/resourcelist.xml"), "resourcelist")]
            if self.changelists:
                entries.append(CapabilityEntry(self.url("/changelist.xml"), "changelist"))
            return web.Response(body=capability_list_to_xml(CapabilityList(tuple(entries), up=self.url("/sd.xml"))),
                                content_type="application/xml")
        if path == "/resourcelist.xml":
            entries = [Resource(self.url(p), hashes=md5(b), length=len(b)) for p, b in sorted(self.resources.items())]
            return web.Response(body=list_bytes(ListInfo("resourcelist", at=self.at), entries))
        if path == "/changelist.xml" and len(self.changelists) > 1:
            refs = [ListRef(self.url(f"/changelist-{i}.xml"), from_=f, until=u)
                    for i, (f, u, _) in enumerate(self.changelists)]
            return web.Response(body=list_bytes(ListInfo("changelist", is_index=True), refs))
        if path.startswith("/changelist"):
            index = 0 if path == "/changelist.xml" else int(path.split("-")[1].split(".")[0])
            start, until, changes = self.changelists[index]
            return web.Response(body=list_bytes(ListInfo("changelist", from_=start, until=until), changes))
        if path in self.resources:
            return web.Response(body=self.resources[path])
        raise web.HTTPNotFound()

    def change(self, path: str, body: bytes | None, when: datetime) -> ResourceChange:
        if body is None:
            self.resources.pop(path, None)
            return ResourceChange(self.url(path), ChangeType.DELETED, changed_at=when)
        self.resources[path] = body
        return ResourceChange(self.url(path), ChangeType.UPDATED, changed_at=when, hashes=md5(body), length=len(body))


@pytest.fixture
async def source(aiohttp_server):
    made = ListSource()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", made.handle)
    server = await aiohttp_server(app)
    made.base = str(server.make_url("")).rstrip("/")
    return made


async def engine_for(source: ListSource, root, **options) -> SyncEngine:
    engine = SyncEngine(root, capability_list=source.url("/caps.xml"), options=SyncOptions(**options),
                        retry_base=0.05)
    await engine.open()
    return engine


def copy(root, source: ListSource) -> dict[str, bytes]:
    folder = root / source.base.split("//")[1].replace(":", "_")
    return {"/" + p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


async def test_baseline_fetches_whole_bodies_and_skips_what_it_has(source, tmp_path):
    source.resources = {"/big.bin": bytes(range(256)) * 1200, "/a/b.txt": b"b", "/c.txt": b"c"}  # 300 KB
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
        assert copy(tmp_path, source) == source.resources
        assert engine.state.high_water == T0
        source.requests.clear()
        source.resources["/c.txt"] = b"c2"
        source.at = T0 + timedelta(hours=1)
        assert await engine.sync_once() == 0     # no Change List: a re-baseline with hash skip
        assert [r for r in source.requests if not r.endswith(".xml")] == ["/c.txt"]
        assert copy(tmp_path, source) == source.resources
    finally:
        await engine.close()


async def test_catch_up_reads_only_lists_after_the_high_water_mark(source, tmp_path):
    source.resources = {"/x.txt": b"x0", "/y.txt": b"y0"}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
    finally:
        await engine.close()
    t1, t2, t3 = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2), T0 + timedelta(minutes=3)
    old = [source.change("/old.txt", b"too old", T0 - timedelta(minutes=5))]
    source.changelists = [
        (T0 - timedelta(hours=1), T0, old),                          # closed before H: never fetched
        (T0, t2, [source.change("/x.txt", b"x1", t1), source.change("/n.txt", b"created", t1),
                  source.change("/n.txt", None, t2)]),              # created then deleted
        (t2, None, [source.change("/y.txt", b"y1", t3)]),            # the open list
    ]
    source.resources.pop("/old.txt")
    source.requests.clear()
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
        assert "/changelist-0.xml" not in source.requests
        assert {"/changelist-1.xml", "/changelist-2.xml"} <= set(source.requests)
        assert "/n.txt" not in source.requests          # the final delete needed no GET
        assert copy(tmp_path, source) == {"/x.txt": b"x1", "/y.txt": b"y1"}
        assert engine.state.high_water == t3
    finally:
        await engine.close()


async def test_lists_that_start_after_the_high_water_mark_mean_a_rebaseline(source, tmp_path):
    source.resources = {"/x.txt": b"x0"}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
    finally:
        await engine.close()
    later = T0 + timedelta(hours=5)
    source.changelists = [(later, later + timedelta(hours=1), [source.change("/x.txt", b"x9", later)]),
                          (later + timedelta(hours=1), None, [])]
    source.at = later + timedelta(hours=1)
    engine = await engine_for(source, tmp_path)
    seen = []
    engine.events.listeners.append(lambda e: seen.append(e.event))
    try:
        assert await engine.sync_once() == 0
        assert "catchup.impossible" in seen and "baseline.done" in seen
        assert copy(tmp_path, source) == {"/x.txt": b"x9"}
    finally:
        await engine.close()


async def test_fixity_mismatch_keeps_the_old_copy_and_exits_1(source, tmp_path):
    source.resources = {"/f.txt": b"good"}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
        source.resources["/f.txt"] = b"newer"
        source.at = T0 + timedelta(hours=1)
        source.overrides["/f.txt"] = web.Response(body=b"corrupted")
        assert await engine.sync_once() == 1
        assert copy(tmp_path, source) == {"/f.txt": b"good"}
        assert engine.state.counts_by_state() == {"stale": 1}
    finally:
        await engine.close()


async def test_audit_finds_tampering_and_repair_fixes_tracked_files(source, tmp_path):
    source.resources = {f"/r{i}.txt": f"resource {i}".encode() for i in range(10)}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
        folder = tmp_path / source.base.split("//")[1].replace(":", "_")
        (folder / "r1.txt").unlink()
        (folder / "r2.txt").write_bytes(b"edited locally!")
        (folder / "r3.txt").write_bytes(b"resource 9")         # same length, other bytes
        (folder / "stray.txt").write_bytes(b"untracked")
        report = await engine.audit()   # records against the list, files by presence only
        assert (report.missing, report.changed, report.untracked, report.same) == (1, 0, 1, 9)
        deep = await engine.audit(deep=True)
        assert (deep.missing, deep.changed, deep.corrupt, deep.untracked) == (1, 2, 2, 1)
        repaired = await engine.audit(deep=True, repair=True)
        assert repaired.repaired == 3
        after = await engine.audit(deep=True)
        assert (after.missing, after.changed, after.untracked) == (0, 0, 1)
        assert (folder / "stray.txt").exists()
        assert {k: v for k, v in copy(tmp_path, source).items() if k != "/stray.txt"} == source.resources
    finally:
        await engine.close()


async def test_guard_refuses_private_addresses_and_other_hosts(source, tmp_path):
    sink = FolderSink(tmp_path)
    async with Fetcher(sink, allowed_networks=(), allowed_hosts=None, tries=1) as guarded:
        result = await guarded.fetch(source.url("/x"), sink.path_for(source.url("/x")))
        assert result.outcome == "failed" and "not a public address" in result.detail
    async with Fetcher(sink, allowed_networks=parse_networks(["127.0.0.0/8"]), allowed_hosts={"example.org"},
                       tries=1) as by_host:
        result = await by_host.fetch(source.url("/x"), sink.path_for(source.url("/x")))
        assert result.outcome == "refused"
    source.resources["/target"] = b"t"
    source.overrides["/jump"] = web.Response(status=302, headers={"Location": "http://localhost:1/elsewhere"})
    async with Fetcher(sink, allowed_networks=parse_networks(["127.0.0.0/8"]), tries=1) as fetcher:
        result = await fetcher.fetch(source.url("/jump"), sink.path_for(source.url("/jump")))
        assert result.outcome == "refused" and result.rule == "redirect" and "another host" in result.detail
        source.overrides["/a"] = web.Response(body=b"a file")
        source.overrides["/a/b"] = web.Response(body=b"below it")
        assert (await fetcher.fetch(source.url("/a"), sink.path_for(source.url("/a")))).outcome == "stored"
        assert (await fetcher.fetch(source.url("/a/b"), sink.path_for(source.url("/a/b")))).outcome == "conflict"
    assert not any(p.name.startswith(".partial-") for p in tmp_path.rglob("*"))


async def test_throttled_fetch_backs_off_and_retries(source, tmp_path):
    calls = []

    async def busy(request: web.Request) -> web.Response:
        calls.append(request.path)
        if len(calls) == 1:
            return web.Response(status=429, headers={"Retry-After": "0"})
        return web.Response(body=b"at last")

    source.overrides.clear()
    sink = FolderSink(tmp_path)
    app = web.Application()
    app.router.add_get("/{tail:.*}", busy)
    async with TestServer(app) as server, \
            Fetcher(sink, allowed_networks=parse_networks(["127.0.0.0/8"]), concurrency=8) as fetcher:
        loc = str(server.make_url("/slow"))
        result = await fetcher.fetch(loc, sink.path_for(loc))
        assert result.outcome == "stored" and len(calls) == 2
        assert fetcher.limit == 4 and fetcher.throttled == 1


async def test_state_high_water_never_goes_back_and_inbox_drops_repeats(tmp_path):
    state = SyncState(tmp_path / "state.db")
    state.commit(high_water=T0 + timedelta(hours=1))
    state.commit(high_water=T0)
    assert state.high_water == T0 + timedelta(hours=1)
    assert state.add_to_inbox("hub", 1, "n-1", "application/xml", b"<x/>") is not None
    assert state.add_to_inbox("hub", 1, "n-1", "application/xml", b"<x/>") is None
    assert state.inbox_counts() == {"pending": 1}
    state.close()


async def test_inbox_write_failure_answers_503_so_the_hub_retries(tmp_path):
    state = SyncState(tmp_path / "state.db")
    push = Push(state, SubscriberSettings(), asyncio.Event())
    subscription = Subscription(id="s" * 20, topic="http://src.example/changes", hub="http://hub.example/",
                                callback="http://127.0.0.1:9/websub/" + "s" * 20, status="active")
    await push.store.put(subscription)
    body = (b'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" '
            b'xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="change-notification" '
            b'from="2026-03-01T00:00:00Z" until="2026-03-01T00:01:00Z"/></urlset>')
    request = CallbackRequest("POST", subscription.id, headers=(("Content-Type", "application/xml"),), body=body)
    assert (await push.subscriber.core.handle(request)).status == 200
    assert state.inbox_counts() == {"pending": 1}
    state.db.execute("DROP TABLE inbox")   # the write fails from now on
    retry = CallbackRequest("POST", subscription.id, headers=(("Content-Type", "application/xml"),
                                                              ("X-RSNotify-Id", "n-2")), body=body)
    assert (await push.subscriber.core.handle(retry)).status == 503
    await push.close(unsubscribe=False)
    state.close()


async def test_one_engine_per_folder(source, tmp_path):
    source.resources = {"/x.txt": b"x"}
    first = await engine_for(source, tmp_path)
    second = SyncEngine(tmp_path, capability_list=source.url("/caps.xml"))
    try:
        with pytest.raises(SourceDocumentError, match="is in use by rsnotify"):
            await second.open()
    finally:
        await second.close()
        await first.close()
    third = await engine_for(source, tmp_path)   # free again once the first closed
    await third.close()


async def test_a_rebaseline_deletes_what_the_list_dropped(source, tmp_path):
    source.resources = {"/a.txt": b"a", "/b/c.txt": b"c", "/d.txt": b"d"}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0       # a first baseline: all three fetched, none deleted
        assert copy(tmp_path, source) == source.resources
        del source.resources["/b/c.txt"]
        source.at = T0 + timedelta(hours=1)
        assert await engine.sync_once() == 0       # no Change List: a re-baseline
        assert copy(tmp_path, source) == {"/a.txt": b"a", "/d.txt": b"d"}
    finally:
        await engine.close()


async def test_a_baseline_resumed_after_a_crash_deletes_what_the_list_no_longer_has(source, tmp_path):
    """A first baseline that stopped part-way left records and files (no high-water mark yet);
    when it starts again and the list has dropped one of them, that one goes."""
    from rsnotify.subscriber.sync import ResourceRecord, ResourceState
    source.resources = {"/a.txt": b"a", "/gone.txt": b"g"}
    engine = await engine_for(source, tmp_path)
    try:
        loc = source.url("/gone.txt")
        path = engine.ctx.sink.path_for(loc)
        engine.ctx.sink.write_small(path, b"g")
        engine.state.commit([ResourceRecord(loc, engine.ctx.sink.relative(path), ResourceState.OK,
                                            hashlib.md5(b"g").hexdigest(), hashlib.sha256(b"g").hexdigest(), 1)])
        del source.resources["/gone.txt"]
        assert engine.state.high_water is None
        assert await engine.sync_once() == 0
        assert copy(tmp_path, source) == {"/a.txt": b"a"}
    finally:
        await engine.close()

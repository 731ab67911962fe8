"""The sync engine in-process against a loopback Source (ListSource of test_sync_engine): the
poll does not apply the same changes again, a hub whose numbering restarts is a new epoch
handled as a gap, `sync status` lag is on the Source's clock, an audit reads a folder another
engine owns, and a request row hands `audit --repair` to the owner. Finding the Source from a
URL with a path, in the issue's order, with 404 kept apart from unreachable."""
from __future__ import annotations

import asyncio
from datetime import timedelta

import aiohttp
import pytest
from aiohttp import web

from rsnotify.notification import (
    CapabilityEntry,
    CapabilityList,
    ChangeNotification,
    SourceDescription,
)
from rsnotify.subscriber.discovery import (
    DiscoveryNotFoundError,
    DiscoveryUnreachableError,
    find_source,
)
from rsnotify.subscriber.errors import DiscoveryError
from rsnotify.subscriber.sync import SyncEngine
from rsnotify.subscriber.sync.runner import format_status, parse_duration, status_of
from rsnotify.xml import capability_list_to_xml, source_description_to_xml, to_xml
from tests.subscriber import test_sync_engine as engine_tests
from tests.subscriber.test_sync_engine import T0, ListSource, copy, engine_for
from tests.support.ports import free_port

source = engine_tests.source     # the loopback Source fixture, shared


def events_of(engine: SyncEngine) -> list[dict]:
    seen: list[dict] = []
    engine.events.listeners.append(lambda e: seen.append(e.to_json()))
    return seen


async def test_the_poll_does_not_apply_changes_already_applied(source, tmp_path):
    source.resources = {"/a.txt": b"a0", "/b.txt": b"b0"}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
        t1 = T0 + timedelta(minutes=1)
        source.changelists = [(T0, None, [source.change("/a.txt", b"a1", t1), source.change("/b.txt", None, t1)])]
        engine.ctx.changelist_url = source.url("/changelist.xml")
        seen = events_of(engine)
        assert await engine.sync_once() == 0
        assert copy(tmp_path, source) == {"/a.txt": b"a1"}
        first = [e for e in seen if e["event"] == "catchup.done"][-1]
        assert first["changes"] == 2 and first["fetched"] == 1 and first["deleted"] == 1
        source.requests.clear()
        for _ in range(2):            # the next polls: H is t1, the list's last changes are at t1
            assert await engine.sync_once() == 0
            again = [e for e in seen if e["event"] == "catchup.done"][-1]
            assert again["changes"] == 0 and again["fetched"] == 0 and again["deleted"] == 0, again
        assert [r for r in source.requests if not r.endswith(".xml")] == []
        status = status_of(tmp_path)
        assert status["lag_seconds"] == 0.0 and status["source_latest"] == "2026-03-01T00:01:00Z"
    finally:
        await engine.close()


def notification(site_: ListSource, start, until, edits: dict[str, bytes | None]) -> bytes:
    changes = tuple(site_.change(path, body, start + timedelta(seconds=1)) for path, body in edits.items())
    return to_xml(ChangeNotification(start, until, changes))


async def test_a_hub_whose_sequence_restarts_is_a_new_epoch_handled_as_a_gap(source, tmp_path):
    source.resources = {"/a.txt": b"a0"}
    engine = await engine_for(source, tmp_path, settle=0.0)
    try:
        assert await engine.sync_once() == 0
        source.changelists = [(T0, None, [])]
        engine.ctx.changelist_url = source.url("/changelist.xml")
        seen = events_of(engine)
        t1, t2, t3 = (T0 + timedelta(minutes=m) for m in (1, 2, 3))
        engine.state.add_to_inbox("http://hub/", 74, "n74", "application/xml",
                                  notification(source, T0, t1, {"/a.txt": b"a1"}))
        await engine.drain_inbox()
        assert engine.state.last_sequences() == {"http://hub/": 74}
        # a new hub (or a wiped one) numbers from 1 again; the lower sequence is not a repeat:
        # its interval is not covered yet
        engine.state.add_to_inbox("http://hub/", 1, "n1", "application/xml",
                                  notification(source, t1, t2, {"/b.txt": b"b1"}))
        await engine.drain_inbox()
        assert [e for e in seen if e["event"] == "gap" and e.get("kind") == "hub-epoch"] == [
            {"event": "gap", "kind": "hub-epoch", "hub": "http://hub/", "after": 74, "sequence": 1}]
        assert any(e["event"] == "catchup.start" and e["reason"] == "hub-epoch" for e in seen), seen
        assert engine.state.last_sequences() == {"http://hub/": 1}
        assert copy(tmp_path, source) == {"/a.txt": b"a1", "/b.txt": b"b1"}
        # the new numbering is the baseline now: 2 follows 1 with no further epoch
        engine.state.add_to_inbox("http://hub/", 2, "n2", "application/xml",
                                  notification(source, t2, t3, {"/a.txt": b"a2"}))
        await engine.drain_inbox()
        assert len([e for e in seen if e.get("kind") == "hub-epoch"]) == 1
        assert engine.state.last_sequences() == {"http://hub/": 2}
        status = status_of(tmp_path)
        assert status["hub_epochs"]["http://hub/"]["count"] == 1
        assert status["lag_seconds"] == 0.0
        text = format_status(status)
        assert "last sequence: http://hub/ 2 (http://hub/: numbering restarted 1x, last at 1 after 74)" in text
        assert "(lag 0 s behind the Source's last known change 2026-03-01T00:03:00Z)" in text
    finally:
        await engine.close()


async def test_an_audit_reads_a_folder_another_engine_owns_and_a_request_hands_it_the_repair(source, tmp_path):
    source.resources = {f"/r{i}.txt": f"resource {i}".encode() for i in range(5)}
    owner = await engine_for(source, tmp_path)
    try:
        assert await owner.sync_once() == 0
        reader = SyncEngine(tmp_path, capability_list=source.url("/caps.xml"))
        try:
            await reader.open(shared=True)
            assert reader.read_only
            report = await reader.audit(deep=True)
            assert report.in_sync and report.same == 5
            folder = tmp_path / source.base.split("//")[1].replace(":", "_")
            (folder / "r1.txt").write_bytes(b"edited locally")
            (folder / "r2.txt").unlink()
            report = await reader.audit(deep=True)
            assert (report.missing, report.corrupt, report.in_sync) == (1, 1, False)
            assert owner.state.last_run("audit") is None      # the reader wrote nothing
            request = reader.state.add_request("audit", {"deep": True, "repair": True})
        finally:
            await reader.close()
        await owner._serve_request()
        taken, result = owner.state.request_result(request)
        assert taken and result["in_sync"] and result["report"]["repaired"] == 2
        assert copy(tmp_path, source) == source.resources
    finally:
        await owner.close()


def test_durations():
    assert [parse_duration(t) for t in ("90", "90s", "1.5m", "2h", "1d")] == [90, 90, 90, 7200, 86_400]
    for bad in ("", "m", "-5s", "0", "5x", "nan", "inf"):
        with pytest.raises(ValueError):
            parse_duration(bad)


# --- finding the Source ------------------------------------------------------------------

class Site:
    """Documents by path; everything else 404; every path asked for, in order."""

    def __init__(self) -> None:
        self.documents: dict[str, bytes] = {}
        self.asked: list[str] = []
        self.base = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.asked.append(request.path)
        if request.path in self.documents:
            return web.Response(body=self.documents[request.path], content_type="application/xml")
        raise web.HTTPNotFound()

    def caplist(self, path: str) -> None:
        self.documents[path] = capability_list_to_xml(CapabilityList(
            (CapabilityEntry(self.base + path.replace("capabilitylist", "resourcelist"), "resourcelist"),),
            up=self.base + "/.well-known/resourcesync"))

    def description(self, path: str, *caplists: str) -> None:
        self.documents[path] = source_description_to_xml(SourceDescription(
            tuple(CapabilityEntry(self.base + c, "capabilitylist") for c in caplists)))


@pytest.fixture
async def site(aiohttp_server):
    made = Site()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", made.handle)
    server = await aiohttp_server(app)
    made.base = str(server.make_url("")).rstrip("/")
    return made


async def test_find_source_tries_the_url_its_well_known_its_description_then_the_root(site):
    async with aiohttp.ClientSession() as session:
        site.caplist("/dataset1/capabilitylist.xml")
        # 1. the URL itself, when it is a Capability List
        found = await find_source(session, site.base + "/dataset1/capabilitylist.xml")
        assert (found.kind, found.capability_lists) == ("capabilitylist", (site.base + "/dataset1/capabilitylist.xml",))
        # 4. the host root's well-known, after the URL, its well-known and its sourcedescription.xml
        site.description("/.well-known/resourcesync", "/dataset1/capabilitylist.xml", "/other/capabilitylist.xml")
        site.asked.clear()
        found = await find_source(session, site.base + "/dataset1/")
        assert site.asked == ["/dataset1/", "/dataset1/.well-known/resourcesync", "/dataset1/sourcedescription.xml",
                              "/.well-known/resourcesync"]
        assert found.capability_lists == (site.base + "/dataset1/capabilitylist.xml",)   # only those under it
        # 3. URL/sourcedescription.xml wins over the root
        site.description("/dataset1/sourcedescription.xml", "/dataset1/capabilitylist.xml")
        site.asked.clear()
        found = await find_source(session, site.base + "/dataset1")
        assert found.url == site.base + "/dataset1/sourcedescription.xml" and "/.well-known/resourcesync" not in site.asked
        # 2. URL/.well-known/resourcesync wins over that
        site.description("/dataset1/.well-known/resourcesync", "/dataset1/capabilitylist.xml")
        found = await find_source(session, site.base + "/dataset1/")
        assert found.url == site.base + "/dataset1/.well-known/resourcesync"
        # a path the root's Source Description has nothing under: refused, naming what it lists
        with pytest.raises(DiscoveryError, match=r"no Capability List under .*/nope/.*other/capabilitylist.xml"):
            await find_source(session, site.base + "/nope/")
        # nothing anywhere: not found (a 404 is never "cannot be reached")
        del site.documents["/.well-known/resourcesync"]
        with pytest.raises(DiscoveryNotFoundError, match=r"not found at .*/nope/\.well-known/resourcesync"):
            await find_source(session, site.base + "/nope/")
        with pytest.raises(DiscoveryUnreachableError):
            await find_source(session, f"http://127.0.0.1:{free_port()}/dataset1/")


async def test_an_audit_beside_a_running_engine_never_waits(source, tmp_path):
    source.resources = {"/a.txt": b"a"}
    owner = await engine_for(source, tmp_path)
    try:
        assert await owner.sync_once() == 0
        reader = SyncEngine(tmp_path, capability_list=source.url("/caps.xml"))
        try:
            await asyncio.wait_for(reader.open(shared=True), 5)
            assert (await asyncio.wait_for(reader.audit(), 5)).in_sync
        finally:
            await reader.close()
    finally:
        await owner.close()


async def test_lag_is_the_distance_to_the_sources_last_known_change_not_the_clock(source, tmp_path):
    source.resources = {"/a.txt": b"a0"}
    engine = await engine_for(source, tmp_path, settle=60.0)
    try:
        assert await engine.sync_once() == 0
        assert status_of(tmp_path)["lag_seconds"] == 0.0      # H is T0, months before the local clock
        # a notification that starts after H waits (reordering) before it is called a gap: the
        # copy is behind the Source by its `until`
        later = T0 + timedelta(minutes=5)
        engine.state.add_to_inbox("http://hub/", 3, "n3", "application/xml",
                                  notification(source, later, later + timedelta(seconds=10), {"/a.txt": b"a1"}))
        assert await engine.drain_inbox() == "wait"
        assert status_of(tmp_path)["lag_seconds"] == 310.0
    finally:
        await engine.close()

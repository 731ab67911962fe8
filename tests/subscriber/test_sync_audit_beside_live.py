"""A live sync keeps applying notifications while it audits (an `audit --repair` handed to it, or
--audit-every), and stays exact: the audit neither reports nor repairs what a live change touched
meanwhile, and a repair in flight never lands over a newer live change.

The engine runs live (`SyncEngine.run`) against a loopback Source whose Resource List and one
resource answer only when the test opens a gate; notifications enter through the inbox as the
callback receiver writes them, and the audit is asked for through the state's request row as
`rsnotify audit --repair` asks a running sync."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import pytest
from aiohttp import web

from rsnotify.notification import ChangeNotification
from rsnotify.subscriber.sync import SyncEngine, SyncOptions
from rsnotify.xml import to_xml
from tests.subscriber.test_sync_engine import T0, ListSource, copy


class GatedSource(ListSource):
    """A ListSource whose answers for `gates` paths are made when asked (the bytes of that
    moment) but sent only once the gate opens; each gate holds back the first request only."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, asyncio.Event] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        response = await super().handle(request)
        gate = self.gates.pop(request.raw_path, None)
        if gate is not None:
            await gate.wait()
        return response


@pytest.fixture
async def gated(aiohttp_server):
    made = GatedSource()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", made.handle)
    server = await aiohttp_server(app)
    made.base = str(server.make_url("")).rstrip("/")
    return made


async def until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def deliver(engine: SyncEngine, source: ListSource, sequence: int, minute: int, path: str, body: bytes, *,
            dated: bool = True) -> None:
    """What the callback receiver does with a delivery: its bytes into the inbox, then a wake.
    `dated` False: the change has no datetime (optional in ResourceSync), so nothing but the
    audit's own watch can tell that it is newer than the Resource List."""
    start, end = T0 + timedelta(minutes=minute - 1), T0 + timedelta(minutes=minute)
    change = source.change(path, body, end - timedelta(seconds=1))
    if not dated:
        change = replace(change, changed_at=None)
    note = ChangeNotification(start, end, (change,))
    engine.state.add_to_inbox("http://hub/", sequence, f"n{sequence}", "application/xml", to_xml(note))
    engine.wake.set()


@contextlib.asynccontextmanager
async def live_engine(source: ListSource, tmp_path, *gates: asyncio.Event,
                      **engine_options) -> AsyncIterator[tuple[SyncEngine, list[dict]]]:
    """A live engine over `source`, once it says it is live: (the engine, its events as JSON).
    Afterwards it is stopped and closed, with the Source's gates and `gates` opened first (an
    audit waiting at one must not hold the stop up)."""
    engine = SyncEngine(tmp_path, capability_list=source.url("/caps.xml"), options=SyncOptions(settle=0.0),
                        retry_base=0.05, poll_interval=600, **engine_options)
    await engine.open()
    events: list[dict] = []
    engine.events.listeners.append(lambda e: events.append(e.to_json()))
    stop = asyncio.Event()
    live = asyncio.create_task(engine.run(stop))
    try:
        await until(lambda: any(e["event"] == "live" for e in events), "live")
        yield engine, events
    finally:
        stop.set()
        for gate in (*source.gates.values(), *gates):
            gate.set()
        await asyncio.wait_for(live, 10)
        await engine.close()


async def test_live_changes_land_during_an_audit_which_neither_reports_nor_overwrites_them(gated, tmp_path):
    source = gated
    source.resources = {f"/r{i}.txt": f"resource {i}".encode() for i in range(5)}
    source.changelists = [(T0, None, [])]
    async with live_engine(source, tmp_path) as (engine, events):
        folder = tmp_path / source.base.split("//")[1].replace(":", "_")
        (folder / "r2.txt").write_bytes(b"tampered")     # bit rot: the deep audit repairs it
        list_gate, r2_gate = asyncio.Event(), asyncio.Event()
        source.gates = {"/resourcelist.xml": list_gate, "/r2.txt": r2_gate}
        source.requests.clear()
        request = engine.state.add_request("audit", {"deep": True, "repair": True})
        await until(lambda: "/resourcelist.xml" in source.requests, "the audit to ask for the list")

        # 1. the audit waits for its list; a notification is applied all the same
        started = time.monotonic()
        deliver(engine, source, 1, 1, "/r1.txt", b"r1 changed while auditing", dated=False)
        await until(lambda: (folder / "r1.txt").read_bytes() == b"r1 changed while auditing",
                    "the live change during the audit", timeout=3.0)
        waited = time.monotonic() - started
        assert not list_gate.is_set() and engine.state.request_result(request)[1] is None
        assert waited < 3.0

        # 2. the repair of r2 is in flight (the Source answers it with the bytes it had); a newer
        # change of r2 arrives meanwhile: it waits for the repair and lands over it
        list_gate.set()
        await until(lambda: "/r2.txt" in source.requests, "the repair's GET of r2")
        deliver(engine, source, 2, 2, "/r2.txt", b"r2 changed while repairing")
        await asyncio.sleep(0.3)
        r2_gate.set()
        await until(lambda: engine.state.request_result(request)[1] is not None, "the audit's report")
        await until(lambda: copy(tmp_path, source) == source.resources, "the copy equal to the Source")
        assert (folder / "r2.txt").read_bytes() == b"r2 changed while repairing"

        result = engine.state.request_result(request)[1]
        report = result["report"]
        # r1 was listed with its old bytes, but a live change made it newer during the audit (with
        # no datetime to compare with the list's `at`): not a difference, and not "repaired" back
        assert (report["changed"], report["corrupt"], report["missing"], report["extra"]) == (1, 1, 0, 0), report
        assert report["newer_locally"] == 1 and report["repaired"] == 1, report
        assert report["examples"].get("changed") == [source.url("/r2.txt")], report
        applied = [e for e in events if e["event"] == "notification.applied"]
        assert [e["changes"][0]["outcome"] for e in applied] == ["stored", "stored"], applied
        assert applied[0]["latency_ms"] < 3000
        status = engine.state.counts_by_state()
        assert status == {"ok": 5}, status


async def test_a_periodic_audit_lets_notifications_through_while_it_waits_for_the_list(gated, tmp_path):
    source = gated
    source.resources = {f"/r{i}.txt": f"resource {i}".encode() for i in range(3)}
    source.changelists = [(T0, None, [])]
    list_gate = asyncio.Event()
    async with live_engine(source, tmp_path, list_gate, audit_every=0.5) as (engine, events):
        source.requests.clear()
        source.gates = {"/resourcelist.xml": list_gate}     # the next audit's list waits
        await until(lambda: "/resourcelist.xml" in source.requests, "the periodic audit to ask for the list")
        deliver(engine, source, 1, 1, "/r0.txt", b"r0 changed while auditing")
        await until(lambda: copy(tmp_path, source) == source.resources, "the live change during the audit", 3.0)
        assert not any(e["event"] == "audit.done" for e in events)
        list_gate.set()
        await until(lambda: any(e["event"] == "audit.done" for e in events), "the audit's end")
        [done] = [e for e in events if e["event"] == "audit.done"][:1]
        assert done["trigger"] == "every" and done["in_sync"], done


async def test_a_change_during_one_audit_hides_nothing_from_the_next(gated, tmp_path):
    # two audit requests back to back: r1 changed live during the first (newer locally there),
    # then rotted on disk before the second judged it: the second finds and repairs it
    source = gated
    source.resources = {f"/r{i}.txt": f"resource {i}".encode() for i in range(3)}
    source.changelists = [(T0, None, [])]
    g1, g2 = asyncio.Event(), asyncio.Event()
    async with live_engine(source, tmp_path, g1, g2) as (engine, events):
        folder = tmp_path / source.base.split("//")[1].replace(":", "_")
        source.gates = {"/resourcelist.xml": g1}
        source.requests.clear()
        first = engine.state.add_request("audit", {"deep": True, "repair": True})
        second = engine.state.add_request("audit", {"deep": True, "repair": True})
        await until(lambda: "/resourcelist.xml" in source.requests, "audit 1 asks for the list")
        # undated: only the first audit's watch can tell it is newer than that audit's list
        deliver(engine, source, 1, 1, "/r1.txt", b"r1 v2", dated=False)
        await until(lambda: (folder / "r1.txt").read_bytes() == b"r1 v2", "live change")
        source.gates["/resourcelist.xml"] = g2
        source.requests.clear()
        g1.set()
        await until(lambda: engine.state.request_result(first)[1] is not None, "audit 1 report")
        await until(lambda: "/resourcelist.xml" in source.requests, "audit 2 asks for the list")
        (folder / "r1.txt").write_bytes(b"rotten")        # bit rot after audit 1, before audit 2 judges
        g2.set()
        await until(lambda: engine.state.request_result(second)[1] is not None, "audit 2 report")
        report = engine.state.request_result(second)[1]["report"]
        assert report["corrupt"] == 1 and report["repaired"] == 1, report
        assert (folder / "r1.txt").read_bytes() == b"r1 v2"

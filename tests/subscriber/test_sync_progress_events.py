"""A baseline that takes more than a second says how far it is, as `baseline.progress` events
(what `rsnotify sync --json` prints): entries seen, the rate, and the outcomes so far."""
from __future__ import annotations

import asyncio

from aiohttp import web

from rsnotify.subscriber.sync.events import BASELINE_DONE, BASELINE_PROGRESS, SyncEvent

from .test_sync_engine import ListSource, copy, engine_for


async def test_a_long_baseline_emits_progress_events_then_done(aiohttp_server, tmp_path) -> None:
    source = ListSource()
    source.resources = {f"/r/{n:03}.txt": f"resource {n}\n".encode() for n in range(60)}

    async def slowly(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/r/"):
            await asyncio.sleep(0.05)      # 60 GETs, 2 at a time: about 1.5 s in all
        return await source.handle(request)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", slowly)
    server = await aiohttp_server(app)
    source.base = str(server.make_url("")).rstrip("/")
    engine = await engine_for(source, tmp_path, concurrency=2)
    events: list[SyncEvent] = []
    engine.events.listeners.append(events.append)
    try:
        assert await engine.sync_once() == 0
    finally:
        await engine.close()
    assert copy(tmp_path, source) == source.resources
    progress = [e.data for e in events if e.event == BASELINE_PROGRESS]
    assert progress, [e.event for e in events]
    assert all(p["phase"] == "baseline" and 0 < p["seen"] <= 60 and p["rate"] > 0 and p["failed"] == 0
               for p in progress), progress
    assert [p["fetched"] for p in progress] == sorted(p["fetched"] for p in progress)     # counts only grow
    names = [e.event for e in events]
    assert names.index(BASELINE_PROGRESS) < names.index(BASELINE_DONE)

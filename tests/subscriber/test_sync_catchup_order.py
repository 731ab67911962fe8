"""Catch-up keeps the Change List's order for the changes stamped exactly at the high-water
mark H: one not applied yet (its fetch failed) must not win over a later change of the same
resource in the same list, or a resource the Source deleted comes back as a failed fetch."""
from __future__ import annotations

from datetime import timedelta

from aiohttp import web

from tests.subscriber import test_sync_engine as engine_tests
from tests.subscriber.test_sync_engine import T0, copy, engine_for

source = engine_tests.source     # the loopback Source fixture, shared


async def test_a_delete_after_an_unapplied_change_at_the_high_water_mark_is_applied(source, tmp_path):
    source.resources = {"/a.txt": b"a"}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
        t1, t2 = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
        created = source.change("/new.txt", b"the right bytes", t1)
        source.overrides["/new.txt"] = web.Response(body=b"wrong bytes")     # fails the hash check
        source.changelists = [(T0, None, [created])]
        engine.ctx.changelist_url = source.url("/changelist.xml")
        assert await engine.sync_once() == 1
        assert engine.state.record(created.loc).state == "stale"
        assert engine.state.high_water == t1            # the failed change is recorded, so H moved on
        # The Source deletes it: the next run reads [created at H, deleted after H].
        del source.overrides["/new.txt"]
        deleted = source.change("/new.txt", None, t2)
        source.changelists = [(T0, None, [created, deleted])]
        source.requests.clear()
        assert await engine.sync_once() == 0
        record = engine.state.record(created.loc)
        assert record.state == "deleted" and record.changed_at == t2
        assert "/new.txt" not in source.requests       # the older creation is not fetched again
        assert copy(tmp_path, source) == {"/a.txt": b"a"}
        assert engine.state.high_water == t2
    finally:
        await engine.close()

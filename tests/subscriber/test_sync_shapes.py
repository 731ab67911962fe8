"""A change that cannot be applied yet (its name is taken by a file that is about to become a
folder) is held back in its record and applied as soon as the way is clear: on the related
change, on a timer, on the next start; H moves on only with the change recorded."""
from __future__ import annotations

import time
from datetime import timedelta

from tests.subscriber.test_sync_engine import T0, copy, engine_for, source  # noqa: F401


async def test_a_create_blocked_by_a_file_is_applied_when_the_file_goes(source, tmp_path):
    source.resources = {"/a.txt": b"a file"}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
    finally:
        await engine.close()
    t1, t2 = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    # A Source that reports the new shape before the delete of the old one, in two lists.
    created = source.change("/a.txt/in.txt", b"inside", t1)
    deleted = source.change("/a.txt", None, t2)
    source.changelists = [(T0, t1, [created]), (t1, None, [deleted])]
    seen = []
    engine = await engine_for(source, tmp_path)
    engine.events.listeners.append(lambda e: seen.append(e))
    try:
        assert await engine.sync_once() == 0
        assert copy(tmp_path, source) == {"/a.txt/in.txt": b"inside"}
        assert engine.state.counts_by_state() == {"ok": 1, "deleted": 1}
        assert [e.data["loc"] for e in seen if e.event == "conflict"] == [source.url("/a.txt/in.txt")]
        assert any(e.event == "retry.done" and e.data["fixed"] == 1 for e in seen)
        assert engine.state.high_water == t2
    finally:
        await engine.close()


async def test_a_held_back_change_is_retried_on_its_timer_and_at_the_next_start(source, tmp_path):
    source.resources = {"/b/x.txt": b"x"}
    engine = await engine_for(source, tmp_path)
    folder = tmp_path / source.base.split("//")[1].replace(":", "_")
    (folder / "b").mkdir(parents=True)
    (folder / "b" / "x.txt").mkdir()           # something local in the way (not the Source's)
    try:
        assert await engine.sync_once() == 1   # held back: a conflict, reported, exit 1
        [record] = engine.state.due_retries(None)
        assert record.state == "conflict" and record.want and record.next_retry_at > time.time()
        (folder / "b" / "x.txt").rmdir()       # the way is clear again
        record_due = record.next_retry_at - time.time()
        assert 0 < record_due <= 1.5           # a conflict is tried again within a second or so
        time.sleep(record_due + 0.05)
        assert await engine.ctx.applier.retry_due() == 1
        assert copy(tmp_path, source) == {"/b/x.txt": b"x"} and engine.state.counts_by_state() == {"ok": 1}
    finally:
        await engine.close()
    (folder / "b" / "x.txt").unlink()
    (folder / "b" / "x.txt").mkdir()
    source.resources["/b/x.txt"] = b"x2"
    source.changelists = [(T0, None, [source.change("/b/x.txt", b"x2", T0 + timedelta(minutes=1))])]
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 1
        (folder / "b" / "x.txt").rmdir()
    finally:
        await engine.close()
    engine = await engine_for(source, tmp_path)   # the next start tries every held-back change
    try:
        assert await engine.sync_once() == 0
        assert copy(tmp_path, source) == {"/b/x.txt": b"x2"}
    finally:
        await engine.close()

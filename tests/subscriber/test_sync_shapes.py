"""A change that cannot be applied yet (its name is taken by a file that is about to become a
folder) is held back in its record and applied as soon as the way is clear: on the related
change, on a timer, on the next start; H moves on only with the change recorded."""
from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from rsnotify.subscriber.sync import SyncState
from tests.subscriber.test_sync_engine import T0, copy, engine_for, source  # noqa: F401


async def test_a_create_blocked_by_a_file_is_applied_when_the_file_goes(source, tmp_path):  # noqa: F811 - the fixture imported above
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


async def test_a_held_back_change_is_retried_on_its_timer_and_at_the_next_start(source, tmp_path):  # noqa: F811 - the fixture imported above
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
        await asyncio.sleep(record_due + 0.05)
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


async def test_a_folder_synced_with_percent_encoded_names_is_renamed_in_place(source, tmp_path):  # noqa: F811 - the fixture imported above
    source.resources = {"/x%20y.txt": b"space", "/%E6%97%A5/a.txt": b"nihon", "/dir/": b"an index", "/plain.txt": b"p"}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
    finally:
        await engine.close()
    # Make it look like a folder from before exact names: the old names on disk and in the state.
    folder = tmp_path / source.base.split("//")[1].replace(":", "_")
    old_names = {"x y.txt": "x%20y.txt", "日/a.txt": "%E6%97%A5/a.txt", "dir/%%": "dir/_index"}
    state = SyncState.in_dir(tmp_path)
    for new, old in old_names.items():
        (folder / old).parent.mkdir(parents=True, exist_ok=True)
        (folder / new).rename(folder / old)
        state.db.execute("UPDATE resources SET path = ? WHERE path = ?", (f"{folder.name}/{old}", f"{folder.name}/{new}"))
    (folder / "日").rmdir()
    state.db.execute("DELETE FROM channel WHERE key = 'names_layout'")
    state.close()
    source.requests.clear()
    source.at = T0 + timedelta(hours=1)     # a re-baseline (no Change List) right after the move
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
        assert [r for r in source.requests if not r.endswith(".xml")] == []    # renamed, not fetched again
        files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        assert files == ["dir/%%", "plain.txt", "x y.txt", "日/a.txt"]
        assert engine.state.counts_by_state() == {"ok": 4}
    finally:
        await engine.close()


async def test_a_rebaseline_turns_files_into_folders_and_back(source, tmp_path):  # noqa: F811
    source.resources = {"/a.txt": b"a file", "/d/x.txt": b"in a folder"}
    engine = await engine_for(source, tmp_path)
    try:
        assert await engine.sync_once() == 0
        for step, resources in enumerate([
            {"/a.txt/in.txt": b"a is a folder now", "/d": b"d is a file now"},
            {"/a.txt": b"a file again", "/d/x.txt": b"a folder again"},
            {"/a.txt/in.txt": b"and a folder once more", "/d": b"and a file"},
        ], start=1):
            source.resources = resources
            source.at = T0 + timedelta(hours=step)    # no Change List: each run is a re-baseline
            assert await engine.sync_once() == 0, engine.state.troubled()
            assert copy(tmp_path, source) == resources
            assert set(engine.state.counts_by_state()) <= {"ok", "deleted"}
    finally:
        await engine.close()

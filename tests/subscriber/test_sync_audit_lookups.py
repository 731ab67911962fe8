"""The audit's batched lookups give the answers of the one-at-a-time ones they replace: a
FolderLook (folders opened once) sees what FolderSink.kind / open_read see, links never
followed; states_by_path picks the record record_by_path picks; path_text is path_for's text."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from rsnotify.subscriber.sync.outcomes import ResourceState
from rsnotify.subscriber.sync.sink import FolderSink, SymlinkRefusedError
from rsnotify.subscriber.sync.state import ResourceRecord, SyncState, from_text, to_text


def _planted(tmp_path: Path) -> tuple[FolderSink, dict[str, Path]]:
    sink = FolderSink(tmp_path / "copy")
    outside = tmp_path / "outside"
    (outside / "r").mkdir(parents=True)
    (outside / "r" / "secret").write_bytes(b"never read")
    paths = {name: sink.path_for(f"http://example.org/{name}") for name in (
        "a/file", "a/gone", "linked/secret", "b/link", "c/folder", "c/file/below", "d/deep/er/file")}
    for name in ("a/file", "c/file/below", "d/deep/er/file"):
        sink.write_small(paths[name], b"bytes")
    os.rename(paths["c/file/below"].parent, paths["c/file/below"].parent.with_name("moved"))
    paths["c/file/below"].parent.write_bytes(b"a file where a folder is needed")
    paths["linked/secret"].parent.parent.joinpath("linked").symlink_to(outside / "r", target_is_directory=True)
    paths["b/link"].parent.mkdir(parents=True)
    paths["b/link"].symlink_to(outside / "r" / "secret")
    paths["c/folder"].mkdir(parents=True)
    return sink, paths


def test_a_look_sees_what_the_sink_sees_and_never_reads_through_a_link(tmp_path: Path) -> None:
    sink, paths = _planted(tmp_path)
    expected = {"a/file": "file", "a/gone": "missing", "linked/secret": "symlink", "b/link": "symlink",
                "c/folder": "other", "c/file/below": "missing", "d/deep/er/file": "file"}
    with sink.looking() as look:
        for _ in range(2):      # the second round answers from the folders already open (or refused)
            assert {name: look.kind(path) for name, path in paths.items()} == expected
            assert {name: look.kind(str(path)) for name, path in paths.items()} == expected
    assert {name: sink.kind(path) for name, path in paths.items()} == expected
    with sink.looking() as look:
        with look.open_read(paths["a/file"]) as file:
            assert file.read() == b"bytes"
        for name in ("linked/secret", "b/link"):
            with pytest.raises(SymlinkRefusedError):
                look.open_read(paths[name])
        with pytest.raises(FileNotFoundError):
            look.open_read(paths["a/gone"])


def test_a_look_holds_a_bounded_number_of_folders_open(tmp_path: Path) -> None:
    sink = FolderSink(tmp_path / "copy")
    paths = [sink.path_for(f"http://example.org/f{n}/file") for n in range(40)]
    for path in paths:
        sink.write_small(path, b"x")
    before = len(os.listdir("/proc/self/fd"))
    with sink.looking() as look:
        look.keep = 8
        assert all(look.kind(path) == "file" for path in paths)
        assert len(os.listdir("/proc/self/fd")) - before <= 8
    assert len(os.listdir("/proc/self/fd")) == before


def test_states_by_path_picks_the_record_record_by_path_picks(tmp_path: Path) -> None:
    state = SyncState(tmp_path / "state.db")
    try:
        state.commit([ResourceRecord("http://example.org/b", "h/shared", ResourceState.DELETED),
                      ResourceRecord("http://example.org/c", "h/shared", ResourceState.OK),
                      ResourceRecord("http://example.org/a", "h/tomb", ResourceState.DELETED),
                      ResourceRecord("http://example.org/d", "h/live", ResourceState.OK)])
        paths = ["h/shared", "h/tomb", "h/live", "h/none"]
        states = state.states_by_path(paths)
        by_one = {path: record.state for path in paths if (record := state.record_by_path(path)) is not None}
        assert states == by_one == {"h/shared": "deleted", "h/tomb": "deleted", "h/live": "ok"}
        assert list(state.iter_live_locs(1)) == [["http://example.org/c"], ["http://example.org/d"]]
    finally:
        state.close()


def test_path_text_is_path_for_and_stored_datetimes_read_back(tmp_path: Path) -> None:
    sink = FolderSink(tmp_path / "copy")
    for loc in ("http://example.org/a/b", "http://example.org/", "https://[::1]:8443/a/%2E%2E/c?q=1",
                "http://example.org/%25%25x//y"):
        assert Path(sink.path_text(loc)) == sink.path_for(loc)
        assert str(sink.path_for(loc)) == sink.path_text(loc)
    stored = from_text("2026-11-26T02:01:12.840815Z")
    assert stored is not None and to_text(stored) == "2026-11-26T02:01:12.840815Z"
    assert from_text("2026-11-26T02:01:12+02:00") == from_text("2026-11-26T00:01:12.000000Z")


def test_a_reused_folder_part_places_every_loc_as_a_fresh_sink_would(tmp_path: Path) -> None:
    """place() reuses the folder part of earlier locs with the same head: odd tails (queries,
    fragments, tabs, escapes, '..', too long) and odd heads (bad hosts, ports, depth) must land,
    or be refused, exactly as a sink that never saw another loc places them."""
    import random

    def placed(sink: FolderSink, loc: str) -> object:
        try:
            return sink.place(loc)
        except ValueError as exc:
            return repr(exc)

    pieces = ["a", "b", "%2F", "%2E", ".", "..", "", "%%", "?", "#", "q=1", "\t", "\n", " ", "%25", ".partial-x",
              "%C3%A9", "%FF", "z" * 300, "/"]
    heads = ["http://h.org", "http://H.org", "https://[::1]:8", "http://bad_host", "http://h.org:99999",
             "ftp://h.org", "http://h.org:80", " http://h.org", "http://h.org?x", "http://h.org#f"]
    rng = random.Random(7)
    sink = FolderSink(tmp_path / "copy")
    for _ in range(5000):
        loc = rng.choice(heads) + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        if rng.random() < 0.02:
            loc = rng.choice(heads) + "/a" * 128 + rng.choice(["", "/x"])
        assert placed(sink, loc) == placed(FolderSink(tmp_path / "copy"), loc), loc
    assert sink._folders       # the reuse was exercised


def test_stored_datetimes_are_the_fixed_width_utc_text_for_every_offset_and_year() -> None:
    # to_text's isoformat path writes what strftime wrote (text order is time order in SQLite)
    import random
    from datetime import UTC, datetime, timedelta, timezone

    pick = random.Random(25)
    for _ in range(2000):
        moment = datetime(pick.randint(1001, 9998), pick.randint(1, 12), pick.randint(1, 28), pick.randint(0, 23),
                          pick.randint(0, 59), pick.randint(0, 59), pick.choice((0, pick.randint(0, 999_999))),
                          tzinfo=pick.choice((UTC, timezone(timedelta(minutes=pick.randint(-1439, 1439))))))
        text = to_text(moment)
        assert text == moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") and len(text) == 27
        assert from_text(text) == moment
    # years before 1000 padded too: strftime's "999-..." neither read back nor sorted before "1000-..."
    early = datetime(999, 12, 31, 23, 30, tzinfo=UTC)
    assert to_text(early) == "0999-12-31T23:30:00.000000Z" and from_text(to_text(early)) == early
    assert to_text(early) < to_text(datetime(1000, 1, 1, tzinfo=UTC))


def test_records_of_both_shapes_commit_in_order_and_read_back_whole(tmp_path: Path) -> None:
    # Settled records (no change held back) are written by a shorter insert; a batch that mixes
    # them with held-back ones still commits in order, so a later record of a loc wins.
    state = SyncState(tmp_path / "state.db")
    try:
        when = from_text("2026-11-21T10:00:00.000000Z")
        settled = ResourceRecord("http://e.org/a", "e.org/a", ResourceState.OK, "m" * 32, "s" * 64, 3, when, None,
                                 "baseline")
        held = ResourceRecord("http://e.org/a", "e.org/a", ResourceState.FAILED, None, None, None, when, when,
                              "updated", "md5:x", "GET answered 500", 2, 1234.5, '{"change": "updated"}')
        other = ResourceRecord("http://e.org/b", "e.org/b", ResourceState.OK, "n" * 32, None, 0, None, None, "created")
        state.commit([held, settled, other])              # held, then settled: the settled one wins
        assert state.records(["http://e.org/a", "http://e.org/b"]) == {settled.loc: settled, other.loc: other}
        state.commit([settled, other, held])              # and the other way round
        assert state.record("http://e.org/a") == held
        assert isinstance(state.record("http://e.org/a").state, ResourceState)   # type: ignore[union-attr]
        assert state.counts_by_state() == {"failed": 1, "ok": 1}
    finally:
        state.close()

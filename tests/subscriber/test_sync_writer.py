"""The Destination's batched file writer: every file lands with its bytes, files that queue up
while the thread writes go together, and one file's conflict is that file's error alone."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rsnotify.subscriber.sync.sink import FolderSink, PathConflictError
from rsnotify.subscriber.sync.writer import BatchWriter


def test_concurrent_writes_land_whole_in_few_hand_offs(tmp_path: Path) -> None:
    sink = FolderSink(tmp_path / "copy")
    writer = BatchWriter(sink)
    paths = [sink.path_for(f"http://example.org/r/{n}") for n in range(300)]

    async def run() -> None:
        await asyncio.gather(*(writer.write(path, f"body {n}".encode() * 100) for n, path in enumerate(paths)))

    asyncio.run(run())
    assert [p.read_bytes() for p in paths] == [f"body {n}".encode() * 100 for n in range(300)]
    assert 1 < writer.batches < 300 / 10         # batched, and more than one batch (256 at most each)
    assert not [p for p in paths[0].parent.iterdir() if p.name.startswith(".")]   # no partial file left


def test_a_conflict_fails_only_its_own_file(tmp_path: Path) -> None:
    sink = FolderSink(tmp_path / "copy")
    writer = BatchWriter(sink)
    blocked = sink.path_for("http://example.org/a/b")
    blocked.parent.parent.mkdir(parents=True)
    blocked.parent.write_bytes(b"a file where the folder must be")
    fine = sink.path_for("http://example.org/c")

    async def run() -> list[object]:
        return await asyncio.gather(writer.write(blocked, b"x"), writer.write(fine, b"y"), return_exceptions=True)

    outcomes = asyncio.run(run())
    assert isinstance(outcomes[0], PathConflictError) and outcomes[1] is None
    assert fine.read_bytes() == b"y"
    assert blocked.parent.read_bytes() == b"a file where the folder must be"


@pytest.mark.parametrize("count", [1, 2])
def test_a_lone_write_is_not_kept_waiting(tmp_path: Path, count: int) -> None:
    sink = FolderSink(tmp_path / "copy")
    writer = BatchWriter(sink)
    paths = [sink.path_for(f"http://example.org/{n}") for n in range(count)]

    async def run() -> None:
        for path in paths:    # one after another: each batch holds one file
            await asyncio.wait_for(writer.write(path, b"z"), 5)

    asyncio.run(run())
    assert writer.batches == count and all(p.read_bytes() == b"z" for p in paths)


def test_relative_paths_are_the_same_as_pathlibs(tmp_path: Path) -> None:
    sink = FolderSink(tmp_path / "copy")
    locs = ["http://example.org/r/1", "http://example.org:8080/a/b/c.xml", "https://example.org/d/?q=1&r=2",
            "http://example.org/%C3%A9t%C3%A9/x y", "http://example.org/"]
    for loc in locs:
        path = sink.path_for(loc)
        assert sink.relative(path) == path.relative_to(sink.root).as_posix()
    assert sink.relative(sink.root) == "."


def test_the_slow_disk_verdict_is_the_median_of_the_last_writes(tmp_path: Path) -> None:
    # The running count of slow writes says what the median of the last WRITE_SAMPLES said.
    import random
    import statistics

    from rsnotify.subscriber.sync.fetcher import SLOW_WRITE, WRITE_SAMPLES, Fetcher

    pick = random.Random(7)

    async def run() -> None:
        fetcher = Fetcher(FolderSink(tmp_path / "copy"))
        try:
            seen: list[float] = []
            verdicts = set()
            for _ in range(3000):
                # long runs of quick and of slow writes, and stretches mixed around the line
                sample = pick.choice((SLOW_WRITE / 3, SLOW_WRITE * 3, pick.uniform(0, SLOW_WRITE * 2)))
                seen.append(sample)
                fetcher._timed_write(sample)
                if len(seen) >= WRITE_SAMPLES:
                    expected = statistics.median(seen[-WRITE_SAMPLES:]) > SLOW_WRITE
                    assert fetcher._slow_disk is expected
                    verdicts.add(expected)
                else:
                    assert fetcher._slow_disk is False
            assert verdicts == {True, False}
        finally:
            await fetcher.close()

    asyncio.run(run())

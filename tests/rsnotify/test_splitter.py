"""split_changes: concrete cases behind the property test (limits, ties, bounds, 60k changes)."""
from __future__ import annotations

import random
import time
from datetime import datetime, timedelta, timezone

import pytest

from rsnotify.errors import NotificationError
from rsnotify.notification import ChangeType, ResourceChange
from rsnotify.splitter import split_changes
from rsnotify.xml import parse_notification, to_xml

START = datetime(2024, 1, 1, tzinfo=timezone.utc)


def change(number: int, seconds: float | None) -> ResourceChange:
    at = None if seconds is None else START + timedelta(seconds=seconds)
    return ResourceChange(f"http://example.com/res/{number}", ChangeType.UPDATED, at)


def test_small_input_is_one_document_sorted_and_bounded_by_its_changes() -> None:
    (document,) = split_changes([change(1, 30), change(2, 10), change(3, 20)], up="http://example.com/cl.xml")
    assert [c.loc[-1] for c in document.changes] == ["2", "3", "1"]
    assert (document.from_time, document.until_time) == (START + timedelta(seconds=10), START + timedelta(seconds=30))
    assert document.up == "http://example.com/cl.xml"


def test_entry_limit_chains_intervals_at_the_last_change() -> None:
    documents = split_changes([change(i, i) for i in range(5)], from_time=START - timedelta(hours=1), max_entries=2)
    assert [len(d.changes) for d in documents] == [2, 2, 1]
    assert documents[0].from_time == START - timedelta(hours=1)
    assert [d.until_time for d in documents] == [START + timedelta(seconds=s) for s in (1, 3, 4)]
    assert [d.from_time for d in documents[1:]] == [d.until_time for d in documents[:-1]]


def test_a_group_of_simultaneous_changes_is_not_cut_when_it_fits() -> None:
    changes = [change(0, 0), change(1, 5), change(2, 5), change(3, 5)]
    documents = split_changes(changes, max_entries=3)
    assert [len(d.changes) for d in documents] == [1, 3]
    assert documents[1].changes[0].changed_at > documents[1].from_time


def test_more_simultaneous_changes_than_fit_give_zero_length_intervals() -> None:
    documents = split_changes([change(i, 5) for i in range(5)], max_entries=2)
    assert [len(d.changes) for d in documents] == [2, 2, 1]
    instant = START + timedelta(seconds=5)
    assert all((d.from_time, d.until_time) == (instant, instant) for d in documents)


def test_undated_changes_keep_their_place_after_the_change_before_them() -> None:
    (document,) = split_changes([change(1, 20), change(2, None), change(3, 10)])
    assert [c.loc[-1] for c in document.changes] == ["3", "1", "2"]


def test_byte_limit_is_met_exactly() -> None:
    changes = [change(i, i) for i in range(200)]
    limit = 3_000
    documents = split_changes(changes, max_bytes=limit)
    sizes = [len(to_xml(d)) for d in documents]
    assert max(sizes) <= limit and len(documents) > 1
    assert sum(len(d.changes) for d in documents) == 200


def test_no_changes() -> None:
    assert split_changes([]) == []
    (empty,) = split_changes([], from_time=START, until_time=START + timedelta(minutes=1))
    assert empty.changes == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"from_time": START + timedelta(hours=1), "until_time": START + timedelta(hours=2)},
         r"1 change\(s\) outside \[2024-01-01T01:00:00Z, 2024-01-01T02:00:00Z\], e.g. http://example.com/res/1"),
        ({"until_time": START - timedelta(hours=1)}, "until 2023-12-31T23:00:00Z is before from"),
        ({"max_bytes": 320}, "one change serializes to"),
        ({"max_entries": 0}, "max_entries must be at least 1, got 0"),
    ],
)
def test_impossible_requests_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(NotificationError, match=message):
        split_changes([change(1, 0)], **kwargs)


def test_sixty_thousand_changes_split_quickly_into_valid_documents() -> None:
    changes = [change(i, i // 3) for i in range(60_000)]
    random.Random(7).shuffle(changes)
    started = time.perf_counter()
    documents = split_changes(changes, from_time=START, up="http://example.com/cl.xml")
    elapsed = time.perf_counter() - started
    assert [len(d.changes) for d in documents] == [49_998, 10_002]  # a cut never splits a trio of simultaneous changes
    assert elapsed < 10  # about 0.5 s on one core; generous for a shared CI machine
    last = parse_notification(to_xml(documents[-1]))
    assert last == documents[-1]

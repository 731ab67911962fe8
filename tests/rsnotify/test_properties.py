"""Property tests: serialize -> parse gives the same model; the splitter keeps its invariants."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsnotify.notification import ChangeNotification, ResourceChange
from rsnotify.splitter import split_changes
from rsnotify.xml import parse_notification, to_xml

from .strategies import notifications, resource_changes

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(notifications())
def test_serialize_then_parse_gives_the_same_notification(notification: ChangeNotification) -> None:
    assert parse_notification(to_xml(notification)) == notification


START = datetime(2024, 1, 1, tzinfo=timezone.utc)
# few distinct instants, so simultaneous changes (and groups cut by the limits) are common
TIMES = st.integers(0, 6).map(lambda minutes: START + timedelta(minutes=minutes))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.lists(resource_changes(TIMES), max_size=40),
    max_entries=st.integers(1, 12),
    max_bytes=st.integers(4_000, 12_000),
    bounds=st.booleans(),
)
def test_splitter_invariants(changes: list[ResourceChange], max_entries: int, max_bytes: int, bounds: bool) -> None:
    from_time = START - timedelta(hours=1) if bounds else None
    until_time = START + timedelta(hours=1) if bounds else None
    documents = split_changes(
        changes, from_time=from_time, until_time=until_time, up="http://example.com/cl.xml",
        max_entries=max_entries, max_bytes=max_bytes,
    )
    if not changes:
        assert len(documents) == (1 if bounds else 0)
        return
    # nothing lost, nothing repeated, chronological (stable for equal datetimes)
    carried = [change for document in documents for change in document.changes]
    assert carried == sorted(changes, key=lambda change: change.changed_at)
    # within the limits
    for document in documents:
        assert 1 <= len(document.changes) <= max_entries
        assert len(to_xml(document)) <= max_bytes
    # chained, covering the whole interval
    assert documents[0].from_time == (from_time or carried[0].changed_at)
    assert documents[-1].until_time == (until_time or carried[-1].changed_at)
    for previous, following in zip(documents, documents[1:]):
        assert previous.until_time == following.from_time
        assert previous.until_time == previous.changes[-1].changed_at
        # a boundary change belongs to the earlier document, unless its instant alone overfills one
        if following.changes[0].changed_at == following.from_time:
            assert previous.changes[0].changed_at == following.from_time

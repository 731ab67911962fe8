"""Split any number of resource changes into change notifications within the Sitemap limits.

CN §3 (R-23): many simultaneous changes "must be split into a sequence of change
notifications", and consecutive notifications "must cover consecutive and non-overlapping
temporal from/until intervals" (R-13). What that means here, precisely:

* Documents are in chronological order and chained: document k+1's `from` equals document
  k's `until` (the shared-boundary style of core Change List Indexes). Intervals are closed,
  [from, until], so two neighbours share exactly one instant and never a positive duration.
* Document k's `until` is the datetime of its last change, and a cut never falls inside a
  group of simultaneous changes when the group fits in one document. So every change of
  document k+1 is strictly after its `from`: each document owns (from, until] (the first
  one [from, until]), and a Destination can tell which document a boundary change is in.
* Only when more changes share one instant than fit in a document does the chain pass
  through zero-length intervals [t, t] (the spec cannot be met there: checklist erratum 8).

Changes without a datetime keep their place after the dated change before them. No I/O here.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timezone

from lxml import etree

from .datetimes import format_datetime
from .errors import NotificationError
from .notification import ChangeNotification, ResourceChange
from .safexml import new_root
from .xml import to_xml, write_change

MAX_ENTRIES = 50_000          # Sitemap: <url> entries per document
MAX_BYTES = 50_000_000        # serialized size per document (Sitemap: 50 MB)
_MEASURE_CHUNK = 5_000        # entries serialized at once to measure their sizes
_URL_START = b"<url>"
_LATEST = datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=timezone.utc)


def split_changes(
    changes: Iterable[ResourceChange],
    *,
    from_time: datetime | None = None,
    until_time: datetime | None = None,
    up: str | None = None,
    max_entries: int = MAX_ENTRIES,
    max_bytes: int = MAX_BYTES,
) -> list[ChangeNotification]:
    """Change notifications carrying every change once, in chronological order.

    `from_time`/`until_time` default to the first/last change's datetime; every dated change
    must lie inside them. Each document has at most `max_entries` changes and serializes
    (`to_xml`) to at most `max_bytes`. No changes and no bounds: no documents; no changes
    but both bounds: one empty document for that interval. Raises `NotificationError` when a
    change falls outside the bounds or one change alone exceeds `max_bytes`.
    """
    if max_entries < 1:
        raise NotificationError(f"max_entries must be at least 1, got {max_entries}")
    changes = list(changes)
    if not changes:
        if from_time is None or until_time is None:
            return []
        return [ChangeNotification(from_time, until_time, (), up)]
    ordered, times = _chronological(changes, from_time)
    first = times[0] if from_time is None else from_time
    last = times[-1] if until_time is None else until_time
    _check_bounds(ordered, first, last)
    budget = max_bytes - _header_size(up)
    cuts = _cut_points(times, _entry_sizes(ordered), max_entries, budget)
    notifications = []
    start_time = first
    for index, (start, end) in enumerate(cuts):
        end_time = last if index == len(cuts) - 1 else times[end - 1]
        notifications.append(ChangeNotification(start_time, end_time, tuple(ordered[start:end]), up))
        start_time = end_time
    return notifications


def _chronological(
    changes: list[ResourceChange], from_time: datetime | None
) -> tuple[list[ResourceChange], list[datetime]]:
    """The changes sorted by datetime (stable), and each one's effective datetime."""
    dated = [change.changed_at for change in changes if change.changed_at is not None]
    previous = from_time or (min(dated) if dated else None)
    effective = []
    for change in changes:
        previous = change.changed_at or previous
        effective.append(previous)
    if previous is None:
        raise NotificationError("no change has a datetime and no from_time was given; expected either")
    order = sorted(range(len(changes)), key=effective.__getitem__)  # type: ignore[arg-type]
    return [changes[i] for i in order], [effective[i] for i in order]  # type: ignore[misc]


def _check_bounds(changes: Sequence[ResourceChange], first: datetime, last: datetime) -> None:
    if last < first:
        raise NotificationError(
            f"until {format_datetime(last)} is before from {format_datetime(first)}; expected until >= from"
        )
    outside = [c for c in changes if c.changed_at is not None and not first <= c.changed_at <= last]
    if outside:
        change = outside[0]
        raise NotificationError(
            f"{len(outside)} change(s) outside [{format_datetime(first)}, {format_datetime(last)}], "
            f"e.g. {change.loc} at {format_datetime(change.changed_at)}"  # type: ignore[arg-type]
        )


def _header_size(up: str | None) -> int:
    """An upper bound on a document's size without entries (longest datetime form)."""
    return len(to_xml(ChangeNotification(_LATEST, _LATEST, (), up)))


def _entry_sizes(changes: Sequence[ResourceChange]) -> list[int]:
    """The exact serialized size of each change's `<url>`, measured a chunk at a time.

    `<url>` cannot occur inside text or attribute values (lxml escapes `<`), so the output
    splits exactly at entry starts.
    """
    sizes: list[int] = []
    for offset in range(0, len(changes), _MEASURE_CHUNK):
        root = new_root()
        for change in changes[offset : offset + _MEASURE_CHUNK]:
            write_change(root, change)
        pieces = etree.tostring(root, encoding="UTF-8").split(_URL_START)[1:]
        pieces[-1] = pieces[-1].removesuffix(b"</urlset>")
        sizes.extend(len(piece) + len(_URL_START) for piece in pieces)
    return sizes


def _cut_points(times: list[datetime], sizes: list[int], max_entries: int, budget: int) -> list[tuple[int, int]]:
    """(start, end) index ranges, greedily filled, never splitting a group of equal datetimes
    that could fit in one document."""
    cuts = []
    start, count = 0, len(sizes)
    while start < count:
        end, total = start, 0
        while end < count and end - start < max_entries and total + sizes[end] <= budget:
            total += sizes[end]
            end += 1
        if end == start:
            raise NotificationError(
                f"one change serializes to {sizes[start]} bytes, more than the {budget} bytes left in a "
                f"document under max_bytes; expected a smaller entry or a larger max_bytes"
            )
        if end < count and times[end] == times[end - 1]:
            group = end - 1
            while group > start and times[group - 1] == times[end]:
                group -= 1
            if group > start:  # the group starts inside this document: move it to the next
                end = group
        cuts.append((start, end))
        start = end
    return cuts


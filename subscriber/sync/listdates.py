"""The dates a Source's lists may not carry: later than now + FUTURE_SKEW, the rule the hub and
the callback already apply to notifications (rsnotify.notification.future_problems). A Resource
List's `at`, a Change List's `until` or an entry's `datetime` becomes the sync's high-water mark
(or a record's `changed_at`); one in year 9999 would make every real change after it look old,
so the copy would never change again. Such a list is refused whole (SourceDocumentError): the
run says why and exits 1, and nothing it says moves the high-water mark. No I/O here.
"""
from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from rsnotify.datetimes import format_datetime
from rsnotify.lists import ListInfo, ListRef
from rsnotify.notification import FUTURE_SKEW, ResourceChange, future_problems

from .remote import SourceDocumentError

_BOUNDS = ("at", "completed", "from_", "until")


def refuse_bad_bounds(what: str, url: str, head: ListInfo | ListRef, now: datetime | None = None) -> None:
    """SourceDocumentError when a list's (or an index entry's) at/completed/from/until lies
    further ahead than FUTURE_SKEW, or its `until` before its `from` (an interval that ends
    before it starts tells nothing about which changes it holds)."""
    if head.from_ is not None and head.until is not None and head.until < head.from_:
        raise SourceDocumentError(f"{what} {url} has until={format_datetime(head.until)} before "
                                  f"from={format_datetime(head.from_)}; expected from <= until")
    now = now or datetime.now(UTC)
    limit = now + timedelta(seconds=FUTURE_SKEW)
    late = [(name.rstrip("_"), value) for name in _BOUNDS if (value := getattr(head, name)) is not None
            and value > limit]
    if late:
        shown = now.replace(microsecond=0)
        said = ", ".join(f"{name}={format_datetime(value)}" for name, value in late)
        raise SourceDocumentError(
            f"{what} {url} has {said} in the future; expected at most "
            f"{format_datetime(shown + timedelta(seconds=FUTURE_SKEW))} ({FUTURE_SKEW:g} s after now, "
            f"{format_datetime(shown)}): the Source's clock is wrong, the list is not used")


def refuse_future_changes(url: str, changes: Iterable[ResourceChange], now: datetime | None = None) -> None:
    """SourceDocumentError when a Change List entry's datetime lies further ahead than FUTURE_SKEW."""
    problems = future_problems(changes, None, now or datetime.now(UTC))
    if problems:
        raise SourceDocumentError(f"Change List {url}: {problems[0]}"
                                  + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                                  + "; the Source's clock is wrong, the list is not used")

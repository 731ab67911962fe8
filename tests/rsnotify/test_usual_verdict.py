"""The hub's quick verdict on a publish (notification_scan.is_valid_usual_notification) says
"valid" only for a document that the full reading takes without a problem and that is dated no
later than the limit; anything else it leaves to that reading, which words the problem."""
from __future__ import annotations

import random
from datetime import datetime

import pytest

from rsnotify import xml
from rsnotify.datetimes import utc_stamp
from rsnotify.errors import NotificationParseError, ValidationError
from rsnotify.notification import future_problems
from rsnotify.notification_scan import is_valid_usual_notification

from .test_notification_scan import mutate, usual_body
from .test_quick_reading import make_document

# before, at and after the datetimes the generated documents carry (2025-01-01T00:00:00-09)
LIMITS = ["2025-01-01T00:00:03Z", "2025-01-01T00:00:05Z", "2030-01-01T00:00:00Z"]


def full_verdict(body: bytes, latest: str) -> bool:
    """What the hub decides without the quick verdict: the whole reading, then the future check."""
    try:
        notification = xml.parse_notification(body)
    except (ValidationError, NotificationParseError):
        return False
    return not future_problems(notification.changes, notification.until_time, datetime.fromisoformat(latest), 0)


def disagreements(bodies: list[bytes]) -> tuple[list[tuple[bytes, str]], int]:
    """(bodies the quick verdict takes and the full reading refuses, how many it takes)."""
    wrong, taken = [], 0
    for body in bodies:
        for latest in LIMITS:
            if is_valid_usual_notification(body, latest):
                taken += 1
                if not full_verdict(body, latest):
                    wrong.append((body, latest))
    return wrong, taken


def test_generated_notifications_it_takes_are_all_valid() -> None:
    rng = random.Random(1126)
    bodies = [make_document(rng) for _ in range(3000)]
    wrong, taken = disagreements(bodies)
    assert not wrong, wrong[:3]
    assert taken > 150     # a share of them: the good ones with every value of its usual form


def test_mutated_notifications_it_takes_are_all_valid() -> None:
    rng = random.Random(2611)
    sources = [usual_body(rng, rng.randint(0, 5)) for _ in range(40)]
    # what to_xml writes is taken whenever the whole reading finds it valid, at any limit
    assert all(is_valid_usual_notification(body, latest) == full_verdict(body, latest)
               for body in sources for latest in LIMITS)
    bodies = [mutate(rng.choice(sources), rng) for _ in range(6000)]
    wrong, taken = disagreements(bodies)
    assert not wrong, wrong[:3]
    assert taken > 300


def notification(*stamps: str, frm: str = "2024-01-01T00:00:00Z", until: str = "2024-12-31T00:00:00Z",
                 capability: str = "change-notification", loc: str = "http://example.org/a") -> bytes:
    entries = "".join(f'<url><loc>{loc}</loc><rs:md change="updated" datetime="{stamp}"/></url>' for stamp in stamps)
    return (f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
            f'<rs:md capability="{capability}" from="{frm}" until="{until}"/>{entries}</urlset>').encode()


LATEST = "2025-01-01T00:00:00Z"


@pytest.mark.parametrize("body", [
    notification("2024-02-29T00:00:00Z"),                                   # a leap day
    notification("2024-03-01T00:00:00Z", "2024-03-01T00:00:00Z"),           # two changes in one second
    notification(until=LATEST),                                             # until at the limit exactly
    notification(),                                                         # no entries
])
def test_valid_documents_of_the_usual_form_are_taken(body: bytes) -> None:
    assert full_verdict(body, LATEST)
    assert is_valid_usual_notification(body, LATEST)


@pytest.mark.parametrize("body", [
    notification("2023-02-29T00:00:00Z"),                                   # no leap day in 2023
    notification("2024-04-31T00:00:00Z"),                                   # April has 30 days
    notification("2024-03-02T00:00:00Z", "2024-03-01T00:00:00Z"),           # out of order
    notification("2023-12-31T23:59:59Z"),                                   # before from
    notification(until="2025-01-01T00:00:01Z"),                             # a second past the limit
    notification(frm="2024-12-31T00:00:01Z"),                               # until before from
    notification(frm="0000-01-01T00:00:00Z"),                               # no year 0
    notification("2024-03-01T00:00:00Z", loc="relative/path"),                                    # not an http(s) URL
])
def test_invalid_documents_of_the_usual_form_are_left_to_the_full_reading(body: bytes) -> None:
    assert not full_verdict(body, LATEST)
    assert not is_valid_usual_notification(body, LATEST)


@pytest.mark.parametrize("body", [
    notification("2024-03-01T00:00:00Z", capability="changelist-notification"),   # the legacy capability
    notification("2024-03-01T01:00:00+01:00"),                              # an offset
    notification("2024-03-01T00:00:00.5Z"),                                 # a fraction
    notification("2024-03-01T00:00:00Z", loc="http://ex\u00e4mple.org/\u00fc"),                   # an IRI
    notification("2024-03-01T00:00:00Z", loc="http://example.org/a?b=1&amp;c=2"),                 # an entity
])
def test_valid_documents_of_other_forms_are_left_to_the_full_reading(body: bytes) -> None:
    assert full_verdict(body, LATEST)
    assert not is_valid_usual_notification(body, LATEST)


def test_the_limit_is_the_whole_second_a_time_falls_in() -> None:
    assert utc_stamp(1735689600.999) == "2025-01-01T00:00:00Z"
    assert utc_stamp(1735689601.0) == "2025-01-01T00:00:01Z"
    assert utc_stamp(-0.5) == "1969-12-31T23:59:59Z"

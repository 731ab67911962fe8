"""Hypothesis strategies for the document model (shared by the property tests)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hypothesis import strategies as st

from rsnotify.notification import ChangeNotification, ChangeType, Link, ResourceChange

# printable, no whitespace (loc is stripped), nothing XML 1.0 cannot carry, no format character
# (a loc with a bidi control such as U+202A is refused, as spoofing: safexml._SPACES_AND_CONTROLS)
SAFE_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Cf", "Cn", "Co", "Zs", "Zl", "Zp")), min_size=1,
    max_size=12,
)
URIS = st.builds(lambda path: f"http://example.com/{path}", SAFE_TEXT)
ATTRIBUTE_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Cn", "Co")), max_size=12)
OFFSETS = st.builds(lambda minutes: timezone(timedelta(minutes=minutes)), st.integers(-23 * 60 - 59, 23 * 60 + 59))
DATETIMES = st.datetimes(
    min_value=datetime(1990, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.one_of(st.just(timezone.utc), OFFSETS)
)
HASHES = st.lists(
    st.tuples(st.sampled_from(["md5", "sha-1", "sha-256"]), st.text("0123456789abcdef", min_size=1, max_size=64)),
    max_size=2,
).map(tuple)
FOREIGN = st.dictionaries(
    st.sampled_from(["{http://example.org/ns}batch", "{http://example.org/other}x", "encoding"]), ATTRIBUTE_TEXT, max_size=2
).map(lambda attributes: tuple(attributes.items()))
MEDIA_TYPES = st.sampled_from([None, "text/html", "application/atom+xml", "text/plain; charset=utf-8"])

LINKS = st.builds(
    Link,
    rel=st.sampled_from(["describedby", "alternate", "canonical", "http://www.openarchives.org/rs/terms/patch"]),
    href=URIS,
    media_type=MEDIA_TYPES,
    hashes=HASHES,
    length=st.none() | st.integers(0, 10**12),
    modified=st.none() | DATETIMES,
    path=st.none() | st.just("/resources/res1"),
    pri=st.none() | st.integers(1, 999_999),
    extra=FOREIGN,
)


def resource_changes(changed_at: st.SearchStrategy[datetime | None]) -> st.SearchStrategy[ResourceChange]:
    return st.builds(
        ResourceChange,
        loc=URIS,
        change=st.sampled_from(list(ChangeType)),
        changed_at=changed_at,
        lastmod=st.none() | DATETIMES,
        hashes=HASHES,
        length=st.none() | st.integers(0, 10**12),
        media_type=MEDIA_TYPES,
        links=st.lists(LINKS, max_size=2).map(tuple),
        extra=FOREIGN,
    )


@st.composite
def notifications(draw: st.DrawFn) -> ChangeNotification:
    from_time = draw(DATETIMES)
    span = timedelta(seconds=draw(st.integers(0, 10**6)))
    drawn = draw(st.lists(st.none() | st.integers(0, int(span.total_seconds())), max_size=6))
    # undated changes may sit anywhere; dated ones must be in forward chronological order
    dated = iter(sorted(offset for offset in drawn if offset is not None))
    offsets = [None if offset is None else next(dated) for offset in drawn]
    changes = [draw(resource_changes(st.just(None if o is None else from_time + timedelta(seconds=o)))) for o in offsets]
    return ChangeNotification(
        from_time,
        from_time + span,
        tuple(changes),
        up=draw(st.none() | URIS),
        links=tuple(draw(st.lists(LINKS, max_size=2))),
        capability=draw(st.sampled_from(["change-notification", "changelist-notification"])),
    )

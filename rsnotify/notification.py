"""The document model: change notifications, resource changes, links, Capability Lists.

Typed, frozen dataclasses that use the specs' words. No XML here (see `rsnotify.xml`),
no I/O. Rules that need no XML are checked in `__post_init__`, so a model built in code is
held to the same rules as one parsed from a document.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from enum import Enum

from .datetimes import format_datetime  # re-exported: callers import it from here too
from .errors import NotificationError

CHANGE_NOTIFICATION = "change-notification"
LEGACY_CHANGE_NOTIFICATION = "changelist-notification"  # Change Notification 1.0's value
CAPABILITY_LIST = "capabilitylist"
SOURCE_DESCRIPTION = "description"


class ChangeType(str, Enum):
    """The `change` attribute of a resource change's `<rs:md>`."""

    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"


def _check_aware(name: str, value: datetime | None) -> None:
    if value is not None and value.tzinfo is None:
        raise NotificationError(f"{name} must be timezone-aware, got naive {value.isoformat()}")


@dataclass(frozen=True, slots=True)
class Link:
    """An `<rs:ln>` element: a typed link with the core spec's optional attributes."""

    rel: str
    href: str
    media_type: str | None = None            # XML: type
    hashes: tuple[tuple[str, str], ...] = ()  # XML: hash, as (algorithm, hex) pairs
    length: int | None = None
    modified: datetime | None = None
    path: str | None = None
    pri: int | None = None
    extra: tuple[tuple[str, str], ...] = ()  # other attributes, Clark-notation names kept

    def __post_init__(self) -> None:
        if not self.rel:
            raise NotificationError("<rs:ln> needs a rel, got an empty one")
        if not self.href:
            raise NotificationError(f"<rs:ln rel='{self.rel}'> needs an href, got an empty one")
        if self.length is not None and self.length < 0:
            raise NotificationError(f"<rs:ln> length must be >= 0, got {self.length}")
        _check_aware("<rs:ln> modified", self.modified)


@dataclass(frozen=True, slots=True)
class ResourceChange:
    """One `<url>` of a change notification: what changed, how and when."""

    loc: str
    change: ChangeType
    changed_at: datetime | None = None        # XML: rs:md/@datetime
    lastmod: datetime | None = None
    hashes: tuple[tuple[str, str], ...] = ()  # XML: rs:md/@hash, as (algorithm, hex) pairs
    length: int | None = None
    media_type: str | None = None             # XML: rs:md/@type
    links: tuple[Link, ...] = ()
    extra: tuple[tuple[str, str], ...] = ()   # foreign rs:md attributes, Clark-notation names

    def __post_init__(self) -> None:
        if not self.loc:
            raise NotificationError("a resource change needs a <loc>, got an empty one")
        if not isinstance(self.change, ChangeType):
            try:
                object.__setattr__(self, "change", ChangeType(self.change))
            except ValueError:
                raise NotificationError(
                    f"<rs:md> for {self.loc} has change='{self.change}'; "
                    "expected created, updated or deleted"
                ) from None
        if self.length is not None and self.length < 0:
            raise NotificationError(f"<rs:md> for {self.loc} has length={self.length}; expected >= 0")
        # the names are built only for a naive value: a parse builds one of these per entry
        if self.changed_at is not None and self.changed_at.tzinfo is None:
            _check_aware(f"datetime of {self.loc}", self.changed_at)
        if self.lastmod is not None and self.lastmod.tzinfo is None:
            _check_aware(f"lastmod of {self.loc}", self.lastmod)

    @property
    def hash(self) -> str | None:
        """The XML `hash` attribute value: space-separated `algo:hex`, or None."""
        return " ".join(f"{a}:{h}" for a, h in self.hashes) or None


def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[object, object], None], ...]:
    """The slots' own setters, in `names` order: they store a value past the frozen __setattr__."""
    if names != tuple(field.name for field in fields(cls)):
        raise TypeError(f"{cls.__name__}'s fields are {[f.name for f in fields(cls)]}, not {list(names)}")
    return tuple(cls.__dict__[name].__set__ for name in names)


(_set_loc, _set_change, _set_changed_at, _set_lastmod, _set_hashes, _set_length, _set_media_type, _set_links,
 _set_extra) = _slot_setters(ResourceChange, ("loc", "change", "changed_at", "lastmod", "hashes", "length",
                                              "media_type", "links", "extra"))
_new = object.__new__


def prechecked_change(
    loc: str,
    change: ChangeType,
    changed_at: datetime | None,
    hashes: tuple[tuple[str, str], ...],
    length: int | None,
    media_type: str | None,
) -> ResourceChange:
    """ResourceChange(loc, change, changed_at, None, hashes, length, media_type) without the
    __post_init__ checks, for a reader that has held the values to them already: loc not empty,
    change a ChangeType, length None or >= 0, changed_at None or timezone-aware.

    Half the cost of the checked constructor, which a notification pays once per entry on every
    publish; anything else builds one the checked way. Field order is asserted at import.
    """
    built = _new(ResourceChange)
    _set_loc(built, loc)
    _set_change(built, change)
    _set_changed_at(built, changed_at)
    _set_lastmod(built, None)
    _set_hashes(built, hashes)
    _set_length(built, length)
    _set_media_type(built, media_type)
    _set_links(built, ())
    _set_extra(built, ())
    return built


def notification_problems(
    from_time: datetime | None, until_time: datetime | None, changes: tuple[ResourceChange, ...]
) -> list[str]:
    """Every document-level rule a change notification breaks, one message each."""
    problems: list[str] = []
    if from_time is None:
        problems.append("<rs:md> of <urlset> has no from; expected a W3C datetime")
    if until_time is None:
        problems.append("<rs:md> of <urlset> has no until; expected a W3C datetime")
    problems.extend(change_order_problems(from_time, until_time, changes))
    return problems


def change_order_problems(
    from_time: datetime | None, until_time: datetime | None, changes: Iterable[ResourceChange]
) -> list[str]:
    """The interval and ordering rules: until >= from, every datetime inside [from, until],
    entries in forward chronological order. Missing bounds are skipped (reported elsewhere)."""
    problems: list[str] = []
    if from_time and until_time and until_time < from_time:
        problems.append(
            f"<rs:md> of <urlset> has until={format_datetime(until_time)} before "
            f"from={format_datetime(from_time)}; expected until >= from"
        )
    previous: datetime | None = None
    for change in changes:
        when = change.changed_at
        if when is None:
            continue
        if from_time and when < from_time or until_time and when > until_time:
            problems.append(
                f"<rs:md> for {change.loc} has datetime={format_datetime(when)}; expected a "
                f"datetime inside [{_fmt(from_time)}, {_fmt(until_time)}]"
            )
        if previous is not None and when < previous:
            problems.append(
                f"<url> for {change.loc} has datetime={format_datetime(when)} before the previous "
                f"entry's {format_datetime(previous)}; expected forward chronological order"
            )
        previous = when
    return problems


FUTURE_SKEW = 300.0     # s a datetime may lie ahead of the reader's clock: clocks of two machines drift
SHOWN_FUTURE = 5        # future changes named one by one in a refusal; the rest are counted


def future_problems(
    changes: Iterable[ResourceChange], until_time: datetime | None, now: datetime, skew: float = FUTURE_SKEW
) -> list[str]:
    """The datetimes later than `now` + `skew` seconds, one message each (none: all fine).

    A change's datetime is when it happened and `until` the end of what a notification
    covers, so neither can be in the future beyond clock drift. One that is would move the
    Source's from/until chain (and each Destination's checkpoint) past every real change to
    come, so every later notification would look older than it.
    """
    try:
        limit = now + timedelta(seconds=skew)
    except OverflowError:       # a skew reaching past the last datetime there is: nothing is later
        return []
    late = [(change.loc, when) for change in changes if (when := change.changed_at) is not None and when > limit]
    if not late and (until_time is None or until_time <= limit):
        return []               # the usual case, on every publish and delivery: nothing to format
    shown = now.replace(microsecond=0)     # whole seconds read better; the check itself is exact
    expected = (f"expected at most {format_datetime(shown + timedelta(seconds=skew))} "
                f"({skew:g} s after now, {format_datetime(shown)})")
    problems = [
        f"<rs:md> for {loc} has datetime={format_datetime(when)} in the future; "
        f"a change's datetime is when it happened: {expected}"
        for loc, when in late[:SHOWN_FUTURE]
    ]
    if len(late) > SHOWN_FUTURE:
        problems.append(f"... and {len(late) - SHOWN_FUTURE} more change(s) dated in the future")
    if until_time is not None and until_time > limit:
        problems.append(f"<rs:md> of <urlset> has until={format_datetime(until_time)} in the future; {expected}")
    return problems


def _fmt(value: datetime | None) -> str:
    return format_datetime(value) if value else "?"


@dataclass(frozen=True, slots=True)
class ChangeNotification:
    """A change-notification `<urlset>`: the interval it covers and its resource changes."""

    from_time: datetime                      # XML: rs:md/@from
    until_time: datetime                     # XML: rs:md/@until
    changes: tuple[ResourceChange, ...] = ()
    up: str | None = None                    # href of <rs:ln rel="up">: the Capability List
    links: tuple[Link, ...] = ()             # other <rs:ln> children of <urlset>
    capability: str = CHANGE_NOTIFICATION    # LEGACY_CHANGE_NOTIFICATION when parsed from 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "changes", tuple(self.changes))
        object.__setattr__(self, "links", tuple(self.links))
        _check_aware("from", self.from_time)
        _check_aware("until", self.until_time)
        if self.capability not in (CHANGE_NOTIFICATION, LEGACY_CHANGE_NOTIFICATION):
            raise NotificationError(
                f"<rs:md> of <urlset> has capability='{self.capability}'; "
                f"expected {CHANGE_NOTIFICATION}"
            )
        problems = notification_problems(self.from_time, self.until_time, self.changes)
        if problems:
            raise NotificationError("\n".join(problems))

    @property
    def is_legacy(self) -> bool:
        """True when the document used Change Notification 1.0's `changelist-notification`."""
        return self.capability == LEGACY_CHANGE_NOTIFICATION


(_set_from_time, _set_until_time, _set_changes, _set_up, _set_notification_links, _set_capability) = _slot_setters(
    ChangeNotification, ("from_time", "until_time", "changes", "up", "links", "capability"))


def prechecked_notification(
    from_time: datetime,
    until_time: datetime,
    changes: tuple[ResourceChange, ...],
    up: str | None,
    links: tuple[Link, ...],
    capability: str,
) -> ChangeNotification:
    """ChangeNotification(...) without the __post_init__ checks, for a reader that has held the
    values to them already (both bounds timezone-aware, a known capability, no
    notification_problems); the changes' order and interval are otherwise checked twice a publish.
    """
    built = _new(ChangeNotification)
    _set_from_time(built, from_time)
    _set_until_time(built, until_time)
    _set_changes(built, changes)
    _set_up(built, up)
    _set_notification_links(built, links)
    _set_capability(built, capability)
    return built


@dataclass(frozen=True, slots=True)
class CapabilityEntry:
    """One `<url>` of a Capability List (or Source Description): a document and its capability."""

    loc: str
    capability: str | None = None
    links: tuple[Link, ...] = ()
    lastmod: datetime | None = None
    extra: tuple[tuple[str, str], ...] = ()  # other rs:md attributes, kept so edits lose nothing

    def links_with(self, rel: str) -> list[str]:
        return [link.href for link in self.links if link.rel == rel]


@dataclass(frozen=True, slots=True)
class Channel:
    """A change-notification channel: the WebSub topic and the hub(s) that serve it."""

    topic: str
    hubs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CapabilityList:
    """A `<urlset>` with capability="capabilitylist": the capabilities for one set of resources."""

    entries: tuple[CapabilityEntry, ...] = ()
    up: str | None = None                     # the Source Description
    links: tuple[Link, ...] = ()              # other <rs:ln> children of <urlset>
    extra_md: tuple[tuple[str, str], ...] = ()  # other attributes of the root <rs:md>

    def by_capability(self, capability: str) -> list[CapabilityEntry]:
        return [entry for entry in self.entries if entry.capability == capability]

    def change_notification_channels(self) -> list[Channel]:
        """The channels advertised here; the legacy capability value is accepted too."""
        return [
            Channel(entry.loc, tuple(entry.links_with("hub")))
            for entry in self.entries
            if entry.capability in (CHANGE_NOTIFICATION, LEGACY_CHANGE_NOTIFICATION)
        ]


@dataclass(frozen=True, slots=True)
class SourceDescription:
    """A `<urlset>` with capability="description": pointers to a Source's Capability Lists."""

    entries: tuple[CapabilityEntry, ...] = ()
    links: tuple[Link, ...] = ()

    @property
    def capability_lists(self) -> list[str]:
        return [e.loc for e in self.entries if e.capability in (None, CAPABILITY_LIST)]

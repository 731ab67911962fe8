"""Turn what a Source has at hand into `ResourceChange`s: dataclasses, tuples, dicts, JSON
Lines, and the CLI's `URI@DATETIME` form; then order them chronologically.

No I/O here (callers read files and pass lines in).
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from rsnotify.datetimes import parse_w3c_datetime
from rsnotify.errors import NotificationError
from rsnotify.notification import ChangeType, ResourceChange

from .errors import ChangeInputError

# What `Publisher.publish` accepts for one change.
ChangeLike = ResourceChange | tuple | Mapping[str, Any]

# JSON / dict keys -> ResourceChange fields; `uri` is accepted as a synonym of `loc`.
_KEYS = {
    "loc": "loc",
    "uri": "loc",
    "change": "change",
    "datetime": "changed_at",
    "lastmod": "lastmod",
    "hash": "hashes",
    "length": "length",
    "type": "media_type",
}
_LOOKS_LIKE_DATETIME = re.compile(r"\d{4}(?:-|$)")


def to_resource_change(item: ChangeLike, now: datetime) -> ResourceChange:
    """One resource change from a dataclass, a `(loc, change[, datetime])` tuple or a dict.

    A change without a datetime gets `now`. Raises ChangeInputError saying what was wrong.
    """
    if isinstance(item, ResourceChange):
        return item if item.changed_at is not None else dataclasses.replace(item, changed_at=now)
    if isinstance(item, tuple):
        return _from_tuple(item, now)
    if isinstance(item, Mapping):
        return _from_mapping(item, now)
    raise ChangeInputError(
        f"a change must be a ResourceChange, a (loc, change[, datetime]) tuple or a dict, "
        f"got {type(item).__name__} {item!r:.80}"
    )


def to_resource_changes(items: Iterable[ChangeLike], now: Callable[[], datetime]) -> list[ResourceChange]:
    """Every item as a resource change, in forward chronological order (stable for ties).

    All items are checked; one ChangeInputError lists every bad one (numbered from 1).
    """
    changes: list[ResourceChange] = []
    problems: list[str] = []
    stamp = now()
    for index, item in enumerate(items, 1):
        try:
            changes.append(to_resource_change(item, stamp))
        except ChangeInputError as exc:
            problems.append(f"change #{index}: {exc}")
    if problems:
        raise ChangeInputError("\n".join(problems))
    return sort_chronologically(changes)


def sort_chronologically(changes: Iterable[ResourceChange]) -> list[ResourceChange]:
    """Forward chronological order (the spec's R-22); equal datetimes keep their given order."""
    return sorted(changes, key=lambda change: change.changed_at)  # type: ignore[arg-type, return-value]


def _from_tuple(item: tuple, now: datetime) -> ResourceChange:
    if not 2 <= len(item) <= 3:
        raise ChangeInputError(f"a change tuple must be (loc, change) or (loc, change, datetime), got {item!r:.80}")
    loc, change, *rest = item
    return _build(loc=loc, change=change, changed_at=rest[0] if rest else None, now=now)


def _from_mapping(item: Mapping[str, Any], now: datetime) -> ResourceChange:
    unknown = sorted(set(item) - set(_KEYS))
    if unknown:
        raise ChangeInputError(
            f"a change has unknown key(s) {', '.join(unknown)}; expected some of "
            "loc, change, datetime, lastmod, hash, length, type"
        )
    fields = {_KEYS[key]: value for key, value in item.items() if value is not None}
    return _build(now=now, **fields)


def _build(now: datetime, **fields: Any) -> ResourceChange:
    loc = fields.get("loc")
    if not isinstance(loc, str) or not loc.strip():
        raise ChangeInputError(f"a change needs a loc (the resource's URI), got {_shown(loc)}")
    fields["loc"] = loc.strip()
    change = fields.get("change")
    if isinstance(change, str):
        fields["change"] = change.strip().lower()
    elif not isinstance(change, ChangeType):
        raise ChangeInputError(f"change of {loc} must be created, updated or deleted, got {_shown(change)}")
    for name in ("changed_at", "lastmod"):
        if name in fields:
            fields[name] = _datetime(fields[name], f"{'datetime' if name == 'changed_at' else name} of {loc}")
    if fields.get("changed_at") is None:
        fields["changed_at"] = now
    if "hashes" in fields:
        fields["hashes"] = _hashes(fields["hashes"], loc)
    if "length" in fields:
        fields["length"] = _length(fields["length"], loc)
    try:
        return ResourceChange(**fields)
    except NotificationError as exc:
        raise ChangeInputError(str(exc)) from None


def _shown(value: Any) -> str:
    """A value for a message: `nothing` for a missing one (JSON null or no key), never Python's None."""
    return "nothing" if value is None else repr(value)


def _datetime(value: Any, what: str) -> datetime | None:
    if value is None or isinstance(value, datetime):
        if isinstance(value, datetime) and value.tzinfo is None:
            raise ChangeInputError(f"{what} must be timezone-aware, got naive {value.isoformat()}")
        return value
    if isinstance(value, str):
        try:
            return parse_w3c_datetime(value)
        except NotificationError as exc:
            raise ChangeInputError(f"{what}: {exc}") from None
    raise ChangeInputError(f"{what} must be a W3C datetime text or a datetime, got {value!r}")


def _hashes(value: Any, loc: str) -> tuple[tuple[str, str], ...]:
    """`"md5:ab12 sha-256:cd34"` (the XML form), a list of such items, or (algo, hex) pairs."""
    items = value.split() if isinstance(value, str) else list(value)
    pairs: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, (tuple, list)) and len(item) == 2:
            algorithm, digest = item
        elif isinstance(item, str) and ":" in item:
            algorithm, _, digest = item.partition(":")
        else:
            raise ChangeInputError(f"hash of {loc} must be 'algorithm:hex' items such as md5:1584abdf, got {item!r}")
        if not algorithm or not re.fullmatch(r"[0-9a-fA-F]+", str(digest)):
            raise ChangeInputError(f"hash of {loc} must be 'algorithm:hex' items such as md5:1584abdf, got {item!r}")
        pairs.append((str(algorithm).lower(), str(digest).lower()))
    return tuple(pairs)


def _length(value: Any, loc: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise ChangeInputError(f"length of {loc} must be a non-negative integer, got {value!r}")
    return int(value)


def parse_change_option(change: ChangeType, text: str, now: datetime) -> ResourceChange:
    """The CLI's `--updated URI` or `--updated URI@DATETIME` value as a resource change.

    The datetime is what follows the last `@` when that starts like a year (`2024`,
    `2024-05-01T10:00:00Z`); otherwise the whole text is the URI (so `http://user@host/` works).
    """
    uri, at, tail = text.rpartition("@")
    if at and _LOOKS_LIKE_DATETIME.match(tail.strip()):
        try:
            when = parse_w3c_datetime(tail)
        except NotificationError as exc:
            raise ChangeInputError(f"--{change.value} {text}: {exc}") from None
        return _build(loc=uri, change=change, changed_at=when, now=now)
    if at and len(uri) >= _authority_end(text):
        # An @ past the host is meant as URI@DATETIME far more often than as part of a path:
        # publishing a loc ending in "@yesterday" would be silent and wrong.
        raise ChangeInputError(f"--{change.value} {text}: {tail!r} after the last @ is not a W3C datetime "
                               "(e.g. 2024-05-01T10:00:00Z); write an @ that belongs to the URI as %40")
    return _build(loc=text, change=change, now=now)


def _authority_end(url: str) -> int:
    """Where `url`'s scheme://host[:port] part ends (0 when it has none)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return 0
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return len(scheme) + len(sep) + end


def parse_json_lines(lines: Iterable[str], now: datetime, source: str = "input") -> list[ResourceChange]:
    """Resource changes from JSON Lines: one object per line, blank lines ignored.

    Every line is checked; one ChangeInputError lists every bad line as `source:line: problem`.
    """
    changes: list[ResourceChange] = []
    problems: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{source}:{number}: not JSON ({exc.msg} at column {exc.colno})")
            continue
        if not isinstance(item, dict):
            problems.append(f"{source}:{number}: expected a JSON object with loc and change, got {line.strip()[:60]}")
            continue
        try:
            changes.append(_from_mapping(item, now))
        except ChangeInputError as exc:
            problems.append(f"{source}:{number}: {exc}")
    if problems:
        raise ChangeInputError("\n".join(problems))
    return changes

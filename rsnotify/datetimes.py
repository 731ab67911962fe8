"""W3C Datetime (NOTE-datetime-19980827): read the whole profile, write UTC `...Z`.

ResourceSync uses this profile for from, until, datetime, lastmod and modified. We accept
every form it allows (Postel) and always emit the spec's recommended complete UTC form.
No I/O here.
"""
from __future__ import annotations

import functools
import math
import re
import time
from datetime import datetime, timedelta, timezone

from .errors import DatetimeError

# YYYY, YYYY-MM, YYYY-MM-DD, then optionally Thh:mm[:ss[.s+]]TZD with TZD = Z | +hh:mm | -hh:mm.
# A time needs a TZD: the profile has no floating local times.
_W3C_DATETIME = re.compile(
    r"(\d{4})(?:-(\d{2})(?:-(\d{2})"
    r"(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?(?:(Z)|([+-])(\d{2}):(\d{2})))?)?)?",
    re.ASCII,   # \d is 0-9 only: XML Schema dates have ASCII digits ("２０２６" is not a year)
)

# The form almost every datetime has (to_xml writes it): whole seconds in UTC. Such a text is
# what datetime.fromisoformat reads the same way as _parse_any, at a tenth of the cost. The hour
# stops at 23 because some Pythons (3.14) read T24:00:00 as the next midnight; the profile does not.
_UTC_SECONDS = re.compile(r"\d{4}-\d{2}-\d{2}T(?:[01]\d|2[0-3]):\d{2}:\d{2}Z", re.ASCII)

EXAMPLE = "2013-01-03T00:07:22Z"
# Texts in other forms up to this length are remembered (the longest valid one, with nanoseconds
# and an offset, is ~40 characters): a change notification repeats its from/until and neighbouring
# entries share datetimes, and a parse by the grammar costs as much as the rest of reading an entry.
_CACHED_LENGTH = 64


def parse_w3c_datetime(text: str) -> datetime:
    """The timezone-aware UTC datetime that `text` denotes.

    Reduced precision (`2013`, `2013-01`, `2013-01-03`) means the start of that period in UTC.
    Fractions beyond microseconds are truncated. Raises `DatetimeError` for anything else,
    including ISO 8601 forms outside the profile (`20130103`, a space instead of `T`, no TZD).
    """
    if _UTC_SECONDS.fullmatch(text):    # the usual form, read before the cache: cheaper than a miss
        try:
            return datetime.fromisoformat(text)     # tzinfo is timezone.utc, as _parse_any's
        except ValueError:
            pass    # out of range (month 13, second 60): _parse_any words it
    if len(text) <= _CACHED_LENGTH:
        return _parse_remembered(text)   # datetimes are immutable: a shared one is safe
    return _parse_any(text)


def _parse_any(text: str) -> datetime:
    """Every form of the profile, by the grammar; raises DatetimeError with the reason."""
    match = _W3C_DATETIME.fullmatch(text.strip())
    if match is None:
        raise DatetimeError(f"'{text}' is not a W3C datetime; expected e.g. {EXAMPLE}")
    year, month, day, hour, minute, second, fraction, zulu, sign, tz_hour, tz_minute = match.groups()
    try:
        if tz_hour is not None and (int(tz_hour) > 23 or int(tz_minute) > 59):
            raise ValueError("time zone offset out of range")
        value = datetime(
            int(year),
            int(month or 1),
            int(day or 1),
            int(hour or 0),
            int(minute or 0),
            int(second or 0),
            int((fraction or "0")[:6].ljust(6, "0")),
            tzinfo=timezone.utc,
        )
    except ValueError as exc:
        raise DatetimeError(f"'{text}' is not a valid W3C datetime ({exc}); expected e.g. {EXAMPLE}") from None
    if sign is not None:
        offset = timedelta(hours=int(tz_hour), minutes=int(tz_minute))
        # 12:00+02:00 is 10:00Z: the local wall time minus the offset.
        try:
            value = value - offset if sign == "+" else value + offset
        except OverflowError:
            # 0001-01-01T00:00+01:00 is in year 0 in UTC, 9999-12-31T23:59-01:00 in year 10000:
            # a text a Source may send, and no datetime can hold it
            raise DatetimeError(f"'{text}' is outside the years 1 to 9999 in UTC; expected e.g. {EXAMPLE}") from None
    return value


# A refused text raises, and is not remembered.
_parse_remembered = functools.lru_cache(maxsize=4096)(_parse_any)


def utc_stamp(seconds: float) -> str:
    """The whole UTC second that Unix time `seconds` falls in, in the usual form
    (`2013-01-03T00:07:22Z`): texts of that form sort as the instants they denote."""
    return _stamp_of_second(math.floor(seconds))


@functools.lru_cache(maxsize=4)     # callers ask for the same second thousands of times in a row
def _stamp_of_second(whole: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(whole))


def format_datetime(value: datetime) -> str:
    """A W3C datetime in UTC with a `Z`, seconds precision unless there are fractions."""
    utc = value.astimezone(timezone.utc)
    text = utc.isoformat(timespec="microseconds" if utc.microsecond else "seconds")
    return text.replace("+00:00", "Z")

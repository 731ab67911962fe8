"""W3C Datetime: the whole profile is read, UTC `...Z` is written."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from rsnotify.datetimes import format_datetime, parse_w3c_datetime
from rsnotify.errors import DatetimeError
from rsnotify.notification import format_datetime as reexported

UTC = timezone.utc


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2013", datetime(2013, 1, 1, tzinfo=UTC)),
        ("2013-07", datetime(2013, 7, 1, tzinfo=UTC)),
        ("2013-07-16", datetime(2013, 7, 16, tzinfo=UTC)),
        ("2013-07-16T19:20Z", datetime(2013, 7, 16, 19, 20, tzinfo=UTC)),
        ("2013-07-16T19:20+01:00", datetime(2013, 7, 16, 18, 20, tzinfo=UTC)),
        ("2013-07-16T19:20:30Z", datetime(2013, 7, 16, 19, 20, 30, tzinfo=UTC)),
        ("2013-07-16T19:20:30-05:30", datetime(2013, 7, 17, 0, 50, 30, tzinfo=UTC)),
        ("2013-07-16T19:20:30.45+01:00", datetime(2013, 7, 16, 18, 20, 30, 450000, tzinfo=UTC)),
        ("2013-07-16T19:20:30.1234567Z", datetime(2013, 7, 16, 19, 20, 30, 123456, tzinfo=UTC)),
        ("  2013-01-03T00:07:22Z\n", datetime(2013, 1, 3, 0, 7, 22, tzinfo=UTC)),
    ],
)
def test_whole_profile_is_accepted_as_utc(text: str, expected: datetime) -> None:
    value = parse_w3c_datetime(text)
    assert value == expected
    assert value.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "13",
        "2013-7-16",
        "20130716",
        "2013-07-16T19:20",          # a time needs a time zone designator
        "2013-07-16 19:20:30Z",      # ISO 8601 but not the W3C profile
        "2013-07-16T19:20:30.Z",
        "2013-13-01",
        "2013-02-30",
        "2013-07-16T25:00Z",
        "2013-07-16T19:20+24:00",
        "yesterday",
    ],
)
def test_outside_the_profile_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(DatetimeError, match="expected e.g. 2013-01-03T00:07:22Z"):
        parse_w3c_datetime(text)


def test_format_is_utc_with_z_and_fractions_only_when_present() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert format_datetime(datetime(2013, 1, 3, 2, 7, 22, tzinfo=plus_two)) == "2013-01-03T00:07:22Z"
    assert format_datetime(datetime(2013, 1, 3, 0, 7, 22, 5, tzinfo=UTC)) == "2013-01-03T00:07:22.000005Z"
    assert reexported is format_datetime

"""Change Lists and the Change List Index written from the change memory (core §12).

Each list holds its changes in the order recorded (forward chronological), `rs:md from`, and
`until` once closed; closed lists never change again. With more than one list, the stable
Change List URL serves an index of them with per-list `from`/`until`. Streamed: a list is
read from SQLite in chunks and written entry by entry.
"""
from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from typing import BinaryIO

from rsnotify.lists import CHANGE_LIST, ListInfo, ListRef, ListWriter
from rsnotify.notification import Link

from .store import ChangeListRecord, changelists, iter_changes, last_until

_TIME_FORMAT = "%Y%m%dT%H%M%S.%fZ"


def changelist_name(record: ChangeListRecord) -> str:
    """The list's file name: its `from` in UTC and its number, fixed width, so name order is
    time order (the number tells apart lists that start at the same instant: a list closed
    after one notification of a single instant)."""
    return f"changelist-{record.from_time.astimezone(UTC).strftime(_TIME_FORMAT)}-{record.id:09d}.xml"


def write_changelist(
    db: sqlite3.Connection, record: ChangeListRecord, out: BinaryIO, *, up: str, index: str | None = None
) -> None:
    """Write one Change List (`db` in a snapshot transaction); `index` is the rel="index" href."""
    links = (Link("up", up),) + ((Link("index", index),) if index else ())
    info = ListInfo(CHANGE_LIST, from_=record.from_time, until=record.until_time, links=links)
    with ListWriter(out, info) as writer:
        for change in iter_changes(db, record.id):
            writer.write(change)


def write_changelist_index(
    records: list[ChangeListRecord], out: BinaryIO, *, up: str, list_url: Callable[[ChangeListRecord], str]
) -> None:
    """Write the Change List Index: the lists oldest first, with their bounds."""
    last = records[-1]
    info = ListInfo(CHANGE_LIST, is_index=True, from_=records[0].from_time, until=last.until_time, links=(Link("up", up),))
    with ListWriter(out, info) as writer:
        for record in records:
            writer.write(ListRef(list_url(record), from_=record.from_time, until=record.until_time))


def write_changelist_document(
    db: sqlite3.Connection,
    topic: str,
    out: BinaryIO,
    *,
    up: str,
    list_url: Callable[[ChangeListRecord], str],
    now: Callable[[], datetime],
) -> None:
    """What the stable Change List URL serves: the only list itself, or the index of several.

    A topic that has recorded nothing gets an empty open list from the chain's end (or now).
    """
    records = changelists(db, topic)
    if len(records) > 1:
        write_changelist_index(records, out, up=up, list_url=list_url)
        return
    record = records[0] if records else ChangeListRecord(0, last_until(db, topic) or now(), None, 0)
    write_changelist(db, record, out, up=up)


def find_changelist(db: sqlite3.Connection, topic: str, name: str) -> ChangeListRecord | None:
    """The topic's list whose file name is `name`, or None (unknown, or dropped by retention)."""
    return next((record for record in changelists(db, topic) if changelist_name(record) == name), None)

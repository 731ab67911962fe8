"""The Destination's state database: one SQLite file (WAL) per synced folder.

Tables: `channel` (key/value: Source URLs, engine state, the high-water mark H, gaps),
`resources` (one record per loc), `inbox` (every delivery, written before its 2xx),
`hubs` (last sequence per hub), `seen` (scratch: locs met in the current Resource List),
`refused` (the locs a trust rule refuses now, one row each, so a hostile entry that stays listed
counts once, not once per poll),
`runs` (baselines, catch-ups, audits), `requests` (work another process asks of the running
sync, e.g. `audit --repair` on a live folder). Write transactions are short and never held across
an await, so an inbox insert from the callback handler is never blocked by a batch.
"""
from __future__ import annotations

import itertools
import json
import shutil
import sqlite3
import tempfile
import operator
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rsnotify.copies import STATE_DIR as STATE_DIR  # re-exported: the sync's modules name it from here
from rsnotify.copies import STATE_FILE as STATE_FILE
from rsnotify.datetimes import parse_w3c_datetime

from .outcomes import ResourceState
from .sink import REMOVE_PROBLEM, WRITE_PROBLEM

# Records in these states hold a change still to apply (`want`), retried until it succeeds
# or the Source drops the resource.
RETRIED_STATES = (ResourceState.FAILED, ResourceState.STALE, ResourceState.CONFLICT, ResourceState.REFUSED)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS channel (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS resources (
    loc TEXT PRIMARY KEY,
    path TEXT,
    state TEXT NOT NULL,
    md5 TEXT,
    sha256 TEXT,
    length INTEGER,
    lastmod TEXT,
    changed_at TEXT,
    last_change TEXT,
    expected_hash TEXT,
    last_error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_retry_at REAL,
    want TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS resources_path ON resources(path);
CREATE INDEX IF NOT EXISTS resources_state ON resources(state) WHERE state != 'ok';
CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY,
    hub TEXT,
    sequence INTEGER,
    notification_id TEXT,
    content_type TEXT,
    body BLOB,
    received_at REAL,
    status TEXT NOT NULL DEFAULT 'pending',
    from_time TEXT,
    until_time TEXT,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS inbox_pending ON inbox(status) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS inbox_notification ON inbox(notification_id) WHERE notification_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS hubs (hub TEXT PRIMARY KEY, last_sequence INTEGER);
CREATE TABLE IF NOT EXISTS seen (loc TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS refused (loc TEXT PRIMARY KEY, rule TEXT NOT NULL, detail TEXT, at REAL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, kind TEXT, started REAL, ended REAL, counts TEXT, outcome TEXT
);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL, args TEXT, created REAL, taken REAL, done REAL, result TEXT
);
"""


def to_text(value: datetime | None) -> str | None:
    """A fixed-width UTC form, so text order is time order inside SQLite."""
    if value is None:
        return None
    last = _last_text
    if value is last[0]:
        # A list's entries often share a lastmod, and the datetime parser hands out one object
        # per text: the text of the last one is reused (datetimes are immutable).
        return last[1]
    utc = value if value.tzinfo is UTC else value.astimezone(UTC)
    # isoformat pads every year to four digits (glibc's strftime("%Y") writes year 1 as "1",
    # which from_text cannot read back), at two thirds of strftime's cost
    text = f"{utc.isoformat(timespec='microseconds')[:26]}Z"
    _remember_text(value, text)
    return text


_last_text: tuple[datetime | None, str] = (None, "")


def _remember_text(value: datetime, text: str) -> None:
    global _last_text
    _last_text = (value, text)    # one tuple swapped whole: safe for the state's other threads


def from_text(value: str | None) -> datetime | None:
    if value and len(value) == 27 and value[4] == value[7] == "-" and value[10] == "T" and value[19] == "." \
            and value[-1] == "Z" and value.isascii():
        # The form `to_text` writes: fromisoformat reads it forty times faster than the full
        # W3C parser (an audit reads every record's two datetimes).
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    return parse_w3c_datetime(value) if value else None


@dataclass(frozen=True, slots=True)
class ResourceRecord:
    """What the Destination knows of one loc."""

    loc: str
    path: str | None
    state: str
    md5: str | None = None
    sha256: str | None = None
    length: int | None = None
    lastmod: datetime | None = None
    changed_at: datetime | None = None     # datetime of the last applied change (Source clock)
    last_change: str | None = None         # created / updated / deleted / baseline
    expected_hash: str | None = None       # for STALE: what the Source announced
    last_error: str | None = None
    attempts: int = 0                      # failed tries of `want` so far
    next_retry_at: float | None = None     # local clock (time.time()) of the next try
    want: str | None = None                # JSON: the change still to apply (RETRIED_STATES)

    def row(self) -> tuple[Any, ...]:
        # str(state): a plain str binds as it is; sqlite3 looks for an adapter for every other
        # value, a StrEnum member included (as for each None: see SyncState.commit)
        return (self.loc, self.path, str(self.state), self.md5, self.sha256, self.length, to_text(self.lastmod),
                to_text(self.changed_at), self.last_change, self.expected_hash, self.last_error, self.attempts,
                self.next_retry_at, self.want)

    @property
    def is_settled(self) -> bool:
        """No change held back for it: the retry columns hold their defaults (SyncState.commit
        writes those as literals)."""
        return (self.want is None and self.attempts == 0 and self.last_error is None and self.expected_hash is None
                and self.next_retry_at is None)

    def settled_row(self) -> tuple[Any, ...]:
        """`row()` without the retry columns, for a settled record; no datetime is None but ""
        (the insert turns it back into NULL; no stored datetime is ever empty)."""
        return (self.loc, self.path, str(self.state), self.md5, self.sha256, self.length,
                to_text(self.lastmod) or "", to_text(self.changed_at) or "", self.last_change)

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> ResourceRecord:
        return cls(row[0], row[1], ResourceState(row[2]), row[3], row[4], row[5], from_text(row[6]),
                   from_text(row[7]), row[8], row[9], row[10], row[11] or 0, row[12], row[13])

    @property
    def holds_file(self) -> bool:
        """The file at `path` is this resource's copy (an older one, for stale/failed)."""
        return self.path is not None and (self.state in (ResourceState.OK, ResourceState.STALE) or (
            self.state == ResourceState.FAILED and (self.md5 is not None or self.sha256 is not None)))

    def hash_of(self, algorithm: str) -> str | None:
        algorithm = algorithm.lower()
        if algorithm == "md5":
            return self.md5
        if algorithm in ("sha-256", "sha256"):
            return self.sha256
        return None


@dataclass(frozen=True, slots=True)
class InboxRow:
    id: int
    hub: str | None
    sequence: int | None
    notification_id: str | None
    content_type: str
    body: bytes
    received_at: float


# A record holding back a change the Destination's own disk refused: its reason is
# sink.write_problem's line for a write (a fetch) or a remove (a delete).
_HELD_BY_DISK = ("state = 'failed' AND want IS NOT NULL AND (substr(last_error, 1, length(?)) = ? "
                 "OR substr(last_error, 1, length(?)) = ?)")
_HELD_BY_DISK_ARGS = (WRITE_PROBLEM, WRITE_PROBLEM, REMOVE_PROBLEM, REMOVE_PROBLEM)
# A record whose copy is at its path (ResourceRecord.holds_file, in SQL).
_HOLDS_FILE = "(state IN ('ok', 'stale') OR (state = 'failed' AND (md5 IS NOT NULL OR sha256 IS NOT NULL)))"
IN_BATCH = 500      # values bound in one "IN (...)" query
_RESOURCE_COLUMNS = ("loc, path, state, md5, sha256, length, lastmod, changed_at, last_change, expected_hash, "
                     "last_error, attempts, next_retry_at, want")
_ADDED_COLUMNS = (("attempts", "INTEGER NOT NULL DEFAULT 0"), ("next_retry_at", "REAL"), ("want", "TEXT"))


_INSERT_RECORD = f"INSERT OR REPLACE INTO resources({_RESOURCE_COLUMNS}) VALUES ({','.join('?' * 14)})"
# A settled record (most of a baseline's): its retry columns as literals, and its datetimes
# (a new one has no changed_at) bound as "" for NULL. sqlite3 looks for an adapter for every
# bound value that is not an exact int, float, str or bytearray, None included: the six NULLs
# of such a row were ~2 us of its ~5 us insert.
_INSERT_SETTLED = (f"INSERT OR REPLACE INTO resources({_RESOURCE_COLUMNS}) "
                   "VALUES (?, ?, ?, ?, ?, ?, NULLIF(?, ''), NULLIF(?, ''), ?, NULL, NULL, 0, NULL, NULL)")


def _record_statements(records: Iterable[ResourceRecord]) -> list[tuple[str, Any]]:
    """The inserts of `records`, in their order (a later record of a loc replaces an earlier
    one): one executemany per run of records of one shape, settled or not."""
    return [(_INSERT_SETTLED, [record.settled_row() for record in run]) if settled
            else (_INSERT_RECORD, [record.row() for record in run])
            for settled, run in itertools.groupby(records, _IS_SETTLED)]


_IS_SETTLED = operator.attrgetter("is_settled")


class SyncState:
    """The state database. Methods are synchronous and quick (WAL, synchronous=NORMAL).

    One connection, shared by the event loop and the threads `asyncio.to_thread` uses, behind a
    lock. Every write method is one transaction.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._scratch: Path | None = None   # the temporary folder of a scratch copy (removed on close)
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=30000")
        with self._lock:
            self.db.executescript(_SCHEMA)
            self._add_columns()

    def _add_columns(self) -> None:
        # State folders made before the retry columns existed get them on first open.
        have = {row[1] for row in self.db.execute("PRAGMA table_info(resources)")}
        for name, kind in _ADDED_COLUMNS:
            if name not in have:
                self.db.execute(f"ALTER TABLE resources ADD COLUMN {name} {kind}")

    @classmethod
    def in_dir(cls, root: str | Path) -> SyncState:
        return cls(Path(root) / STATE_DIR / STATE_FILE)

    @classmethod
    def scratch_copy(cls, root: str | Path) -> SyncState:
        """A private copy of DIR's state (an empty one when DIR has none) in a temporary
        folder that `close` removes: a dry run writes there, never in DIR. The database and its
        WAL are copied as files (SQLite replays the WAL on open), which only reads DIR."""
        scratch = Path(tempfile.mkdtemp(prefix="rsnotify-dry-run-"))
        try:
            for suffix in ("", "-wal"):
                original = Path(root) / STATE_DIR / (STATE_FILE + suffix)
                if original.is_file():
                    shutil.copyfile(original, scratch / (STATE_FILE + suffix))
            state = cls(scratch / STATE_FILE)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        state._scratch = scratch
        return state

    def close(self) -> None:
        with self._lock:
            self.db.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    # --- transactions ------------------------------------------------------------------

    def _write(self, statements: Iterable[tuple[str, Any]]) -> None:
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    if isinstance(params, list):
                        self.db.executemany(sql, params)
                    else:
                        self.db.execute(sql, params)
                self.db.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back already (a full disk fails the COMMIT itself): a
                # second ROLLBACK would hide the real error behind "cannot rollback".
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self.db.execute(sql, params).fetchall()

    def _query_in(self, sql: str, values: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        """The rows of `sql`, whose "IN ({marks})" takes `values`, in one query per IN_BATCH of them."""
        batch = list(values)
        for start in range(0, len(batch), IN_BATCH):
            part = tuple(batch[start:start + IN_BATCH])
            yield from self._query(sql.format(marks=",".join("?" * len(part))), part)

    # --- channel ---------------------------------------------------------------------------

    def get(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM channel WHERE key = ?", (key,))
        return rows[0][0] if rows else None

    def get_json(self, key: str) -> Any:
        value = self.get(key)
        return json.loads(value) if value else None

    def set(self, **values: Any) -> None:
        self._write([(("INSERT INTO channel(key, value) VALUES (?, ?) "
                      "ON CONFLICT(key) DO UPDATE SET value = excluded.value"),
                      [(k, _encode(v)) for k, v in values.items()])])

    def channel(self) -> dict[str, str]:
        return dict(self._query("SELECT key, value FROM channel"))

    @property
    def high_water(self) -> datetime | None:
        return from_text(self.get("high_water"))

    @property
    def exists(self) -> bool:
        return self.get("engine_state") is not None

    # --- resources -------------------------------------------------------------------------

    def record(self, loc: str) -> ResourceRecord | None:
        rows = self._query(f"SELECT {_RESOURCE_COLUMNS} FROM resources WHERE loc = ?", (loc,))
        return ResourceRecord.from_row(rows[0]) if rows else None

    def records(self, locs: Iterable[str]) -> dict[str, ResourceRecord]:
        return {row[0]: ResourceRecord.from_row(row)
                for row in self._query_in(f"SELECT {_RESOURCE_COLUMNS} FROM resources WHERE loc IN ({{marks}})", locs)}

    def record_by_path(self, path: str) -> ResourceRecord | None:
        rows = self._query(f"SELECT {_RESOURCE_COLUMNS} FROM resources WHERE path = ? LIMIT 1", (path,))
        return ResourceRecord.from_row(rows[0]) if rows else None

    def states_by_path(self, paths: Iterable[str]) -> dict[str, str]:
        """The state of the record `record_by_path` gives for each path that has one (the
        lowest loc among records sharing a path: the path index's own order), in one query per
        500 paths."""
        found: dict[str, str] = {}
        for path, state in self._query_in("SELECT path, state FROM resources WHERE path IN ({marks}) "
                                          "ORDER BY path, loc", paths):
            found.setdefault(path, state)
        return found

    def iter_live_locs(self, batch: int = 1000) -> Iterator[list[str]]:
        """The locs of every live record (not a tombstone), in loc order, `batch` at a time."""
        last = ""
        while True:
            rows = self._query("SELECT loc FROM resources WHERE loc > ? AND state != 'deleted' ORDER BY loc LIMIT ?",
                               (last, batch))
            if not rows:
                return
            yield [row[0] for row in rows]
            last = rows[-1][0]

    def iter_records(self, batch: int = 1000) -> Iterator[ResourceRecord]:
        """Every record, in loc order, read in batches (memory stays flat)."""
        last = ""
        while True:
            rows = self._query(f"SELECT {_RESOURCE_COLUMNS} FROM resources WHERE loc > ? ORDER BY loc LIMIT ?",
                               (last, batch))
            if not rows:
                return
            for row in rows:
                yield ResourceRecord.from_row(row)
            last = rows[-1][0]

    def counts_by_state(self) -> dict[str, int]:
        return dict(self._query("SELECT state, count(*) FROM resources GROUP BY state"))

    def commit(self, records: Iterable[ResourceRecord] = (), *, high_water: datetime | None = None,
               inbox_status: Iterable[tuple[int, str, str | None]] = (),
               sequences: Iterable[tuple[str, int]] = (), **channel: Any) -> None:
        """One transaction: resource records, then H (never backwards), inbox rows, hub sequences.

        H is committed together with the records it covers (invariant I1).
        """
        statements: list[tuple[str, Any]] = _record_statements(records)
        if high_water is not None:
            statements.append((("INSERT INTO channel(key, value) VALUES ('high_water', ?) "
                               "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)"),
                               (to_text(high_water),)))
        status = [(state, detail, row_id) for row_id, state, detail in inbox_status]
        if status:
            statements.append(("UPDATE inbox SET status = ?, detail = ? WHERE id = ?", status))
        seqs = list(sequences)
        if seqs:
            statements.append((("INSERT INTO hubs(hub, last_sequence) VALUES (?, ?) ON CONFLICT(hub) "
                               "DO UPDATE SET last_sequence = max(last_sequence, excluded.last_sequence)"), seqs))
        if channel:
            statements.append((("INSERT INTO channel(key, value) VALUES (?, ?) "
                               "ON CONFLICT(key) DO UPDATE SET value = excluded.value"),
                               [(k, _encode(v)) for k, v in channel.items()]))
        if statements:
            self._write(statements)

    def set_high_water(self, value: datetime, *, force: bool = False) -> None:
        """H := value; only a re-baseline (`force`) may move it backwards."""
        if force:
            self.set(high_water=to_text(value))
        else:
            self.commit(high_water=value)

    # --- troubled records: retries, path owners, escapes, refusals -----------------------

    def due_retries(self, now: float | None, limit: int = 1000) -> list[ResourceRecord]:
        """Records holding a change still to apply whose retry time has come (`now` None: all,
        refused ones too, which have no retry time)."""
        marks = ",".join("?" * len(RETRIED_STATES))
        rows = self._query(f"SELECT {_RESOURCE_COLUMNS} FROM resources WHERE state IN ({marks}) AND want IS NOT NULL "
                           "AND (? IS NULL OR next_retry_at <= ?) ORDER BY next_retry_at "
                           "LIMIT ?", (*RETRIED_STATES, now, now, limit))
        return [ResourceRecord.from_row(row) for row in rows]

    def retried_locs(self) -> list[str]:
        """The locs of every record holding a change still to apply (the RETRIED_STATES)."""
        marks = ",".join("?" * len(RETRIED_STATES))
        return [row[0] for row in self._query(f"SELECT loc FROM resources WHERE state IN ({marks})",
                                              tuple(RETRIED_STATES))]

    def held_by_disk(self) -> list[ResourceRecord]:
        """Every record holding back a change the Destination's own disk refused (a write or a
        remove), by path."""
        rows = self._query(f"SELECT {_RESOURCE_COLUMNS} FROM resources WHERE {_HELD_BY_DISK} ORDER BY path",
                           _HELD_BY_DISK_ARGS)
        return [ResourceRecord.from_row(row) for row in rows]

    def next_retry_at(self) -> float | None:
        marks = ",".join("?" * len(RETRIED_STATES))
        rows = self._query(f"SELECT min(next_retry_at) FROM resources WHERE state IN ({marks}) AND want IS NOT NULL",
                           tuple(RETRIED_STATES))
        return rows[0][0] if rows else None

    def related_retries(self, paths: Iterable[str]) -> list[ResourceRecord]:
        """Records holding a change still to apply whose path is one of `paths`, inside one, or
        a folder holding one: a change there may have cleared their way."""
        found: dict[str, ResourceRecord] = {}
        marks = ",".join("?" * len(RETRIED_STATES))
        for path in set(paths):
            rows = self._query(
                f"SELECT {_RESOURCE_COLUMNS} FROM resources WHERE state IN ({marks}) AND want IS NOT NULL AND "
                "(path = ? OR substr(path, 1, length(?) + 1) = ? || '/' OR substr(?, 1, length(path) + 1) = path || '/')",
                (*RETRIED_STATES, path, path, path, path))
            found.update((row[0], ResourceRecord.from_row(row)) for row in rows)
        return list(found.values())

    def holder_of(self, path: str, other_than: str) -> str | None:
        """The loc of another resource whose copy is at `path`, if any."""
        rows = self._query(f"SELECT loc FROM resources WHERE path = ? AND loc != ? AND {_HOLDS_FILE} LIMIT 1",
                           (path, other_than))
        return rows[0][0] if rows else None

    def holders(self, paths: Iterable[str]) -> dict[str, list[str]]:
        """For each of `paths` held by some resource (as `holder_of` counts it), the locs holding
        it, in one query per 500 paths (a baseline asks for a chunk of the list at once)."""
        found: dict[str, list[str]] = {}
        for path, loc in self._query_in(f"SELECT path, loc FROM resources WHERE path IN ({{marks}}) AND {_HOLDS_FILE}",
                                        dict.fromkeys(paths)):
            found.setdefault(path, []).append(loc)
        return found

    def count_escaped(self) -> int:
        """Live resources stored under an escaped name (a path segment starting with %%)."""
        rows = self._query("SELECT count(*) FROM resources WHERE state != 'deleted' AND path IS NOT NULL AND "
                           "('/' || path) LIKE '%/\\%\\%%' ESCAPE '\\'")
        return int(rows[0][0])

    def troubled(self, limit: int = 20) -> list[ResourceRecord]:
        """Some records that are not ok (failed, stale, conflict, refused), for `sync status`."""
        rows = self._query(f"SELECT {_RESOURCE_COLUMNS} FROM resources WHERE state NOT IN ('ok', 'deleted') "
                           "ORDER BY loc LIMIT ?", (limit,))
        return [ResourceRecord.from_row(row) for row in rows]

    def conflict_holders(self, limit: int = 20) -> list[tuple[ResourceRecord, str]]:
        """Records that keep a path another loc maps to as well (that one's record is
        `conflict`), each with that other loc: both sides of a name collision are reported."""
        columns = ", ".join(f"r.{c.strip()}" for c in _RESOURCE_COLUMNS.split(","))
        rows = self._query(f"SELECT {columns}, c.loc FROM resources r JOIN resources c ON c.path = r.path "
                           "AND c.loc != r.loc WHERE c.state = 'conflict' AND r.state = 'ok' ORDER BY r.loc LIMIT ?",
                           (limit,))
        return [(ResourceRecord.from_row(row[:-1]), row[-1]) for row in rows]

    def conflict_paths(self) -> frozenset[str]:
        """The paths of `conflict` records (a collision's path, or one a file/folder is in the way of)."""
        return frozenset(row[0] for row in self._query("SELECT path FROM resources WHERE state = 'conflict' "
                                                       "AND path IS NOT NULL"))

    def count_conflict_holders(self) -> int:
        rows = self._query("SELECT count(DISTINCT r.loc) FROM resources r JOIN resources c ON c.path = r.path "
                           "AND c.loc != r.loc WHERE c.state = 'conflict' AND r.state = 'ok'")
        return int(rows[0][0])

    def note_refusals(self, refusals: Iterable[tuple[str, str, str]], landed: Iterable[str] = ()) -> None:
        """Record refused locs (rule, loc, detail), one row per loc (the latest refusal), and
        forget the `landed` ones (a change of theirs was applied since: no rule refuses them now),
        in one transaction: `sync status` counts the locs refused now, not how often they were."""
        rows = [(loc, rule, detail[:300], time.time()) for rule, loc, detail in refusals]
        gone = [(loc,) for loc in landed]
        statements: list[tuple[str, Any]] = []
        if gone and (rows or self._query("SELECT EXISTS(SELECT 1 FROM refused)")[0][0]):
            statements.append(("DELETE FROM refused WHERE loc = ?", gone))
        if rows:
            statements.append(("INSERT OR REPLACE INTO refused(loc, rule, detail, at) VALUES (?, ?, ?, ?)", rows))
        if statements:
            self._write(statements)

    def clear_refusals(self) -> None:
        """Forget the refused locs: a baseline starts, and its full pass refuses again whatever
        the Source still lists (so the counts stay those of the current refusals)."""
        self._write([("DELETE FROM refused", ())])

    def refusal_counts(self) -> dict[str, int]:
        return dict(self._query("SELECT rule, count(*) FROM refused GROUP BY rule"))

    def last_refusals(self, limit: int = 10) -> list[dict[str, Any]]:
        rows = self._query("SELECT rule, loc, detail, at FROM refused ORDER BY at DESC LIMIT ?", (limit,))
        return [{"rule": rule, "loc": loc[:500], "detail": detail, "at": at} for rule, loc, detail, at in rows[::-1]]

    def problem_summary(self) -> dict[str, Any]:
        """What `sync status` shows about single resources: escaped names, refusals by rule
        (and the last few), and some records that are not ok, with why."""
        return {
            "escaped_names": self.count_escaped(),
            "refusals": self.refusal_counts(),
            "last_refusals": self.last_refusals(),
            "troubled": [{"loc": r.loc, "state": r.state, "path": r.path, "error": r.last_error,
                          "attempts": r.attempts, "next_retry_at": r.next_retry_at} for r in self.troubled()]
            + [{"loc": r.loc, "state": ResourceState.CONFLICT, "path": r.path, "attempts": 0, "next_retry_at": None,
                "error": f"keeps {r.path}; {other} maps there too"} for r, other in self.conflict_holders()],
        }

    # --- the Resource List pass (locs seen) --------------------------------------------------

    def clear_seen(self) -> None:
        self._write([("DELETE FROM seen", ())])

    def mark_seen(self, locs: Iterable[str]) -> None:
        self._write([("INSERT OR IGNORE INTO seen(loc) VALUES (?)", [(loc,) for loc in locs])])

    def unseen_records(self, batch: int = 1000) -> Iterator[ResourceRecord]:
        """Live records (not tombstones) whose loc the last Resource List pass did not see."""
        last = ""
        while True:
            rows = self._query(
                f"SELECT {_RESOURCE_COLUMNS} FROM resources r WHERE loc > ? AND state != 'deleted' "
                "AND NOT EXISTS (SELECT 1 FROM seen s WHERE s.loc = r.loc) ORDER BY loc LIMIT ?", (last, batch))
            if not rows:
                return
            for row in rows:
                yield ResourceRecord.from_row(row)
            last = rows[-1][0]

    # --- inbox -----------------------------------------------------------------------------

    def add_to_inbox(self, hub: str | None, sequence: int | None, notification_id: str | None,
                     content_type: str, body: bytes) -> int | None:
        """Append one delivery (autocommit). None when this notification id is already there."""
        with self._lock:
            if notification_id is not None:
                seen = self.db.execute("SELECT 1 FROM inbox WHERE notification_id = ? AND hub IS ? LIMIT 1",
                                       (notification_id, hub)).fetchone()
                if seen:
                    return None
            cursor = self.db.execute(
                "INSERT INTO inbox(hub, sequence, notification_id, content_type, body, received_at) "
                "VALUES (?, ?, ?, ?, ?, ?)", (hub, sequence, notification_id, content_type, body, time.time()))
            return cursor.lastrowid

    def pending_inbox_heads(self) -> list[tuple[int, float]]:
        """(id, received_at) of every pending delivery, oldest first: no bodies."""
        return self._query("SELECT id, received_at FROM inbox WHERE status = 'pending' ORDER BY id")

    def inbox_rows(self, ids: list[int]) -> list[InboxRow]:
        return [InboxRow(*row) for row in self._query_in(
            "SELECT id, hub, sequence, notification_id, content_type, body, received_at FROM inbox "
            "WHERE id IN ({marks})", ids)]

    def inbox_counts(self) -> dict[str, int]:
        return dict(self._query("SELECT status, count(*) FROM inbox GROUP BY status"))

    def last_inbox_id(self) -> int:
        rows = self._query("SELECT max(id) FROM inbox")
        return int(rows[0][0] or 0)

    def prune_inbox(self, older_than_seconds: float = 86_400.0) -> None:
        cutoff = time.time() - older_than_seconds
        self._write([("DELETE FROM inbox WHERE status != 'pending' AND received_at < ?", (cutoff,))])

    def last_sequences(self) -> dict[str, int]:
        return dict(self._query("SELECT hub, last_sequence FROM hubs"))

    def reset_sequence(self, hub: str, value: int) -> None:
        """A new hub epoch (its numbering restarted): the baseline goes down to `value`."""
        self._write([(("INSERT INTO hubs(hub, last_sequence) VALUES (?, ?) "
                      "ON CONFLICT(hub) DO UPDATE SET last_sequence = excluded.last_sequence"), (hub, value))])

    def source_latest(self) -> datetime | None:
        """The Source's last known change: the latest of H, of every notification's `until`
        met (applied or waiting) and of what its lists last showed (`note_source_latest`)."""
        known = [from_text(self.get("source_latest")), self.high_water,
                 from_text(self.get("last_until_received"))]
        found = [value for value in known if value is not None]
        return max(found) if found else None

    def note_source_latest(self, value: datetime) -> None:
        """The Source is known to have changed up to `value` (never moves backwards)."""
        self._write([(("INSERT INTO channel(key, value) VALUES ('source_latest', ?) "
                      "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)"), (to_text(value),))])

    # --- requests from other processes (audit --repair on a live folder) -----------------------

    def add_request(self, kind: str, args: dict[str, Any]) -> int:
        with self._lock:
            cursor = self.db.execute("INSERT INTO requests(kind, args, created) VALUES (?, ?, ?)",
                                     (kind, json.dumps(args), time.time()))
            return int(cursor.lastrowid or 0)

    def has_open_requests(self) -> bool:
        return bool(self._query("SELECT 1 FROM requests WHERE taken IS NULL LIMIT 1"))

    def take_request(self) -> tuple[int, str, dict[str, Any]] | None:
        """The oldest request nobody took yet, now marked taken by this process."""
        with self._lock:
            row = self.db.execute("SELECT id, kind, args FROM requests WHERE taken IS NULL ORDER BY id LIMIT 1"
                                  ).fetchone()
            if row is None:
                return None
            taken = self.db.execute("UPDATE requests SET taken = ? WHERE id = ? AND taken IS NULL",
                                    (time.time(), row[0])).rowcount
            return (row[0], row[1], json.loads(row[2] or "{}")) if taken else None

    def finish_request(self, request_id: int, result: dict[str, Any]) -> None:
        self._write([("UPDATE requests SET done = ?, result = ? WHERE id = ?",
                      (time.time(), json.dumps(result, default=str), request_id))])

    def request_result(self, request_id: int) -> tuple[bool, dict[str, Any] | None]:
        """(taken, result once done) of one request."""
        rows = self._query("SELECT taken, result FROM requests WHERE id = ?", (request_id,))
        if not rows:
            return False, None
        taken, result = rows[0]
        return taken is not None, json.loads(result) if result else None

    def withdraw_request(self, request_id: int) -> bool:
        """Drop a request nobody took yet; False when it was taken meanwhile."""
        with self._lock:
            return self.db.execute("DELETE FROM requests WHERE id = ? AND taken IS NULL", (request_id,)).rowcount > 0

    # --- runs ------------------------------------------------------------------------------

    def add_run(self, kind: str, started: float, counts: dict[str, Any], outcome: str) -> None:
        self._write([("INSERT INTO runs(kind, started, ended, counts, outcome) VALUES (?, ?, ?, ?, ?)",
                      (kind, started, time.time(), json.dumps(counts), outcome))])

    def last_run(self, kind: str) -> dict[str, Any] | None:
        rows = self._query("SELECT started, ended, counts, outcome FROM runs WHERE kind = ? ORDER BY id DESC LIMIT 1",
                           (kind,))
        if not rows:
            return None
        started, ended, counts, outcome = rows[0]
        return {"started": started, "ended": ended, "counts": json.loads(counts), "outcome": outcome}


def _encode(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        return to_text(value)
    return json.dumps(value)

"""The change memory: one SQLite file (WAL) holding, per topic, the from/until chain, every
change ever published (grouped into Change Lists) and the resources' current state (derived
from the changes when a Resource List is rendered, so publishing pays for one insert).

A prepared notification's changes are recorded in the same transaction that advances the
chain, before any hub POST, so a Change List is never behind a delivered notification. Writers
take SQLite's write lock first (`BEGIN IMMEDIATE`), so any number of threads and processes on
one file produce one unbroken chain. The outbox keeps its tables in the same file.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rsnotify.datetimes import format_datetime, parse_w3c_datetime
from rsnotify.errors import NotificationError
from rsnotify.lists import Resource
from rsnotify.notification import ChangeNotification, ChangeType, Link, ResourceChange

from ..errors import StateError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chain (topic TEXT PRIMARY KEY, until_time TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS changelists (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    from_time TEXT NOT NULL,
    until_time TEXT,                 -- NULL while the list is open
    entries INTEGER NOT NULL DEFAULT 0,
    bytes INTEGER NOT NULL DEFAULT 0,  -- an estimate of the serialized size
    opened_at REAL NOT NULL          -- time.time() when opened, for period rotation
);
CREATE INDEX IF NOT EXISTS changelists_by_topic ON changelists (topic, id);
CREATE TABLE IF NOT EXISTS changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    list_id INTEGER NOT NULL REFERENCES changelists(id),
    loc TEXT NOT NULL,
    change TEXT NOT NULL,
    datetime TEXT,
    lastmod TEXT,
    hash TEXT,
    length INTEGER,
    type TEXT,
    links TEXT                       -- JSON [[rel, href, type], ...] or NULL
);
CREATE INDEX IF NOT EXISTS changes_by_list ON changes (list_id, id);
-- How far `resources` has followed `changes` (a change id), and the chain's end then: the
-- Resource List's `at`. Kept off the publish path: brought up to date when a list is rendered.
CREATE TABLE IF NOT EXISTS resources_state (
    topic TEXT PRIMARY KEY,
    change_id INTEGER NOT NULL,
    until_time TEXT
);
CREATE TABLE IF NOT EXISTS resources (
    topic TEXT NOT NULL,
    loc TEXT NOT NULL,
    lastmod TEXT,
    hash TEXT,
    length INTEGER,
    type TEXT,
    PRIMARY KEY (topic, loc)
) WITHOUT ROWID;
"""
_ENTRY_OVERHEAD = 130  # bytes of markup around one Change List <url>, for the size estimate
_FETCH = 2_000         # rows per fetch when streaming
_IN_CHUNK = 500        # locs per `IN (...)` query (SQLite allows 32,766 parameters)


@dataclass(frozen=True, slots=True)
class ListPolicy:
    """When a topic's open Change List is closed, and how long closed ones are kept."""

    max_entries: int = 50_000         # entries per Change List (Sitemap limit)
    max_bytes: int = 50_000_000       # estimated bytes per Change List (Sitemap limit, 50 MB)
    rotate_seconds: float = 86_400.0  # close the open list once it is this old (default daily)
    keep_seconds: float | None = None  # drop closed lists whose until is older (None: keep all)

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1:
            raise StateError(f"Change List limits must be positive, got {self.max_entries} entries / {self.max_bytes} bytes")
        if self.rotate_seconds <= 0:
            raise StateError(f"the rotation period must be a positive number of seconds, got {self.rotate_seconds}")
        if self.keep_seconds is not None and self.keep_seconds <= 0:
            raise StateError(f"keep must be a positive number of seconds, got {self.keep_seconds}")


@dataclass(frozen=True, slots=True)
class ChangeListRecord:
    """One Change List of a topic: its bounds (until None while open) and size."""

    id: int
    from_time: datetime
    until_time: datetime | None
    entries: int

    @property
    def is_open(self) -> bool:
        return self.until_time is None


def connect(path: str | os.PathLike[str], *, durable: bool = True) -> sqlite3.Connection:
    """A connection to the memory file (created with its schema if missing), in autocommit
    mode: callers open transactions with `immediate` or `snapshot`.

    `durable`: each commit waits for the disk (synchronous=FULL), so a power cut loses no
    committed change. Without it (synchronous=NORMAL, WAL) a commit survives the process
    crashing but not the machine losing power, and costs a fraction of the time.
    """
    target = Path(path)
    _migrate_json_state(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(target, check_same_thread=False, isolation_level=None, timeout=30.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        db.execute("PRAGMA busy_timeout=30000")
        db.executescript(_SCHEMA)
        return db
    except (OSError, sqlite3.DatabaseError) as exc:   # OSError: a folder that cannot be made
        raise StateError(f"cannot open the change memory {target}: {getattr(exc, 'strerror', None) or exc}") from exc


@contextmanager
def immediate(db: sqlite3.Connection, path: object = "") -> Iterator[sqlite3.Connection]:
    """A write transaction that holds the write lock from its first statement, so the chain
    read inside it cannot be stale. Commits on success, rolls back on error."""
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        raise StateError(f"cannot lock the change memory {path}: {exc}") from exc
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    try:
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        db.execute("ROLLBACK")
        raise StateError(f"cannot write to the change memory {path}: {exc}") from exc


def last_until(db: sqlite3.Connection, topic: str) -> datetime | None:
    row = db.execute("SELECT until_time FROM chain WHERE topic = ?", (topic,)).fetchone()
    return parse_w3c_datetime(row[0]) if row else None


def record(
    db: sqlite3.Connection,
    topic: str,
    documents: Sequence[ChangeNotification],
    policy: ListPolicy,
    now: Callable[[], float] = time.time,
    *,
    chain_end: datetime | None = None,
) -> None:
    """Record `documents` (inside an `immediate` transaction): their changes into the topic's
    Change Lists, and the chain's new end. `chain_end`: the end read earlier in the same
    transaction (saves reading it again)."""
    if not documents:
        return
    text = _DatetimeText()
    for document in documents:
        list_id = _open_list_for(db, topic, document, policy, now)
        rows = [_change_row(list_id, change, text) for change in document.changes]
        db.executemany(
            "INSERT INTO changes (list_id, loc, change, datetime, lastmod, hash, length, type, links) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        size = sum(_entry_size(row[1], row[5], row[7]) for row in rows)
        db.execute("UPDATE changelists SET entries = entries + ?, bytes = bytes + ? WHERE id = ?", (len(rows), size, list_id))
    current = chain_end if chain_end is not None else last_until(db, topic)
    end = max(document.until_time for document in documents)
    if current is None or end > current:  # never backwards (a submitted old document)
        db.execute(
            "INSERT INTO chain (topic, until_time) VALUES (?, ?) "
            "ON CONFLICT(topic) DO UPDATE SET until_time = excluded.until_time",
            (topic, format_datetime(end)),
        )


def _entry_size(loc: str, hashes: str | None, media_type: str | None) -> int:
    return _ENTRY_OVERHEAD + len(loc) + len(hashes or "") + len(media_type or "")


def _open_list_for(
    db: sqlite3.Connection, topic: str, document: ChangeNotification, policy: ListPolicy, now: Callable[[], float]
) -> int:
    """The open list that takes `document`, rotating first when it would pass a limit.

    Rotation happens only here, at a notification boundary: the closed list's `until` and the
    new one's `from` are the document's `from`, the previous notification's `until`.
    """
    row = db.execute(
        "SELECT id, entries, bytes, opened_at FROM changelists WHERE topic = ? AND until_time IS NULL "
        "ORDER BY id DESC LIMIT 1",
        (topic,),
    ).fetchone()
    boundary = format_datetime(document.from_time)
    if row is not None:
        list_id, entries, size, opened_at = row
        estimate = sum(_entry_size(c.loc, c.hash, c.media_type) for c in document.changes)
        full = entries + len(document.changes) > policy.max_entries or size + estimate > policy.max_bytes
        if entries == 0 or not (full or now() - opened_at >= policy.rotate_seconds):
            return int(list_id)
        db.execute("UPDATE changelists SET until_time = ? WHERE id = ?", (boundary, list_id))
        _drop_expired(db, topic, policy, now)
    cursor = db.execute(
        "INSERT INTO changelists (topic, from_time, opened_at) VALUES (?, ?, ?)", (topic, boundary, now())
    )
    return int(cursor.lastrowid)  # type: ignore[arg-type]


def _drop_expired(db: sqlite3.Connection, topic: str, policy: ListPolicy, now: Callable[[], float]) -> None:
    if policy.keep_seconds is None:
        return
    update_resources(db, topic)  # the changes about to go must reach the resources first
    horizon = datetime.fromtimestamp(now(), UTC) - timedelta(seconds=policy.keep_seconds)
    expired = [
        list_id
        for list_id, until in db.execute(
            "SELECT id, until_time FROM changelists WHERE topic = ? AND until_time IS NOT NULL", (topic,)
        ).fetchall()
        if parse_w3c_datetime(until) < horizon
    ]
    for list_id in expired:
        db.execute("DELETE FROM changes WHERE list_id = ?", (list_id,))
        db.execute("DELETE FROM changelists WHERE id = ?", (list_id,))


class _DatetimeText:
    """format_datetime with memory: the changes of one publish mostly share one datetime."""

    def __init__(self) -> None:
        self._seen: dict[datetime, str] = {}

    def __call__(self, value: datetime | None) -> str | None:
        if value is None:
            return None
        text = self._seen.get(value)
        if text is None:
            text = self._seen[value] = format_datetime(value)
        return text


def _change_row(list_id: int, change: ResourceChange, text: Callable[[datetime | None], str | None]) -> tuple:
    links = json.dumps([[link.rel, link.href, link.media_type] for link in change.links]) if change.links else None
    return (
        list_id,
        change.loc,
        change.change.value,
        text(change.changed_at),
        text(change.lastmod),
        change.hash,
        change.length,
        change.media_type,
        links,
    )


def update_resources(db: sqlite3.Connection, topic: str) -> None:
    """Bring the topic's `resources` up to every recorded change (inside an `immediate`
    transaction), and note the chain's end they now reflect."""
    row = db.execute("SELECT change_id FROM resources_state WHERE topic = ?", (topic,)).fetchone()
    done = row[0] if row else 0
    cursor = db.execute(
        "SELECT c.id, c.loc, c.change, c.datetime, c.lastmod, c.hash, c.length, c.type FROM changes c "
        "JOIN changelists l ON l.id = c.list_id WHERE l.topic = ? AND c.id > ? ORDER BY c.id",
        (topic, done),
    )
    while rows := cursor.fetchmany(_FETCH):
        done = rows[-1][0]
        run: list[tuple] = []
        for row in rows:
            if run and (run[-1][2] == "deleted") != (row[2] == "deleted"):
                _apply_run(db, topic, run)
                run = []
            run.append(row)
        if run:
            _apply_run(db, topic, run)
    until = db.execute("SELECT until_time FROM chain WHERE topic = ?", (topic,)).fetchone()
    db.execute(
        "INSERT INTO resources_state (topic, change_id, until_time) VALUES (?, ?, ?) "
        "ON CONFLICT(topic) DO UPDATE SET change_id = excluded.change_id, until_time = excluded.until_time",
        (topic, done, until[0] if until else None),
    )


def _apply_run(db: sqlite3.Connection, topic: str, run: list[tuple]) -> None:
    """Rows (id, loc, change, datetime, lastmod, hash, length, type), all deletes or none."""
    if run[0][2] == "deleted":
        db.executemany("DELETE FROM resources WHERE topic = ? AND loc = ?", [(topic, row[1]) for row in run])
        return
    db.executemany(
        "INSERT INTO resources (topic, loc, lastmod, hash, length, type) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(topic, loc) DO UPDATE SET lastmod = excluded.lastmod, hash = excluded.hash, "
        "length = excluded.length, type = excluded.type",
        [(topic, loc, lastmod or changed_at, hashes, length, kind)
         for _id, loc, _change, changed_at, lastmod, hashes, length, kind in run],
    )


def resources_at(db: sqlite3.Connection, topic: str) -> datetime | None:
    """The chain's end that the topic's `resources` reflect (see `update_resources`), or None."""
    row = db.execute("SELECT until_time FROM resources_state WHERE topic = ?", (topic,)).fetchone()
    return _datetime(row[0]) if row else None


def _datetime(value: str | None) -> datetime | None:
    return None if value is None else parse_w3c_datetime(value)


def _hashes(value: str | None) -> tuple[tuple[str, str], ...]:
    if not value:
        return ()
    return tuple((a, h) for a, _, h in (token.partition(":") for token in value.split()))


# -- reading -------------------------------------------------------------------------------


def changelists(db: sqlite3.Connection, topic: str) -> list[ChangeListRecord]:
    """The topic's Change Lists, oldest first (the open one, if any, last)."""
    rows = db.execute(
        "SELECT id, from_time, until_time, entries FROM changelists WHERE topic = ? ORDER BY id", (topic,)
    ).fetchall()
    return [ChangeListRecord(i, parse_w3c_datetime(f), _datetime(u), n) for i, f, u, n in rows]


def iter_changes(db: sqlite3.Connection, list_id: int) -> Iterator[ResourceChange]:
    """The list's changes in the order recorded (forward chronological), fetched in chunks."""
    cursor = db.execute(
        "SELECT loc, change, datetime, lastmod, hash, length, type, links FROM changes WHERE list_id = ? ORDER BY id",
        (list_id,),
    )
    while rows := cursor.fetchmany(_FETCH):
        for loc, change, changed_at, lastmod, hashes, length, media_type, links in rows:
            yield ResourceChange(
                loc, ChangeType(change), _datetime(changed_at), _datetime(lastmod), _hashes(hashes), length, media_type,
                tuple(Link(rel, href, kind) for rel, href, kind in json.loads(links)) if links else (),
            )


def iter_resources(db: sqlite3.Connection, topic: str) -> Iterator[Resource]:
    """The topic's resources as of the current transaction, by loc, fetched in chunks."""
    return iter_resources_between(db, topic, "", None)     # every loc is >= ""


def iter_resources_between(db: sqlite3.Connection, topic: str, low: str, high: str | None) -> Iterator[Resource]:
    """The topic's resources whose loc is in [low, high) (high None: no upper bound), by loc,
    fetched in chunks.

    SQLite compares TEXT as UTF-8 bytes, which orders like Python compares str (by code point),
    so ranges cut with Python's bisect hold the same locs here."""
    where, values = _loc_range(topic, low, high)
    cursor = db.execute(f"SELECT loc, lastmod, hash, length, type FROM resources WHERE {where} ORDER BY loc", values)
    while rows := cursor.fetchmany(_FETCH):
        for loc, lastmod, hashes, length, media_type in rows:
            yield Resource(loc, _datetime(lastmod), _hashes(hashes), length, media_type)


def resources_change_id(db: sqlite3.Connection, topic: str) -> int:
    """The id of the last change the topic's `resources` reflect (0: none yet)."""
    row = db.execute("SELECT change_id FROM resources_state WHERE topic = ?", (topic,)).fetchone()
    return int(row[0]) if row else 0


def changed_locs(db: sqlite3.Connection, topic: str, after: int, through: int) -> set[str]:
    """The locs of the topic's changes with an id in (after, through]: the resources a Resource
    List written at change `after` may show wrongly once `resources` reflect change `through`."""
    rows = db.execute(
        "SELECT DISTINCT c.loc FROM changes c JOIN changelists l ON l.id = c.list_id "
        "WHERE l.topic = ? AND c.id > ? AND c.id <= ?",
        (topic, after, through),
    )
    return {loc for (loc,) in rows}


def resource_count(db: sqlite3.Connection, topic: str) -> int:
    return db.execute("SELECT COUNT(*) FROM resources WHERE topic = ?", (topic,)).fetchone()[0]


def resource_count_between(db: sqlite3.Connection, topic: str, low: str, high: str | None) -> int:
    """How many of the topic's resources have a loc in [low, high) (high None: no upper bound)."""
    where, values = _loc_range(topic, low, high)
    return db.execute(f"SELECT COUNT(*) FROM resources WHERE {where}", values).fetchone()[0]


def _loc_range(topic: str, low: str, high: str | None) -> tuple[str, tuple[str, ...]]:
    """The WHERE clause of the locs in [low, high). Two spellings, not `(? IS NULL OR loc < ?)`:
    SQLite cannot bound a key range by that, and would read every loc past `low` to the end."""
    if high is None:
        return "topic = ? AND loc >= ?", (topic, low)
    return "topic = ? AND loc >= ? AND loc < ?", (topic, low, high)


def resource_hashes(db: sqlite3.Connection, topic: str, locs: Iterable[str] | None = None) -> dict[str, str | None]:
    """loc -> the recorded hash text (of every resource, or of `locs` only), for comparing a
    folder against the memory."""
    if locs is None:
        return dict(db.execute("SELECT loc, hash FROM resources WHERE topic = ?", (topic,)).fetchall())
    found: dict[str, str | None] = {}
    wanted = list(locs)
    for start in range(0, len(wanted), _IN_CHUNK):
        chunk = wanted[start:start + _IN_CHUNK]
        rows = db.execute(
            f"SELECT loc, hash FROM resources WHERE topic = ? AND loc IN ({','.join('?' * len(chunk))})",
            (topic, *chunk),
        ).fetchall()
        found.update(rows)
    return found


class ChangeMemory:
    """A change memory file, for one process's threads (each process opens its own).

    `path`: the SQLite file (shared with an Outbox). `policy`: Change List rotation and
    retention. `durable`: wait for the disk at each commit (see `connect`; off by default:
    a publish then costs about a millisecond, and a crashed process still loses nothing).
    `now`: the wall clock for period rotation and retention.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        policy: ListPolicy | None = None,
        *,
        durable: bool = False,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.policy = policy or ListPolicy()
        self._now = now
        self._lock = threading.RLock()
        self._db = connect(self.path, durable=durable)

    def last_until(self, topic: str) -> datetime | None:
        """Where the topic's chain ends (the last recorded notification's until), or None."""
        with self._lock:
            return last_until(self._db, topic)

    def reserve(self, topic: str, prepare: Callable[[datetime | None], list[ChangeNotification]]) -> list[ChangeNotification]:
        """Prepare documents chained after the topic's end and record them, in one transaction.

        `prepare(after)` builds the documents; it runs while the write lock is held, so no
        other thread or process can take the same interval.
        """
        with self._lock, immediate(self._db, self.path) as db:
            end = last_until(db, topic)
            documents = prepare(end)
            record(db, topic, documents, self.policy, self._now, chain_end=end)
            return documents

    def update_resources(self, topic: str) -> None:
        """Bring the topic's resources up to every recorded change (before reading them)."""
        with self._lock, immediate(self._db, self.path) as db:
            update_resources(db, topic)

    def recorded_hashes(self, topic: str, locs: Iterable[str] | None = None) -> dict[str, str | None]:
        """loc -> hash of the topic's resources (all, or `locs` only), up to every recorded change."""
        with self._lock, immediate(self._db, self.path) as db:
            update_resources(db, topic)
            return resource_hashes(db, topic, locs)

    def record_documents(self, topic: str, documents: Sequence[ChangeNotification]) -> None:
        """Record documents built elsewhere (e.g. a submitted XML document)."""
        with self._lock, immediate(self._db, self.path) as db:
            record(db, topic, documents, self.policy, self._now)

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction on a fresh connection: a consistent view while streaming, that
        never blocks writers (WAL)."""
        db = connect(self.path)
        try:
            db.execute("BEGIN")
            yield db
            db.execute("COMMIT")
        finally:
            db.close()

    def close(self) -> None:
        with self._lock:
            self._db.close()


# Paths this process has looked at for an old JSON state. Looked at once: reading the file
# through Python once SQLite holds it open would, on closing that handle, drop every POSIX lock
# this process has on the file (fcntl locks belong to the process, not the descriptor), and
# another process closing its own connection would then take itself for the last user and delete
# the WAL and shared-memory files under this one (its lists answered "disk I/O error").
_LOOKED_AT: set[str] = set()


def _migrate_json_state(path: Path) -> None:
    """An older rsnotify kept the chain in a JSON file at the same path: move it aside and
    carry its chain into the new memory, so the chain continues."""
    key = os.path.realpath(path)
    if key in _LOOKED_AT:
        return
    _LOOKED_AT.add(key)
    try:
        with path.open("rb") as handle:
            head = handle.read(1)
    except OSError:
        return
    if head != b"{":
        return
    try:
        topics = json.loads(path.read_text(encoding="utf-8"))["topics"]
        chain = [(topic, format_datetime(parse_w3c_datetime(until))) for topic, until in topics.items()]
    except (ValueError, KeyError, TypeError, AttributeError, NotificationError) as exc:
        raise StateError(f"{path} is neither a change memory nor an rsnotify JSON state file: {exc}") from None
    old = path.with_name(path.name + ".json-old")
    os.replace(path, old)
    db = connect(path)
    try:
        with immediate(db, path):
            db.executemany("INSERT OR REPLACE INTO chain (topic, until_time) VALUES (?, ?)", chain)
    finally:
        db.close()

"""Subscription state: what was asked of which hub, the secret, the lease, and delivery progress.

`Subscription` is a frozen record; `SubscriptionStore` is the interface a Destination can
implement on its own database. `SqliteStore` keeps them in one SQLite file (WAL: a delivery's
state write is a small transaction, no file rewrite and fsync), shared safely by several
processes and by `rsnotify sync`'s state database; `JsonFileStore` keeps them in one JSON
file (rewritten on each change: fine for a few quiet subscriptions); `MemoryStore` is for
tests and throw-away subscribers. `open_store(path)` picks by the file name: `.json` means
JSON, anything else SQLite.
"""
from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import tempfile
import threading
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from rsnotify.filelocks import lock as lock_file

from .errors import StoreError

# Subscription.status values
PENDING = "pending"            # asked for, never verified yet
ACTIVE = "active"              # verified; receiving until expires_at
EXPIRED = "expired"            # the lease ran out before a renewal was verified
DENIED = "denied"              # the hub sent hub.mode=denied
FAILED = "failed"              # the hub refused the request, or never verified it
UNSUBSCRIBED = "unsubscribed"  # unsubscription verified
ENDED = (DENIED, FAILED, UNSUBSCRIBED)

_DATETIME_FIELDS = ("created_at", "intent_sent_at", "verified_at", "expires_at", "renew_at", "ended_at", "last_until")


@dataclass(frozen=True)
class Subscription:
    """One subscription of one callback URL to one topic at one hub."""

    id: str                                   # the unguessable last path segment of the callback URL
    topic: str
    hub: str                                  # updated when the hub redirects us (307/308)
    callback: str
    secret: str | None = field(default=None, repr=False)
    requested_lease_seconds: int | None = None
    status: str = PENDING
    pending_mode: str | None = None           # "subscribe" or "unsubscribe": the intent we await
    created_at: datetime | None = None
    intent_sent_at: datetime | None = None
    lease_seconds: int | None = None          # granted by the hub's verification
    verified_at: datetime | None = None
    expires_at: datetime | None = None
    renew_at: datetime | None = None
    ended_at: datetime | None = None
    denial_reason: str | None = None
    discovered_from: str | None = None        # the URL discovery started from, if any
    discovery: str | None = None              # how: "topic" (WebSub) or "capability-list"
    advertised_hub: str | None = None         # the hub as discovered, before any 307/308
    last_sequence: int | None = None          # highest notification sequence seen
    last_until: datetime | None = None        # `until` of the last change notification seen
    recent_ids: tuple[str, ...] = ()          # notification ids seen lately, oldest first

    @property
    def has_secret(self) -> bool:
        return self.secret is not None

    @property
    def is_ended(self) -> bool:
        return self.status in ENDED

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for name in _DATETIME_FIELDS:
            if data[name] is not None:
                data[name] = data[name].isoformat()
        data["recent_ids"] = list(self.recent_ids)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Subscription:
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        for name in _DATETIME_FIELDS:
            if values.get(name) is not None:
                values[name] = datetime.fromisoformat(values[name])
        values["recent_ids"] = tuple(values.get("recent_ids") or ())
        return cls(**values)

    def evolve(self, **changes: Any) -> Subscription:
        return replace(self, **changes)


class SubscriptionStore(Protocol):
    """Where subscriptions live. Implement these four on your own database to replace the file."""

    async def get(self, subscription_id: str) -> Subscription | None: ...

    async def put(self, subscription: Subscription) -> None: ...

    async def delete(self, subscription_id: str) -> None: ...

    async def all(self) -> list[Subscription]: ...


class MemoryStore:
    """Subscriptions in a dict: gone when the process ends."""

    def __init__(self) -> None:
        self._items: dict[str, Subscription] = {}

    async def get(self, subscription_id: str) -> Subscription | None:
        return self._items.get(subscription_id)

    async def put(self, subscription: Subscription) -> None:
        self._items[subscription.id] = subscription

    async def delete(self, subscription_id: str) -> None:
        self._items.pop(subscription_id, None)

    async def all(self) -> list[Subscription]:
        return list(self._items.values())


class JsonFileStore:
    """Subscriptions in one JSON file (mode 0600: it holds secrets), replaced atomically.

    Each write locks a `.lock` file beside it and re-reads the file first, so several
    processes on one machine (e.g. WSGI workers) can share it. Reads re-load the file when
    another process changed it. File I/O runs in a thread, off the event loop.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._items: dict[str, Subscription] = {}
        self._stamp: tuple[int, int] | None = None
        self._lock = threading.RLock()  # the cache is shared by the threads asyncio.to_thread uses

    async def get(self, subscription_id: str) -> Subscription | None:
        return (await asyncio.to_thread(self._read)).get(subscription_id)

    async def put(self, subscription: Subscription) -> None:
        await asyncio.to_thread(self._update, subscription.id, subscription)

    async def delete(self, subscription_id: str) -> None:
        await asyncio.to_thread(self._update, subscription_id, None)

    async def all(self) -> list[Subscription]:
        return list((await asyncio.to_thread(self._read)).values())

    # --- synchronous file work (runs in a thread) --------------------------------------

    def _read(self) -> dict[str, Subscription]:
        with self._lock:
            return self._read_locked()

    def _read_locked(self) -> dict[str, Subscription]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._items, self._stamp = {}, None
            return self._items
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._items = self._load()
            self._stamp = stamp
        return self._items

    def _load(self) -> dict[str, Subscription]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return {item["id"]: Subscription.from_json(item) for item in data["subscriptions"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreError(
                f"subscription state file {self.path} is unreadable ({exc}); "
                "expected the JSON this tool writes"
            ) from exc

    def _update(self, subscription_id: str, subscription: Subscription | None) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock, open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
                lock_file(lock)
                items = dict(self._read())
                if subscription is None:
                    items.pop(subscription_id, None)
                else:
                    items[subscription_id] = subscription
                self._write(items)
        except OSError as exc:
            raise StoreError(f"cannot write subscription state file {self.path}: {exc}") from exc

    def _write(self, items: dict[str, Subscription]) -> None:
        text = json.dumps({"subscriptions": [s.to_json() for s in items.values()]}, indent=1)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name, dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        stat = self.path.stat()
        self._items, self._stamp = items, (stat.st_mtime_ns, stat.st_size)


class SqliteStore:
    """Subscriptions in a SQLite table (WAL, synchronous=NORMAL; the file is made mode 0600:
    it holds secrets). Each operation is one short statement, run on the calling thread: it
    takes well under a millisecond, less than handing it to a worker thread would. close()
    closes the connection; a later operation opens it again (a Subscriber started again)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._cache: dict[str, Subscription | None] = {}
        self._version: int | None = None
        self._db: sqlite3.Connection | None = None
        self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.exists()
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
            try:
                if fresh:
                    os.chmod(self.path, 0o600)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("CREATE TABLE IF NOT EXISTS subscriptions (id TEXT PRIMARY KEY, data TEXT NOT NULL)")
            except BaseException:
                db.close()
                raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open subscription state {self.path}: {exc}; expected a SQLite file "
                             "this tool writes (or a new path)") from exc
        # PRAGMA data_version counts per connection: what get() cached is checked afresh
        self._cache.clear()
        self._version = None
        self._db = db
        return db

    def _run(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            db = self._db if self._db is not None else self._open()
            try:
                return db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"subscription state {self.path}: {exc}") from exc

    def _decode(self, text: str) -> Subscription:
        try:
            return Subscription.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"subscription state {self.path} holds an unreadable record ({exc})") from exc

    async def get(self, subscription_id: str) -> Subscription | None:
        # Every delivery reads its subscription: while no other connection has written the file
        # (PRAGMA data_version is unchanged), the record decoded last time is still current.
        with self._lock:
            version = self._run("PRAGMA data_version")[0][0]
            if version != self._version:
                self._cache.clear()
                self._version = version
            if subscription_id in self._cache:
                return self._cache[subscription_id]
            rows = self._run("SELECT data FROM subscriptions WHERE id = ?", (subscription_id,))
            found = self._decode(rows[0][0]) if rows else None
            self._cache[subscription_id] = found
            return found

    async def put(self, subscription: Subscription) -> None:
        with self._lock:
            self._run("INSERT INTO subscriptions(id, data) VALUES (?, ?) "
                      "ON CONFLICT(id) DO UPDATE SET data = excluded.data",
                      (subscription.id, json.dumps(subscription.to_json())))
            self._cache[subscription.id] = subscription

    async def delete(self, subscription_id: str) -> None:
        with self._lock:
            self._run("DELETE FROM subscriptions WHERE id = ?", (subscription_id,))
            self._cache.pop(subscription_id, None)

    async def all(self) -> list[Subscription]:
        return [self._decode(row[0]) for row in self._run("SELECT data FROM subscriptions ORDER BY rowid")]

    def import_json(self, path: str | os.PathLike[str]) -> int:
        """Copy the subscriptions of a JsonFileStore file in (a one-time upgrade); how many."""
        items = JsonFileStore(path)._read()
        for subscription in items.values():
            self._run("INSERT OR IGNORE INTO subscriptions(id, data) VALUES (?, ?)",
                      (subscription.id, json.dumps(subscription.to_json())))
        return len(items)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def open_store(path: str | os.PathLike[str]) -> JsonFileStore | SqliteStore:
    """A JsonFileStore for a `.json` path, else a SqliteStore."""
    return JsonFileStore(path) if str(path).endswith(".json") else SqliteStore(path)

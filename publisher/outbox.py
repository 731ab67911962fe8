"""A durable, non-blocking outbox: `add(changes)` writes the documents to SQLite and returns;
a background thread POSTs them to every hub, in order, retrying until each is accepted.

For Sources whose request path must never wait on a hub. The from/until chain is fixed when a
change is added (the documents are stored whole), so retries and restarts resend exactly the
same bytes and the chain never has gaps or overlaps. The file is a change memory
(`publisher.memory`): each document's changes go into its Change Lists in the same
transaction, and a Publisher given the same file as `state_path` shares its chain.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import aiohttp

from rsnotify.backoff import backoff_delay
from rsnotify.datetimes import format_datetime
from rsnotify.notification import ChangeNotification
from rsnotify.xml import to_xml

from .changes import ChangeLike
from .client import Publisher, Receipt
from .errors import ChangeInputError, PublishError, StateError
from .memory.store import ListPolicy, connect, immediate, last_until, record

log = logging.getLogger(__name__)

# 4xx answers that say the document itself can never be accepted: the delivery is set aside
# as refused (kept for inspection) so it does not block the queue forever. Every other
# failure (5xx, connection errors, 401/403/404/429... which a config fix or time can cure)
# is retried.
_PERMANENT_STATUSES = {400, 405, 410, 411, 413, 415, 422}
_KEEP_DELIVERED = 1_000  # delivered rows kept for inspection; older ones are pruned

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    body BLOB,                       -- NULL once every hub has it
    from_time TEXT NOT NULL,
    until_time TEXT NOT NULL,
    change_count INTEGER NOT NULL,
    added_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS deliveries (
    document_id INTEGER NOT NULL REFERENCES documents(id),
    hub_url TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',   -- pending | delivered | refused
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,  -- time.time() seconds
    notification_id TEXT,
    status INTEGER,
    last_error TEXT,
    PRIMARY KEY (document_id, hub_url)
);
CREATE INDEX IF NOT EXISTS deliveries_by_state ON deliveries (state, hub_url, document_id);
"""


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One document's delivery to one hub, as the outbox records it."""

    document_id: int
    hub_url: str
    state: str                    # pending | delivered | refused
    attempts: int
    notification_id: str | None
    status: int | None
    last_error: str | None


class Outbox:
    """Durable queue of change notifications for one Publisher's topic and hubs.

    `path`: the SQLite file (created if missing). The sender thread starts at once unless
    `autostart=False`. Retries back off from `retry_delay` (default: the publisher's) up to
    `max_retry_delay` seconds. `now` is the clock for the retry schedule.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        publisher: Publisher,
        *,
        retry_delay: float | None = None,
        max_retry_delay: float = 60.0,
        autostart: bool = True,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.publisher = publisher
        self.retry_delay = publisher.retry_delay if retry_delay is None else retry_delay
        self.max_retry_delay = max_retry_delay
        self._now = now
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._db = self._open()
        if autostart:
            self.start()

    # -- the caller's side ---------------------------------------------------------------------

    def add(self, changes: Iterable[ChangeLike]) -> list[int]:
        """Queue `changes`; returns the outbox ids of the documents written, without waiting
        on any hub. Raises ChangeInputError (nothing queued) for a bad change."""
        topic = self.publisher.topic_url
        items = list(changes)
        policy = self.publisher.memory.policy if self.publisher.memory is not None else ListPolicy()
        with self._lock:
            try:
                # The write lock is taken before the chain is read: no other process can
                # take the same interval.
                with immediate(self._db, self.path) as db:
                    end = last_until(db, topic)
                    documents = self.publisher.prepare(items, after=end)
                    ids = [self._insert(topic, document) for document in documents]
                    record(db, topic, documents, policy, chain_end=end)
            except sqlite3.Error as exc:
                raise StateError(f"cannot write to the outbox {self.path}: {exc}") from exc
            if not documents:
                return []
        log.debug("outbox %s: queued documents %s for %s", self.path, ids, topic)
        self._wake.set()
        return ids

    def pending(self) -> int:
        """How many (document, hub) deliveries are still waiting."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM deliveries WHERE state = 'pending'").fetchone()[0]

    def entries(self, state: str | None = None) -> list[OutboxEntry]:
        """The recorded deliveries (all, or those in `state`), oldest first."""
        query = (
            "SELECT document_id, hub_url, state, attempts, notification_id, status, last_error "
            "FROM deliveries {} ORDER BY document_id, hub_url"
        )
        with self._lock:
            if state is None:
                rows = self._db.execute(query.format("")).fetchall()
            else:
                rows = self._db.execute(query.format("WHERE state = ?"), (state,)).fetchall()
        return [OutboxEntry(*row) for row in rows]

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until nothing is pending; raises TimeoutError (with the last error) if it takes
        longer than `timeout` seconds."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        with self._idle:
            while (count := self._count_pending()) > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    last = self._db.execute(
                        "SELECT hub_url, last_error FROM deliveries WHERE state = 'pending' "
                        "AND last_error IS NOT NULL ORDER BY document_id LIMIT 1"
                    ).fetchone()
                    detail = f"; last error from {last[0]}: {last[1]}" if last else ""
                    raise TimeoutError(f"outbox {self.path} still has {count} pending deliveries after {timeout}s{detail}")
                self._idle.wait(min(left, 0.5))

    def start(self) -> None:
        """Start the sender thread (once)."""
        if self._thread is None or not self._thread.is_alive():
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name=f"rsnotify-outbox:{self.path.name}", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the sender thread (what is pending stays queued for the next start)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- storage -------------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        db = connect(self.path)  # WAL, synchronous=FULL: add() returns once the documents are on disk
        try:
            db.executescript(_SCHEMA)
            db.isolation_level = "DEFERRED"  # `with db:` opens and commits a transaction
            return db
        except sqlite3.Error as exc:
            raise StateError(f"cannot open the outbox database {self.path}: {exc}") from exc

    def _insert(self, topic: str, document: ChangeNotification) -> int:
        cursor = self._db.execute(
            "INSERT INTO documents (topic, body, from_time, until_time, change_count, added_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                topic,
                to_xml(document),
                format_datetime(document.from_time),
                format_datetime(document.until_time),
                len(document.changes),
                self._now(),
            ),
        )
        document_id = int(cursor.lastrowid)  # type: ignore[arg-type]
        self._db.executemany(
            "INSERT INTO deliveries (document_id, hub_url) VALUES (?, ?)",
            [(document_id, hub) for hub in self.publisher.hub_urls],
        )
        return document_id

    def _count_pending(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM deliveries WHERE state = 'pending'").fetchone()[0]

    def _heads(self) -> tuple[list[tuple[int, str, int, bytes]], float | None]:
        """Each hub's oldest pending delivery that is due now, and when the next one is due.

        Per hub, only the oldest pending document may go: that keeps each hub's order.
        """
        now = self._now()
        due: list[tuple[int, str, int, bytes]] = []
        next_due: float | None = None
        with self._lock:
            rows = self._db.execute(
                "SELECT d.document_id, d.hub_url, d.attempts, d.next_attempt_at, doc.body "
                "FROM deliveries d JOIN documents doc ON doc.id = d.document_id "
                "WHERE d.state = 'pending' AND d.document_id = ("
                "  SELECT MIN(document_id) FROM deliveries WHERE state = 'pending' AND hub_url = d.hub_url)"
            ).fetchall()
        for document_id, hub, attempts, next_at, body in rows:
            if next_at <= now:
                due.append((document_id, hub, attempts, body))
            else:
                next_due = next_at if next_due is None else min(next_due, next_at)
        return due, next_due

    def _record(self, document_id: int, hub: str, attempts: int, outcome: Receipt | Exception) -> None:
        with self._lock, self._db:
            if isinstance(outcome, Receipt):
                self._db.execute(
                    "UPDATE deliveries SET state = 'delivered', attempts = ?, notification_id = ?, "
                    "status = ?, last_error = NULL WHERE document_id = ? AND hub_url = ?",
                    (attempts, outcome.notification_id, outcome.status, document_id, hub),
                )
                self._db.execute(
                    "UPDATE documents SET body = NULL WHERE id = ? AND NOT EXISTS ("
                    "SELECT 1 FROM deliveries WHERE document_id = ? AND state = 'pending')",
                    (document_id, document_id),
                )
                self._prune()
            elif _is_permanent(outcome):
                log.error("outbox %s: %s refused document %d for good: %s", self.path, hub, document_id, outcome)
                self._db.execute(
                    "UPDATE deliveries SET state = 'refused', attempts = ?, status = ?, last_error = ? "
                    "WHERE document_id = ? AND hub_url = ?",
                    (attempts, getattr(outcome, "status", None), str(outcome), document_id, hub),
                )
            else:
                delay = backoff_delay(attempts, self.retry_delay, self.max_retry_delay)
                log.warning("outbox %s: document %d to %s, attempt %d: %s; retry in %.2fs",
                            self.path, document_id, hub, attempts, outcome, delay)
                self._db.execute(
                    "UPDATE deliveries SET attempts = ?, next_attempt_at = ?, status = ?, last_error = ? "
                    "WHERE document_id = ? AND hub_url = ?",
                    (attempts, self._now() + delay, getattr(outcome, "status", None), str(outcome), document_id, hub),
                )
            self._idle.notify_all()

    def _prune(self) -> None:
        self._db.execute(
            "DELETE FROM deliveries WHERE state = 'delivered' AND document_id < ("
            "SELECT COALESCE(MIN(document_id), 0) FROM (SELECT document_id FROM deliveries "
            "WHERE state = 'delivered' ORDER BY document_id DESC LIMIT ?))",
            (_KEEP_DELIVERED,),
        )
        self._db.execute(
            "DELETE FROM documents WHERE body IS NULL AND id NOT IN (SELECT document_id FROM deliveries)"
        )

    # -- the sender thread ---------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        session: aiohttp.ClientSession | None = None
        try:
            session = loop.run_until_complete(_new_session())
            while not self._stopping.is_set():
                self._wake.clear()  # before looking, so an add() after the look still wakes us
                due, next_due = self._heads()
                if due:
                    loop.run_until_complete(self._send_all(session, due))
                    continue
                wait = None if next_due is None else max(0.0, next_due - self._now())
                self._wake.wait(wait)
        except Exception:  # the thread's top level: log the bug rather than die silently
            log.exception("outbox %s: the sender thread stopped on an unexpected error", self.path)
        finally:
            if session is not None:
                loop.run_until_complete(session.close())
            loop.close()

    async def _send_all(self, session: aiohttp.ClientSession, due: list[tuple[int, str, int, bytes]]) -> None:
        await asyncio.gather(*(self._send(session, *head) for head in due))

    async def _send(self, session: aiohttp.ClientSession, document_id: int, hub: str, attempts: int, body: bytes) -> None:
        try:
            receipts = await self.publisher.submit(body, hubs=[hub], attempts=1, session=session, record=False)
            outcome: Receipt | Exception = receipts[0]
        except (PublishError, ChangeInputError) as exc:
            outcome = exc
        self._record(document_id, hub, attempts + 1, outcome)


async def _new_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession()


def _is_permanent(outcome: Exception) -> bool:
    if isinstance(outcome, ChangeInputError):
        return True  # a stored document that no longer validates cannot get better
    return isinstance(outcome, PublishError) and outcome.status in _PERMANENT_STATUSES

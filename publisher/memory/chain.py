"""The chain of from/until intervals of a Publisher without a change memory: each topic's last
`until`, kept in this process only (spec §3: consecutive, non-overlapping intervals).

With a change memory (`publisher.memory`) the chain lives in its SQLite file instead, shared
by every process and thread that publishes through it.
"""
from __future__ import annotations

import threading
from datetime import datetime


class LocalChain:
    """Each topic's last `until`, in memory; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, datetime] = {}

    def last_until(self, topic: str) -> datetime | None:
        """Where the topic's last accepted notification ended, or None for a new topic."""
        with self._lock:
            return self._until.get(topic)

    def advance(self, topic: str, until: datetime) -> None:
        """Record that the topic's notifications now reach `until` (never moves backwards)."""
        with self._lock:
            current = self._until.get(topic)
            if current is None or until > current:
                self._until[topic] = until

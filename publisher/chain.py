"""The chain of from/until intervals per topic: the last `until` each topic's notifications
reached, so the next notification starts exactly there (spec §3: consecutive,
non-overlapping intervals).

Kept in memory, and in a small JSON file when a path is given, so it survives a restart.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from datetime import datetime
from pathlib import Path

from rsnotify.datetimes import format_datetime, parse_w3c_datetime
from rsnotify.errors import NotificationError

from .errors import StateError


class ChainState:
    """Each topic's last `until`; thread-safe; written atomically (temp file + rename)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._until: dict[str, datetime] = self._load() if self.path else {}

    def last_until(self, topic: str) -> datetime | None:
        """Where the topic's last accepted notification ended, or None for a new topic."""
        with self._lock:
            return self._until.get(topic)

    def advance(self, topic: str, until: datetime) -> None:
        """Record that the topic's notifications now reach `until` (never moves backwards)."""
        with self._lock:
            current = self._until.get(topic)
            if current is not None and until <= current:
                return
            self._until[topic] = until
            if self.path is not None:
                self._save()

    def _load(self) -> dict[str, datetime]:
        assert self.path is not None
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StateError(f"cannot read the publisher state file {self.path}: {exc}") from exc
        try:
            data = json.loads(text)
            return {topic: parse_w3c_datetime(value) for topic, value in data["topics"].items()}
        except (ValueError, KeyError, TypeError, AttributeError, NotificationError) as exc:
            raise StateError(
                f"publisher state file {self.path} is not what rsnotify writes "
                f'({{"topics": {{topic: until}}}}): {exc}'
            ) from None

    def _save(self) -> None:
        assert self.path is not None
        data = {"topics": {topic: format_datetime(until) for topic, until in sorted(self._until.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(prefix=".rsnotify-state-", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle, indent=1)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.path)
        except OSError as exc:
            raise StateError(f"cannot write the publisher state file {self.path}: {exc}") from exc

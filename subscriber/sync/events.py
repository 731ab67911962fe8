"""Sync events: what `--json` prints (one object per line, with an "event" key) and what
library users receive from `SyncEngine.events`, plus the progress counters behind the stderr
status line. No I/O here besides calling the listeners.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# Event names (the CLI contract)
BASELINE_PROGRESS = "baseline.progress"
BASELINE_DONE = "baseline.done"
CATCHUP_START = "catchup.start"
CATCHUP_DONE = "catchup.done"
CATCHUP_IMPOSSIBLE = "catchup.impossible"
LIVE = "live"
NOTIFICATION_APPLIED = "notification.applied"
GAP = "gap"
DEGRADED = "degraded"
AUDIT_DONE = "audit.done"
SUBSCRIBED = "subscribed"
# one resource each: a trust rule said no, a path taken, a change held back for retry, a name escaped
REFUSED = "refused"
CONFLICT = "conflict"
RESOURCE_FAILED = "resource.failed"
RETRY_DONE = "retry.done"
NAME_ESCAPED = "name.escaped"
# --dry-run: one per loc a baseline or catch-up would fetch or delete ("action"), then the counts
PLAN = "plan"
PLAN_DONE = "plan.done"


@dataclass(frozen=True)
class SyncEvent:
    event: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, **self.data}


Listener = Callable[[SyncEvent], None]


class Events:
    """Fans events out to listeners (the CLI's printer, a library user's callback)."""

    def __init__(self) -> None:
        self.listeners: list[Listener] = []

    def emit(self, event: str, **data: Any) -> None:
        item = SyncEvent(event, data)
        for listener in self.listeners:
            try:
                listener(item)
            except Exception:
                log.exception("sync event listener failed on %s", event)


@dataclass
class Progress:
    """Counters of the running baseline/catch-up/audit, read by the status line."""

    phase: str = "starting"
    total: int | None = None       # expected entries, when known
    seen: int = 0                  # entries read from the list(s)
    fetched: int = 0
    unchanged: int = 0
    deleted: int = 0
    failed: int = 0
    started: float = field(default_factory=time.monotonic)

    def start(self, phase: str, total: int | None = None) -> None:
        self.phase, self.total = phase, total
        self.seen = self.fetched = self.unchanged = self.deleted = self.failed = 0
        self.started = time.monotonic()

    def _rate_and_eta(self) -> tuple[float, int | None]:
        rate = self.seen / max(time.monotonic() - self.started, 1e-6)
        eta = int((self.total - self.seen) / rate) if self.total and rate > 0 and self.seen < self.total else None
        return rate, eta

    def line(self) -> str:
        rate, eta = self._rate_and_eta()
        text = f"{self.phase}: {self.seen:,}"
        if self.total:
            share = min(100, int(100 * self.seen / self.total))
            text += f"/{self.total:,} ({share}%)"
            if eta is not None:
                text += f" eta {eta} s"
        text += (f", {rate:,.0f}/s; fetched {self.fetched:,}, unchanged {self.unchanged:,}, "
                 f"deleted {self.deleted:,}, failed {self.failed:,}")
        return text

    def counts(self) -> dict[str, Any]:
        """What line() says, for a progress event: entries seen (of total, when known), per
        second, the seconds still to go (None when unknown), and the outcomes so far."""
        rate, eta = self._rate_and_eta()
        return {"phase": self.phase, "seen": self.seen, "total": self.total, "rate": round(rate, 1),
                "eta_seconds": eta, "seconds": round(time.monotonic() - self.started, 3), "fetched": self.fetched,
                "unchanged": self.unchanged, "deleted": self.deleted, "failed": self.failed}

"""A mirror: keeps a local copy of a Source's resources from its change notifications.

Created and updated resources are fetched (streamed to a temp file while hashed, whatever
their size) and kept only when their length and hash match what the notification announced;
deleted ones are removed. Different resources are fetched concurrently on one keep-alive
session; changes to the same resource are applied in the notification's order, so a
create-then-delete ends with no file. Redirects are followed within the same host only; give
`allow_networks` (the CLI always does) to refuse private, loopback and link-local targets
other than those networks. Files live under one root folder as <root>/<host[_port]>/<path>,
and no URL can reach outside that root. For a copy that stays equal to the Source across
restarts and missed notifications, use `rsnotify sync` (subscriber.sync).
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rsnotify.netguard import Network
from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange

from .callback.receiver import ReceivedNotification
from .sync import fetcher as outcomes
from .sync.fetcher import Fetcher
from .sync.sink import INDEX_NAME, FolderSink

log = logging.getLogger(__name__)

__all__ = ["INDEX_NAME", "Mirror", "MirrorOutcome"]


@dataclass(frozen=True)
class MirrorOutcome:
    """What the mirror did for one resource change."""

    loc: str
    change: str
    outcome: str              # stored, deleted, absent, mismatch, failed
    path: str | None = None   # the local file
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        data = {"loc": self.loc, "change": self.change, "outcome": self.outcome, "path": self.path}
        if self.detail:
            data["detail"] = self.detail
        return data


class Mirror:
    """Applies change notifications to a folder. Usable as a Subscriber's on_notification.

    `max_bytes` bounds each fetched resource; `concurrency` bounds the GETs in flight.
    """

    def __init__(self, root: str | os.PathLike[str], *, max_bytes: int = 10 * 1024**3, timeout: float = 60.0,
                 concurrency: int = 8, allow_networks: Iterable[Network] | None = None) -> None:
        self.sink = FolderSink(root)
        self.root = self.sink.root
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.concurrency = concurrency
        self.allow_networks = None if allow_networks is None else tuple(allow_networks)
        self._fetcher: Fetcher | None = None
        self.reports: list[tuple[MirrorOutcome, ...]] = []  # most recent last, bounded below

    @property
    def fetcher(self) -> Fetcher:
        if self._fetcher is None:  # made on first use, on the running loop
            self._fetcher = Fetcher(self.sink, allowed_networks=self.allow_networks, concurrency=self.concurrency,
                                    timeout=self.timeout, max_bytes=self.max_bytes, tries=3, retry_base=0.5,
                                    announced_by="the notification said")
        return self._fetcher

    async def __call__(self, received: ReceivedNotification) -> tuple[MirrorOutcome, ...]:
        if received.notification is None:
            log.warning("mirror skipped notification %s on %s: not a change notification",
                        received.notification_id, received.topic)
            return ()
        return await self.apply(received.notification)

    async def apply(self, notification: ChangeNotification) -> tuple[MirrorOutcome, ...]:
        """Each change's outcome, in the notification's order."""
        by_loc: dict[str, list[int]] = {}
        for index, change in enumerate(notification.changes):
            by_loc.setdefault(change.loc, []).append(index)
        results: list[MirrorOutcome | None] = [None] * len(notification.changes)

        async def one_loc(indexes: list[int]) -> None:
            for index in indexes:  # one resource's changes stay in order
                results[index] = await self.apply_change(notification.changes[index])

        await asyncio.gather(*(one_loc(indexes) for indexes in by_loc.values()))
        done = tuple(r for r in results if r is not None)
        self.reports = (self.reports + [done])[-100:]
        return done

    async def apply_change(self, change: ResourceChange) -> MirrorOutcome:
        try:
            path = self.path_for(change.loc)
        except ValueError as exc:
            return MirrorOutcome(change.loc, change.change.value, "failed", None, str(exc))
        if change.change is ChangeType.DELETED:
            existed = await asyncio.to_thread(self.sink.delete, path)
            outcome = MirrorOutcome(change.loc, "deleted", "deleted" if existed else "absent", str(path))
        else:
            result = await self.fetcher.fetch(change.loc, path, length=change.length, hashes=change.hashes)
            kind = {outcomes.STORED: "stored", outcomes.MISMATCH: "mismatch"}.get(result.outcome, "failed")
            outcome = MirrorOutcome(change.loc, change.change.value, kind, str(path), result.detail)
        log.info("mirror %s %s: %s %s", change.change.value, change.loc, outcome.outcome, outcome.detail)
        return outcome

    def path_for(self, loc: str) -> Path:
        """The local file for `loc`; ValueError for a URL that is not http(s) with a host."""
        return self.sink.path_for(loc)

    async def close(self) -> None:
        if self._fetcher is not None:
            await self._fetcher.close()
            self._fetcher = None

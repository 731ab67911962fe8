"""A mirror: keeps a local copy of a Source's resources from its change notifications.

Created and updated resources are fetched and kept only when their length and hash match
what the notification announced; deleted ones are removed. Files live under one root
folder as <root>/<host[_port]>/<path>, and no URL can reach outside that root.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aiohttp

from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange

from .core import ReceivedNotification

log = logging.getLogger(__name__)

# ResourceSync hash names (core §7: md5, sha-1, sha-256) -> hashlib names
HASH_ALGORITHMS = {"md5": "md5", "sha-1": "sha1", "sha-256": "sha256", "sha-512": "sha512"}
INDEX_NAME = "_index"      # the file for a URL whose path ends with "/"
_UNSAFE = re.compile(r"[^A-Za-z0-9._~!$&'()*+,;=@%-]")


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

    `max_bytes` bounds each fetched resource. Changes are applied in the notification's
    order (forward chronological), so a create-then-delete ends with no file.
    """

    def __init__(self, root: str | os.PathLike[str], *, session: aiohttp.ClientSession | None = None,
                 max_bytes: int = 1_073_741_824, timeout: float = 60.0) -> None:
        self.root = Path(root).resolve()
        self.max_bytes = max_bytes
        self.timeout = timeout
        self._session = session
        self._owns_session = session is None
        self.reports: list[tuple[MirrorOutcome, ...]] = []  # most recent last, bounded below

    async def __call__(self, received: ReceivedNotification) -> tuple[MirrorOutcome, ...]:
        if received.notification is None:
            log.warning("mirror skipped notification %s on %s: not a change notification",
                        received.notification_id, received.topic)
            return ()
        return await self.apply(received.notification)

    async def apply(self, notification: ChangeNotification) -> tuple[MirrorOutcome, ...]:
        outcomes = tuple([await self.apply_change(change) for change in notification.changes])
        self.reports = (self.reports + [outcomes])[-100:]
        return outcomes

    async def apply_change(self, change: ResourceChange) -> MirrorOutcome:
        try:
            path = self.path_for(change.loc)
        except ValueError as exc:
            return MirrorOutcome(change.loc, change.change.value, "failed", None, str(exc))
        if change.change is ChangeType.DELETED:
            existed = await asyncio.to_thread(_remove, path)
            outcome = MirrorOutcome(change.loc, "deleted", "deleted" if existed else "absent", str(path))
        else:
            outcome = await self._fetch(change, path)
        log.info("mirror %s %s: %s %s", change.change.value, change.loc, outcome.outcome, outcome.detail)
        return outcome

    def path_for(self, loc: str) -> Path:
        """The local file for `loc`; ValueError for a URL that is not http(s) with a host."""
        parts = urlsplit(loc)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"cannot mirror {loc!r}: expected an absolute http or https URL")
        host = parts.hostname + (f"_{parts.port}" if parts.port else "")
        segments = [_safe_segment(unquote(s)) for s in parts.path.split("/") if s not in ("", ".", "..")]
        if not segments or parts.path.endswith("/"):
            segments.append(INDEX_NAME)
        if parts.query:
            segments[-1] += "%3F" + quote(parts.query, safe="")
        path = self.root.joinpath(_safe_segment(host), *segments)
        if not path.resolve().is_relative_to(self.root):
            raise ValueError(f"cannot mirror {loc!r}: its path leaves the mirror folder")
        return path

    async def _fetch(self, change: ResourceChange, path: Path) -> MirrorOutcome:
        kind = change.change.value
        try:
            body = await self._get(change.loc)
        except MirrorFetchError as exc:
            return MirrorOutcome(change.loc, kind, "failed", str(path), str(exc))
        problems = check_fixity(change, body)
        if problems:
            # Keep the previous copy: what we got is not the announced version (perhaps a
            # newer one, whose own notification will come).
            return MirrorOutcome(change.loc, kind, "mismatch", str(path), "; ".join(problems))
        try:
            await asyncio.to_thread(_write_atomically, path, body)
        except OSError as exc:  # e.g. a file where a folder is needed: /a, then /a/b
            return MirrorOutcome(change.loc, kind, "failed", str(path), f"cannot write {path}: {exc}")
        return MirrorOutcome(change.loc, kind, "stored", str(path))

    async def _get(self, url: str) -> bytes:
        session = self._session
        if session is None:
            session = self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with session.get(url) as response:
                if response.status != 200:
                    raise MirrorFetchError(f"GET {url} answered {response.status}; expected 200")
                body = await response.content.read(self.max_bytes + 1)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise MirrorFetchError(f"cannot fetch {url}: {exc or type(exc).__name__}") from exc
        if len(body) > self.max_bytes:
            raise MirrorFetchError(f"{url} is larger than {self.max_bytes} bytes")
        return body

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None


class MirrorFetchError(Exception):
    """A resource could not be fetched (reported as a `failed` outcome, never raised to callers)."""


def check_fixity(change: ResourceChange, body: bytes) -> list[str]:
    """Every way `body` differs from the length and hashes the change announced."""
    problems = []
    if change.length is not None and len(body) != change.length:
        problems.append(f"length is {len(body)} bytes; the notification said {change.length}")
    for algorithm, expected in change.hashes:
        name = HASH_ALGORITHMS.get(algorithm.lower())
        if name is None:
            continue  # an algorithm we cannot compute says nothing either way
        actual = hashlib.new(name, body).hexdigest()
        if actual != expected.lower():
            problems.append(f"{algorithm} is {actual}; the notification said {expected}")
    return problems


def _safe_segment(segment: str) -> str:
    cleaned = _UNSAFE.sub(lambda m: quote(m.group(0), safe=""), segment)
    return cleaned if cleaned not in ("", ".", "..") else "_"


def _remove(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


def _write_atomically(path: Path, body: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".partial-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

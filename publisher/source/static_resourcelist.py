"""The Resource List that `rsnotify source --write` keeps in OUT, rewritten in proportion to a
batch of changes rather than to the folder.

Up to PART_ENTRIES resources it is one `resourcelist.xml`. Past that it is a Resource List Index
of parts, each holding the resources of one range of locs ([low, next part's low)). A batch
rewrites only the parts whose range holds a loc that changed since the last write (known from the
change memory's change ids, so a write that failed is made up for by the next), splits a part
grown past 2 x PART_ENTRIES, drops one left empty, and then rewrites the index.

What readers see: a part is written once, under a name never used before, and renamed into place
before the index that names it; the index (or the single list) replaces the previous one by an
atomic rename. A reader that fetched the previous index finds its parts for RETIRE_SECONDS more:
replaced parts are deleted only then (or, for files left by an earlier run, once their mtime is
that old). So every index a reader can fetch names parts that exist and agree with its `at`.
"""
from __future__ import annotations

import bisect
import logging
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rsnotify.errors import DocumentParseError
from rsnotify.lists import (
    RESOURCE_LIST,
    ListInfo,
    ListRef,
    ListWriter,
    Resource,
    open_list,
)
from rsnotify.notification import Link

from ..memory.resourcelist import RESOURCE_LIST_NAME
from ..memory.store import (
    ChangeMemory,
    changed_locs,
    iter_resources,
    iter_resources_between,
    resource_count,
    resources_at,
    resources_change_id,
)

log = logging.getLogger(__name__)

PART_ENTRIES = 1_000   # resources per part when parts are made; a part is split past twice this
RETIRE_SECONDS = 120.0  # how long a replaced part stays for readers of the index that named it
PART_PREFIX = "resourcelist-"


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the index: the locs from `low` (the first part's is "") to the next part's low."""

    low: str
    name: str
    count: int
    at: datetime


class PartedResourceList:
    """The Resource List of `topic` in `memory`, kept in `out` (see the module docstring).

    `url(name)`: the URL of a file in OUT. `up`: the Capability List's URL. `temporary_prefix`:
    the prefix of files being written (never served, never listed as resources).
    """

    def __init__(self, memory: ChangeMemory, topic: str, out: Path, *, url: Callable[[str], str], up: str,
                 temporary_prefix: str, part_entries: int = PART_ENTRIES, retire_seconds: float = RETIRE_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self.memory = memory
        self.topic = topic
        self.out = out
        self.url = url
        self.up = up
        self.temporary_prefix = temporary_prefix
        self.part_entries = part_entries
        self.retire_seconds = retire_seconds
        self.clock = clock
        self.parts: list[Part] = []     # empty: one document (or nothing written yet)
        self._written_through: int | None = None  # change id the files in OUT reflect; None: none yet
        self._retired: list[tuple[float, str]] = []
        self._swept = False
        self._previous: set[str] = set()    # the parts the index in OUT named when this run began

    def write(self) -> None:
        """Bring the files in OUT up to every change recorded in the memory. A write that fails
        (a full disk) leaves the next one to write the whole list again."""
        if not self._swept:
            # the index an earlier run left is still served until this run's replaces it
            self._previous = self._parts_named_in_out()
        try:
            self._write()
        except BaseException:
            self._written_through = None
            raise

    def _write(self) -> None:
        self.memory.update_resources(self.topic)
        with self.memory.snapshot() as db:
            through = resources_change_id(db, self.topic)
            if through == self._written_through:
                return
            at = resources_at(db, self.topic) or datetime.now(UTC)
            total = resource_count(db, self.topic)
            before = self.parts
            if total <= self.part_entries:
                self._write_document(RESOURCE_LIST_NAME, iter_resources(db, self.topic), at, index=False)
                self.parts = []
            else:
                if not before or self._written_through is None:
                    self.parts = self._write_all_parts(iter_resources(db, self.topic), at)
                else:
                    touched = changed_locs(db, self.topic, self._written_through, through)
                    self.parts = self._rewrite_parts(db, touched, at)
                self._write_index(at)
        self._written_through = through
        kept = {part.name for part in self.parts}
        self._retire(part.name for part in before if part.name not in kept)
        self._delete_retired()
        log.debug("wrote the Resource List into %s: %d resource(s) at %s, %d part(s)", self.out, total, at,
                  len(self.parts))

    # -- parts -------------------------------------------------------------------------------------

    def _write_all_parts(self, resources: Iterable[Resource], at: datetime) -> list[Part]:
        parts: list[Part] = []
        chunk: list[Resource] = []
        for resource in resources:
            chunk.append(resource)
            if len(chunk) == self.part_entries:
                parts.append(self._write_part("" if not parts else chunk[0].loc, chunk, at))
                chunk = []
        if chunk or not parts:
            parts.append(self._write_part("" if not parts else chunk[0].loc, chunk, at))
        return parts

    def _rewrite_parts(self, db: sqlite3.Connection, touched: set[str], at: datetime) -> list[Part]:
        lows = [part.low for part in self.parts]
        indexes = sorted({bisect.bisect_right(lows, loc) - 1 for loc in touched})
        parts = list(self.parts)
        # From the last touched part backwards, so the indexes of those not yet done hold.
        for i in reversed(indexes):
            low = parts[i].low
            high = parts[i + 1].low if i + 1 < len(parts) else None
            resources = list(iter_resources_between(db, self.topic, low, high))
            if not resources and len(parts) > 1:
                del parts[i]
                if i == 0:  # the first part covers everything below the next one's first loc
                    parts[0] = Part("", parts[0].name, parts[0].count, parts[0].at)
                continue
            size = self.part_entries if len(resources) > 2 * self.part_entries else len(resources) or 1
            pieces = [resources[start:start + size] for start in range(0, max(len(resources), 1), size)]
            parts[i:i + 1] = [self._write_part(low if n == 0 else piece[0].loc, piece, at)
                              for n, piece in enumerate(pieces)]
        return parts

    def _write_part(self, low: str, resources: list[Resource], at: datetime) -> Part:
        stamp = at.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        name = f"{PART_PREFIX}{stamp}-{secrets.token_hex(4)}.xml"   # never used before: parts never change
        self._write_document(name, resources, at, index=False, in_index=True)
        return Part(low, name, len(resources), at)

    def part_path(self, name: str) -> Path | None:
        """The file of the part `name` while a reader may ask for it (named by the index, or
        replaced less than retire_seconds ago), else None: no other name is ever a path here."""
        if name in {part.name for part in self.parts} or name in {retired for _, retired in self._retired}:
            return self.out / name
        return None

    def _write_index(self, at: datetime) -> None:
        refs = [ListRef(self.url(part.name), at=part.at) for part in self.parts]
        self._write_document(RESOURCE_LIST_NAME, refs, at, index=True)

    # -- files -------------------------------------------------------------------------------------

    def _write_document(self, name: str, entries: Iterable[Resource | ListRef], at: datetime, *, index: bool,
                        in_index: bool = False) -> None:
        links = (Link("up", self.up),) + ((Link("index", self.url(RESOURCE_LIST_NAME)),) if in_index else ())
        info = ListInfo(RESOURCE_LIST, is_index=index, at=at, links=links)
        temporary = self.out / f"{self.temporary_prefix}{name}"
        with temporary.open("wb") as handle, ListWriter(handle, info) as writer:
            for entry in entries:
                writer.write(entry)
        os.replace(temporary, self.out / name)

    def _parts_named_in_out(self) -> set[str]:
        """The part files the Resource List index in OUT names (none: no index, or unreadable)."""
        try:
            with (self.out / RESOURCE_LIST_NAME).open("rb") as handle:
                listed = open_list(handle)
                if not listed.info.is_index:
                    return set()
                return {ref.loc.rsplit("/", 1)[-1] for ref in listed if isinstance(ref, ListRef)}
        except (OSError, DocumentParseError):
            return set()

    def _retire(self, names: Iterable[str]) -> None:
        now = self.clock()
        self._retired.extend((now, name) for name in names)

    def _delete_retired(self) -> None:
        horizon = self.clock() - self.retire_seconds
        if not self._swept:
            # Parts an earlier run left: those its index named were served until this run's index
            # replaced it, so they are retired now, and readers of that index keep them for
            # retire_seconds (a cron run of --write --once must not pull them from under a
            # Destination's baseline); any other one when its file was last written, at the latest.
            self._swept = True
            current = {part.name for part in self.parts}
            now = self.clock()
            for path in self.out.glob(f"{PART_PREFIX}*.xml"):
                if path.name in current:
                    continue
                if path.name in self._previous:
                    self._retired.append((now, path.name))
                    continue
                try:
                    self._retired.append((path.stat().st_mtime, path.name))
                except OSError:
                    continue
        keep: list[tuple[float, str]] = []
        for retired_at, name in self._retired:
            if retired_at <= horizon:
                (self.out / name).unlink(missing_ok=True)
            else:
                keep.append((retired_at, name))
        self._retired = keep


__all__ = ["PART_ENTRIES", "RETIRE_SECONDS", "Part", "PartedResourceList"]

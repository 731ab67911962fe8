"""The Resource List that `rsnotify source --write` keeps in OUT, rewritten in proportion to a
batch of changes rather than to the folder.

Up to PART_ENTRIES resources it is one `resourcelist.xml`. Past that it is a Resource List Index
of parts, each holding the resources of one range of locs ([low, next part's low)). A batch
rewrites only the parts whose range holds a loc that changed since the last write (known from the
change memory's change ids, so a write that failed is made up for by the next), splits a part
grown past 2 x PART_ENTRIES into even pieces, rewrites one left with fewer than PART_ENTRIES / 2
(but some) together with its smaller neighbour (one part, or two even ones when they hold
PART_ENTRIES or more), drops one left empty, and then rewrites the index. `rsnotify source`
serves its Resource List from such files, kept in its cache folder.

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
    resource_count_between,
    resources_at,
    resources_change_id,
)

log = logging.getLogger(__name__)

PART_ENTRIES = 1_000   # resources per part when parts are made; a part is split past twice this,
                       # and one left with fewer than half this (but some) merges with a neighbour
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

    @property
    def min_entries(self) -> int:
        """A part rewritten with fewer resources than this (but some) merges with a neighbour."""
        return self.part_entries // 2

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
            before = self.parts
            is_partial = bool(before) and self._written_through is not None
            if is_partial:
                # The total from the parts' counts (fresh for those a change touched): counting
                # every resource would read the whole topic at each write.
                touched = changed_locs(db, self.topic, self._written_through or 0, through)
                marked, counts = self._counts(db, touched)
                total = sum(counts.values())
            else:
                total = resource_count(db, self.topic)
            if total <= self.part_entries:
                self._write_document(RESOURCE_LIST_NAME, iter_resources(db, self.topic), at, index=False)
                self.parts = []
            else:
                if is_partial:
                    self.parts = self._rewrite_parts(db, marked, counts, at)
                else:
                    self.parts = self._write_all_parts(iter_resources(db, self.topic), at)
                self._write_index(at)
        self._written_through = through
        kept = {part.name for part in self.parts}
        self._retire(part.name for part in before if part.name not in kept)
        self._delete_retired()
        log.debug("wrote the Resource List into %s: %d resource(s) at %s, %d part(s)", self.out, total, at,
                  len(self.parts))

    # -- parts -------------------------------------------------------------------------------------

    def _write_all_parts(self, resources: Iterable[Resource], at: datetime) -> list[Part]:
        """Parts of part_entries resources each, the last one folded into the one before when it
        would hold fewer than min_entries. Each chunk waits for the next one to begin before it is
        written, so no more than two chunks are held."""
        parts: list[Part] = []
        held: list[Resource] = []
        chunk: list[Resource] = []
        for resource in resources:
            chunk.append(resource)
            if len(chunk) == self.part_entries:
                if held:
                    parts.append(self._write_part("" if not parts else held[0].loc, held, at))
                held, chunk = chunk, []
        if held and len(chunk) < self.min_entries:
            held, chunk = held + chunk, []
        for piece in (held, chunk):
            if piece or not parts:
                parts.append(self._write_part("" if not parts else piece[0].loc, piece, at))
        return parts

    def _counts(self, db: sqlite3.Connection, touched: set[str]) -> tuple[list[int], dict[str, int]]:
        """The indexes of the parts holding a touched loc, and every part's resources by name:
        counted again for those, as written for the others (no change touched them since)."""
        lows = [part.low for part in self.parts]
        marked = sorted({bisect.bisect_right(lows, loc) - 1 for loc in touched})
        counts = {part.name: part.count for part in self.parts}
        for i in marked:
            counts[self.parts[i].name] = resource_count_between(db, self.topic, *self._range(self.parts, i))
        return marked, counts

    def _rewrite_parts(self, db: sqlite3.Connection, marked: list[int], counts: dict[str, int],
                       at: datetime) -> list[Part]:
        """Rewrite the parts `marked` (holding a touched loc), each with the neighbour it merges
        with when it would hold fewer than min_entries; the others stay as they are."""
        parts = list(self.parts)
        spans: list[tuple[int, int]] = []
        for i in marked:
            if 0 < counts[parts[i].name] < self.min_entries and len(parts) > 1:   # an empty one just goes
                neighbours = [j for j in (i - 1, i + 1) if 0 <= j < len(parts)]
                j = min(neighbours, key=lambda n: counts[parts[n].name])
                spans.append((min(i, j), max(i, j)))
            else:
                spans.append((i, i))
        # From the last span backwards, so the indexes of those not yet done hold.
        for first, last in reversed(_joined(spans)):
            low, high = parts[first].low, self._range(parts, last)[1]
            resources = list(iter_resources_between(db, self.topic, low, high))
            if not resources:   # total > part_entries: some part outside the run holds resources
                del parts[first:last + 1]
                if first == 0:  # the first part covers everything below the next one's first loc
                    parts[0] = Part("", parts[0].name, parts[0].count, parts[0].at)
                continue
            pieces = _balanced(resources, self._pieces_for(len(resources), last - first + 1))
            parts[first:last + 1] = [self._write_part(low if n == 0 else piece[0].loc, piece, at)
                                     for n, piece in enumerate(pieces)]
        return parts

    def _pieces_for(self, count: int, parts: int) -> int:
        """How many parts `count` resources that were in `parts` parts make: as many again while
        each then holds min_entries to 2 x part_entries, else part_entries each, roughly."""
        if self.min_entries * parts <= count <= 2 * self.part_entries * parts:
            return parts
        return max(1, round(count / self.part_entries))

    @staticmethod
    def _range(parts: list[Part], i: int) -> tuple[str, str | None]:
        """The locs part i covers: [its low, the next part's low), None: no upper bound."""
        return parts[i].low, parts[i + 1].low if i + 1 < len(parts) else None

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


def _joined(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(first, last) spans of parts, those sharing a part joined, in order. Spans that only touch
    stay apart: each is read into memory whole, so they stay a part or two long."""
    joined: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if joined and first <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(last, joined[-1][1]))
        else:
            joined.append((first, last))
    return joined


def _balanced(resources: list[Resource], pieces: int) -> list[list[Resource]]:
    """`resources` cut into `pieces` runs whose sizes differ by one at most."""
    size, extra = divmod(len(resources), pieces)
    cuts = [n * size + min(n, extra) for n in range(pieces + 1)]
    return [resources[cuts[n]:cuts[n + 1]] for n in range(pieces)]


__all__ = ["PART_ENTRIES", "RETIRE_SECONDS", "Part", "PartedResourceList"]

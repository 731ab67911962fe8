"""The Resource List of a Source's current state (core §10-11), written streaming to files.

`write_resource_list(resources, folder, ...)` takes any iterable of `Resource`s (for Sources
whose changes do not all pass through the publisher); `snapshot_resource_list` takes them
from the change memory in one read transaction, with `at` = the chain's last `until` they
reflect, so a baseline followed by catch-up from `at` has no seam. Past the Sitemap limits the list becomes
a Resource List Index with numbered parts. Memory stays flat in the number of resources.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rsnotify.lists import RESOURCE_LIST, ListInfo, ListRef, ListWriter, Resource
from rsnotify.notification import Link

from .store import ChangeMemory, iter_resources, resource_count, resources_at

RESOURCE_LIST_NAME = "resourcelist.xml"
MAX_ENTRIES = 50_000
MAX_BYTES = 50_000_000
_CLOSING_MARGIN = 64 * 1024  # room left under max_bytes for one more entry and the closing tag


@dataclass(frozen=True, slots=True)
class ResourceListFiles:
    """What was written: the main document and any parts, and the list's `at`."""

    folder: Path
    at: datetime
    main: Path           # resourcelist.xml: the list, or the index of the parts
    parts: tuple[Path, ...] = ()
    count: int = 0


def write_resource_list(
    resources: Iterable[Resource],
    folder: str | os.PathLike[str],
    *,
    at: datetime,
    up: str,
    part_url: Callable[[str], str],
    part_prefix: str = "resourcelist-",
    index_url: str | None = None,
    max_entries: int = MAX_ENTRIES,
    max_bytes: int = MAX_BYTES,
) -> ResourceListFiles:
    """Write `resources` into `folder`: `resourcelist.xml`, plus parts once past the limits.

    `part_url(name)` gives a part's URL for the index. Parts are written as the resources
    come; if only one part was needed it becomes `resourcelist.xml` itself. `index_url`: the
    index's URL, linked from each part as rel="index"; give it only when there will be parts.
    """
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    links = (Link("up", up),) + ((Link("index", index_url),) if index_url else ())
    info = ListInfo(RESOURCE_LIST, at=at, links=links)
    parts: list[Path] = []
    count = 0
    iterator = iter(resources)
    pending: Resource | None = next(iterator, None)
    while True:
        path = target / f"{part_prefix}{len(parts) + 1:04d}.xml"
        with path.open("wb") as out, ListWriter(out, info) as writer:
            while pending is not None and writer.entries < max_entries and writer.bytes_written < max_bytes - _CLOSING_MARGIN:
                writer.write(pending)
                count += 1
                pending = next(iterator, None)
        parts.append(path)
        if pending is None:
            break
    main = target / RESOURCE_LIST_NAME
    if len(parts) == 1:
        os.replace(parts[0], main)
        return ResourceListFiles(target, at, main, (), count)
    index = ListInfo(RESOURCE_LIST, is_index=True, at=at, links=(Link("up", up),))
    with main.open("wb") as out, ListWriter(out, index) as writer:
        for part in parts:
            writer.write(ListRef(part_url(part.name), at=at))
    return ResourceListFiles(target, at, main, tuple(parts), count)


def snapshot_resource_list(
    memory: ChangeMemory,
    topic: str,
    folder: str | os.PathLike[str],
    *,
    up: str,
    part_url: Callable[[str], str],
    index_url: str | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
    max_entries: int = MAX_ENTRIES,
    max_bytes: int = MAX_BYTES,
) -> ResourceListFiles:
    """The topic's current resources from `memory`, written into a new subfolder of `folder`
    named after `at` (so parts of different snapshots never mix). `index_url`: where the
    index will be served, for the parts' rel="index" links."""
    memory.update_resources(topic)
    with memory.snapshot() as db:
        # `at` is the chain's end when the resources were last brought up to date: the list
        # reflects every change up to it (a later change may already be recorded; catch-up
        # from `at` replays it, harmlessly).
        at = resources_at(db, topic) or now()
        base = Path(folder)
        base.mkdir(parents=True, exist_ok=True)
        target = Path(tempfile.mkdtemp(prefix=at.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ-"), dir=base))
        prefix = f"resourcelist-{target.name}-"
        # Counted first, so parts link to the index only when there is one.
        split = resource_count(db, topic) > max_entries
        return write_resource_list(
            iter_resources(db, topic), target, at=at, up=up, part_url=part_url, part_prefix=prefix,
            index_url=index_url if split else None, max_entries=max_entries, max_bytes=max_bytes,
        )

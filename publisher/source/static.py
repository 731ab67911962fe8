"""`rsnotify source --write OUT`: a folder's Source documents written as files, for a web server
that already serves the folder (nginx, Apache, a bucket) to serve beside it.

Scanning, recording and publishing are `Source`'s own (the same change memory and outbox);
this module only turns the memory into files in OUT: the Source Description, the Capability
List, the Resource List (or index and parts, rewritten in proportion to each batch of changes:
static_resourcelist.py), the Change List document and each Change List, and an empty topic file.
Every file is written under a temporary name and renamed, so a web server never serves half a
document. No HTTP here.
"""
from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..memory.changelist import changelist_name
from ..memory.store import changelists
from .server import Source
from .static_resourcelist import PartedResourceList

log = logging.getLogger(__name__)

SOURCE_DESCRIPTION_NAME = "sourcedescription.xml"
CAPABILITY_LIST_NAME = "capabilitylist.xml"
CHANGE_LIST_NAME = "changelist.xml"
TOPIC_NAME = "changes"
TEMPORARY_PREFIX = ".rsnotify-write-"  # files being written; reserved so a scan of SRC skips them


class StaticSource(Source):
    """A `Source` that writes its documents into `out` after every recorded change, instead of
    serving them. `out` may be the folder itself (the Source's names are reserved there)."""

    def __init__(self, *args: Any, out: Path, **options: Any) -> None:
        super().__init__(*args, **options)
        self.out = out
        self.resource_list = PartedResourceList(
            self.memory, self.publisher.topic_url, out, url=self.urls.child, up=self.urls.capability_list,
            temporary_prefix=TEMPORARY_PREFIX,
        )

    def _publish(self, changes: list) -> int:
        count = super()._publish(changes)
        if count:
            # The outbox may already be sending: the lists trail the notification by the time
            # it takes to write them (the notification carries the changes themselves).
            self.write_lists()
        return count

    def write_all(self) -> None:
        """Write every document: the fixed ones, then the lists."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._put(SOURCE_DESCRIPTION_NAME, self._source_description)
        self._put(CAPABILITY_LIST_NAME, self._capability_list)
        if not (self.out / TOPIC_NAME).is_file():
            # The topic URI answers 200 with no body until a web server is told otherwise;
            # its Link headers come from the server's configuration (see the README).
            self._put(TOPIC_NAME, b"")
        self.write_lists()

    def write_lists(self) -> None:
        """Write the Resource List and the Change Lists as the memory holds them now."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._write_resource_list()
        self._write_changelists()

    # -- lists ----------------------------------------------------------------------------------

    def _write_resource_list(self) -> None:
        self.resource_list.write()

    def _write_changelists(self) -> None:
        topic = self.publisher.topic_url
        with self.memory.snapshot() as db:
            records = changelists(db, topic)
            names = set()
            for record in records:
                name = changelist_name(record)
                names.add(name)
                if not record.is_open and (self.out / name).is_file():
                    continue  # closed lists never change
                self._put(name, self._changelist_bytes(db, record))
            document = io.BytesIO()
            self._write_changelist_document(db, document)
        self._put(CHANGE_LIST_NAME, document.getvalue())
        # Lists the memory no longer keeps (--keep) leave the index first, then the folder.
        self._remove(path for path in self.out.glob("changelist-*.xml") if path.name not in names)

    # -- files ----------------------------------------------------------------------------------

    def _put(self, name: str, data: bytes) -> None:
        target = self.out / name
        if target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data:
            return  # unchanged: keep its Last-Modified and ETag for clients' caches
        temporary = self.out / f"{TEMPORARY_PREFIX}{name}"
        temporary.write_bytes(data)
        os.replace(temporary, target)

    @staticmethod
    def _remove(paths: Iterable[Path]) -> None:
        for path in paths:
            path.unlink(missing_ok=True)


__all__ = ["SOURCE_DESCRIPTION_NAME", "TEMPORARY_PREFIX", "StaticSource"]

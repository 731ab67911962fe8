"""`rsnotify source` at work: a folder served as a ResourceSync Source over HTTP, its changes
recorded in the change memory and published to the hub(s) through the outbox.

Serves the files (GET/HEAD with Content-Length, ETag, Last-Modified), the Source Description,
the Capability List, the Resource List (or index and parts), the Change List (or index) and
each list, and the topic URI. Scans the folder at start against the memory, then follows it
with watchfiles and a periodic rescan.
"""
from __future__ import annotations

import asyncio
import io
import logging
import shutil
import sqlite3
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import watchfiles
from aiohttp import web

from rsnotify.notification import CapabilityEntry, CapabilityList, SourceDescription
from rsnotify.xml import capability_list_to_xml, source_description_to_xml

from ..advertise import set_capabilities
from ..client import Publisher
from ..errors import ChangeInputError, StateError
from ..memory.changelist import (
    changelist_name,
    find_changelist,
    write_changelist,
    write_changelist_document,
)
from ..memory.resourcelist import RESOURCE_LIST_NAME
from ..memory.store import ChangeListRecord, ChangeMemory
from ..outbox import Outbox
from ..web.topic import Topic, topic_handler
from .folder import Folder, changes_against, media_type
from .static_resourcelist import PartedResourceList

log = logging.getLogger(__name__)

XML = "application/xml"
IMMUTABLE = "public, max-age=31536000, immutable"
RESERVED_NAMES = (
    "sourcedescription.xml", "capabilitylist.xml", "resourcelist.xml", "resourcelist-*",
    "changelist.xml", "changelist-*", "changes",
)
_FULL_RESCAN_PATHS = 200  # a batch touching more paths than this is handled by a full rescan
_MAX_BODY = 64 * 1024     # bytes of an (unused) request body taken in before refusing it
_WRITING_PREFIX = ".partial-"  # a served Resource List file being written: never a name served
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class SourceUrls:
    """Where a Source's documents live, from its base URL (which ends with "/")."""

    base: str

    @property
    def is_host_root(self) -> bool:
        return urlsplit(self.base).path in ("", "/")

    @property
    def source_description(self) -> str:
        parts = urlsplit(self.base)
        if self.is_host_root:
            return f"{parts.scheme}://{parts.netloc}/.well-known/resourcesync"
        return self.base + "sourcedescription.xml"

    @property
    def capability_list(self) -> str:
        return self.base + "capabilitylist.xml"

    @property
    def resource_list(self) -> str:
        return self.base + "resourcelist.xml"

    @property
    def change_list(self) -> str:
        return self.base + "changelist.xml"

    @property
    def topic(self) -> str:
        return self.base + "changes"

    def child(self, name: str) -> str:
        return self.base + name


class Source:
    """A folder as a Source: scanning, publishing and the HTTP app serving it."""

    def __init__(
        self,
        folder: Folder,
        urls: SourceUrls,
        publisher: Publisher,
        outbox: Outbox,
        memory: ChangeMemory,
        cache_dir: Path,
        *,
        rescan_seconds: float = 60.0,
        body_timeout: float = 60.0,
    ) -> None:
        self.folder = folder
        self.urls = urls
        self.publisher = publisher
        self.outbox = outbox
        self.memory = memory
        self.cache_dir = cache_dir
        self.rescan_seconds = rescan_seconds
        self.body_timeout = body_timeout
        self.topic = Topic.from_publisher(publisher)
        self._scan_lock = threading.Lock()
        self._render_lock = asyncio.Lock()
        # The served Resource List is kept in the cache as --write keeps it in OUT: an index of
        # parts by loc range, a change rewriting only the parts holding its locs.
        self._served_list = PartedResourceList(
            memory, publisher.topic_url, cache_dir / "resourcelists", url=urls.child, up=urls.capability_list,
            temporary_prefix=_WRITING_PREFIX,
        )
        self._served_until: datetime | None = None  # the chain's end when the served list was last brought up to date
        self._served_once = False
        # Lists of an earlier run are stale; closed Change Lists in the cache stay valid.
        shutil.rmtree(cache_dir / "resourcelists", ignore_errors=True)
        self._capability_list = capability_list_to_xml(self._build_capability_list())
        self._source_description = source_description_to_xml(
            SourceDescription((CapabilityEntry(urls.capability_list, "capabilitylist"),))
        )

    def _build_capability_list(self) -> CapabilityList:
        return set_capabilities(
            CapabilityList(up=self.urls.source_description),
            resourcelist=self.urls.resource_list,
            changelist=self.urls.change_list,
            topic_url=self.urls.topic,
            hub_urls=self.publisher.hub_urls,
        )

    # -- changes -------------------------------------------------------------------------------

    def sync_folder(self) -> int:
        """Compare the whole folder with the memory; record and queue what changed."""
        with self._scan_lock:
            current = self.folder.scan()
            recorded = self._recorded()
            return self._publish(changes_against(current, recorded, complete=True))

    def sync_paths(self, paths: Iterable[Path]) -> int:
        """Look at `paths` only (from the watcher); record and queue what changed."""
        paths = list(paths)
        if len(paths) > _FULL_RESCAN_PATHS:
            return self.sync_folder()
        with self._scan_lock:
            present, gone = self.folder.states(paths)
            recorded = self._recorded([*present, *gone])
            return self._publish(changes_against(present, recorded, complete=False, gone=gone))

    def _recorded(self, locs: Iterable[str] | None = None) -> dict[str, str | None]:
        """What the memory holds: every resource's hash, or only those of `locs`."""
        return self.memory.recorded_hashes(self.publisher.topic_url, locs)

    def _publish(self, changes: list) -> int:
        if not changes:
            return 0
        try:
            ids = self.outbox.add(changes)
        except ChangeInputError as exc:
            # the changes are dated by the clock here, so the refusal is about the memory's
            # chain: it ends later than the clock allows (a clock set back by more than the
            # publisher's future_skew, or a chain dated in the future by an older rsnotify)
            raise StateError(f"cannot record the changes in the change memory {self.memory.path}: {exc} "
                             "(its chain ends later than this machine's clock allows: wait for the clock to "
                             "pass that end, or start a new chain in another --db file)") from None
        counts = Counter(change.change.value for change in changes)
        log.info(
            "recorded %d change(s) (%s) in notification(s) %s; queued for %s",
            len(changes), ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())), ids,
            ", ".join(self.publisher.hub_urls),
        )
        return len(changes)

    async def watch(self, stop: asyncio.Event) -> None:
        """Follow the folder until `stop` is set: watchfiles events, and a full rescan every
        `rescan_seconds` as a safety net for events the OS did not report."""
        rescan = asyncio.create_task(self._rescan_periodically(stop))
        try:
            async for batch in watchfiles.awatch(
                self.folder.root, watch_filter=None, debounce=50, step=10, stop_event=stop, recursive=True
            ):
                paths = {Path(path) for _change, path in batch}
                try:
                    await asyncio.to_thread(self.sync_paths, paths)
                except StateError as exc:    # said in words; the rescan tries again
                    log.error("could not record the changes of %d path(s): %s", len(paths), exc)
                except Exception:  # keep watching: the rescan retries what this missed
                    log.exception("could not record the changes of %d path(s)", len(paths))
        finally:
            rescan.cancel()

    async def _rescan_periodically(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.rescan_seconds)
                return
            except TimeoutError:
                pass
            try:
                await asyncio.to_thread(self.sync_folder)
            except StateError as exc:
                log.error("the periodic rescan of %s failed: %s", self.folder.root, exc)
            except Exception:
                log.exception("the periodic rescan of %s failed", self.folder.root)

    # -- HTTP ----------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._bounded_body])
        # [\s\S], not ".": a file name may hold a line break (listed as %0A), which "." never matches
        app.router.add_route("*", "/{tail:[\\s\\S]*}", self.handle)
        return app

    @web.middleware
    async def _bounded_body(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Take in whatever body a request carries within `body_timeout` (408 beyond) and at most
        _MAX_BODY bytes (413 beyond), before answering: the Source reads no bodies, and a client
        trickling one must not hold its connection open for long."""
        if request.body_exists:
            size = 0
            try:
                async with asyncio.timeout(self.body_timeout):
                    while chunk := await request.content.read(1 << 16):
                        size += len(chunk)
                        if size > _MAX_BODY:
                            raise web.HTTPRequestEntityTooLarge(_MAX_BODY, size, text="this Source takes no "
                                                                "request bodies", headers={"Connection": "close"})
            except TimeoutError:
                raise web.HTTPRequestTimeout(text=f"the request body did not arrive within {self.body_timeout:g} s",
                                             headers={"Connection": "close"}) from None
            except web.RequestPayloadError:  # e.g. Content-Encoding: gzip on bytes that are not gzip
                raise web.HTTPBadRequest(text="the request body cannot be read as sent (and this Source takes "
                                              "no request bodies)", headers={"Connection": "close"}) from None
        return await handler(request)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"], text="this Source answers GET and HEAD only")
        path = request.rel_url.raw_path
        base_path = urlsplit(self.urls.base).path or "/"
        if path == "/.well-known/resourcesync" and self.urls.is_host_root:
            return _xml(self._source_description)
        if not path.startswith(base_path):
            raise web.HTTPNotFound(text=f"{path} is not under this Source's base {base_path}")
        name = path[len(base_path):]
        if name == "capabilitylist.xml":
            return _xml(self._capability_list)
        if name == "sourcedescription.xml" and not self.urls.is_host_root:
            return _xml(self._source_description)
        if name == "changes":
            return await topic_handler(self.topic)(request)
        if name == "resourcelist.xml" or name.startswith("resourcelist-"):
            return await self._resource_list(name)
        if name == "changelist.xml":
            return _xml(await asyncio.to_thread(self._render_changelist_document), cache="no-cache")
        if name.startswith("changelist-"):
            return await self._changelist(name)
        file = self.folder.path_for(name)
        if file is None:
            raise web.HTTPNotFound(text=f"no resource at {path}")
        return web.FileResponse(file, headers={"Content-Type": media_type(file)})

    # -- the documents, rendered alike whether served (here) or written into a folder (static.py) --

    def _render_changelist_document(self) -> bytes:
        out = io.BytesIO()
        with self.memory.snapshot() as db:
            self._write_changelist_document(db, out)
        return out.getvalue()

    def _write_changelist_document(self, db: sqlite3.Connection, out: BinaryIO) -> None:
        """The Change List (or its index) `changelist.xml`, as of the memory snapshot `db`."""
        write_changelist_document(
            db, self.publisher.topic_url, out, up=self.urls.capability_list,
            list_url=lambda record: self.urls.child(changelist_name(record)), now=lambda: datetime.now(UTC),
        )

    def _changelist_bytes(self, db: sqlite3.Connection, record: ChangeListRecord) -> bytes:
        """One Change List of the index, as of the memory snapshot `db`."""
        out = io.BytesIO()
        write_changelist(db, record, out, up=self.urls.capability_list, index=self.urls.change_list)
        return out.getvalue()

    def _bring_served_list_up_to_date(self, until: datetime | None) -> None:
        """Rewrite the parts of the served Resource List (and its index) that changes since the
        last write touched; `until` is the chain's end read before, what the list now reflects."""
        self._served_list.out.mkdir(parents=True, exist_ok=True)
        self._served_list.write()
        self._served_until, self._served_once = until, True

    async def _changelist(self, name: str) -> web.StreamResponse:
        cached = self.cache_dir / "changelists" / name
        rendered = await asyncio.to_thread(self._render_changelist, name, cached)
        if rendered is None:
            cached.unlink(missing_ok=True)
            raise web.HTTPNotFound(text=f"no Change List {name} (unknown, or older than what this Source keeps)")
        if isinstance(rendered, Path):  # closed lists are immutable: rendered once, then served from disk
            return web.FileResponse(rendered, headers={"Content-Type": XML, "Cache-Control": IMMUTABLE})
        return _xml(rendered, cache="no-cache")

    def _render_changelist(self, name: str, cached: Path) -> bytes | Path | None:
        """The open list's bytes, a closed list's cached file, or None for no such list."""
        with self.memory.snapshot() as db:
            record = find_changelist(db, self.publisher.topic_url, name)
            if record is None:
                return None
            if not record.is_open and cached.is_file():
                return cached
            body = self._changelist_bytes(db, record)
        if record.is_open:
            return body
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(".partial")
        partial.write_bytes(body)
        partial.replace(cached)
        return cached

    async def _resource_list(self, name: str) -> web.StreamResponse:
        async with self._render_lock:
            # The chain's end is read first and cheaply: a GET with no change recorded since the
            # last one touches no file and takes no write transaction.
            until = self.memory.last_until(self.publisher.topic_url)
            if not self._served_once or until != self._served_until:
                await asyncio.to_thread(self._bring_served_list_up_to_date, until)
        if name == RESOURCE_LIST_NAME:
            # Replaced by a rename, never rewritten in place: the file opened is whole.
            return web.FileResponse(self._served_list.out / RESOURCE_LIST_NAME,
                                    headers={"Content-Type": XML, "Cache-Control": "no-cache"})
        part = self._served_list.part_path(name)
        if part is None:
            raise web.HTTPNotFound(text=f"no Resource List part {name} (a newer Resource List replaced it)")
        # A part is written once under a name never used again, so it never changes.
        return web.FileResponse(part, headers={"Content-Type": XML, "Cache-Control": IMMUTABLE})


def _xml(body: bytes, *, cache: str = "no-cache") -> web.Response:
    return web.Response(body=body, headers={"Content-Type": XML, "Cache-Control": cache})


__all__ = ["RESERVED_NAMES", "Source", "SourceUrls"]

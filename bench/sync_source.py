"""A loopback Source for the sync benchmark, run as its own process:
`python -m bench.sync_source PORT COUNT [HUB_URL]`.

Serves COUNT resources of 2 KB (bytes derived from the index and a version, never all held in
memory), a Capability List, a Resource List (a Resource List Index past 50,000 entries, md5 +
length + lastmod), an open Change List of the changes made through POST /admin/changes, and
advertises a channel at HUB_URL. POST /admin/changes?count=N&kinds=mixed|update makes N
changes (mixed: 60% updates, 20% creations, 20% deletions) and answers them as JSON, so the
benchmark can publish them. Prints "ready" on stdout once it listens.
"""
from __future__ import annotations

import hashlib
import io
import sys
from datetime import UTC, datetime

from aiohttp import web

from rsnotify.datetimes import format_datetime
from rsnotify.lists import ListInfo, ListRef, ListWriter, Resource
from rsnotify.notification import (
    CapabilityEntry,
    CapabilityList,
    ChangeType,
    Link,
    ResourceChange,
)
from rsnotify.xml import capability_list_to_xml

SIZE = 2048
PART = 50_000


def body(index: int, version: int) -> bytes:
    seed = hashlib.sha256(f"{index}:{version}".encode()).digest()
    return (seed * (SIZE // len(seed) + 1))[:SIZE]


class BenchSource:
    def __init__(self, count: int, hub: str | None) -> None:
        self.hub = hub
        self.versions: dict[int, int] = dict.fromkeys(range(count), 0)
        self.next_index = count
        self.at = datetime.now(UTC)
        self.changes: list[ResourceChange] = []
        self.base = ""
        self.gets = 0

    def loc(self, index: int) -> str:
        return f"{self.base}/r/{index}"

    def resource(self, index: int) -> Resource:
        data = body(index, self.versions[index])
        return Resource(self.loc(index), lastmod=self.at, hashes=(("md5", hashlib.md5(data).hexdigest()),),
                        length=len(data))

    def render(self, info: ListInfo, entries) -> bytes:  # type: ignore[no-untyped-def]
        out = io.BytesIO()
        with ListWriter(out, info) as writer:
            for entry in entries:
                writer.write(entry)
        return out.getvalue()

    async def handle(self, request: web.Request) -> web.Response:
        path = request.path
        if path.startswith("/r/"):
            index = int(path[3:])
            if index not in self.versions:
                raise web.HTTPNotFound()
            self.gets += 1
            return web.Response(body=body(index, self.versions[index]), content_type="application/octet-stream")
        up = (Link("up", f"{self.base}/caps.xml"),)
        if path == "/caps.xml":
            entries = [CapabilityEntry(f"{self.base}/resourcelist.xml", "resourcelist"),
                       CapabilityEntry(f"{self.base}/changelist.xml", "changelist")]
            if self.hub:
                entries.append(CapabilityEntry(f"{self.base}/changes", "change-notification",
                                               links=(Link("hub", self.hub),)))
            return web.Response(body=capability_list_to_xml(CapabilityList(tuple(entries))),
                                content_type="application/xml")
        indexes = sorted(self.versions)
        if path == "/resourcelist.xml":
            if len(indexes) <= PART:
                document = self.render(ListInfo("resourcelist", at=self.at, links=up),
                                       (self.resource(i) for i in indexes))
            else:
                parts = [ListRef(f"{self.base}/resourcelist-{n}.xml", at=self.at)
                         for n in range((len(indexes) + PART - 1) // PART)]
                document = self.render(ListInfo("resourcelist", is_index=True, at=self.at, links=up), parts)
            return web.Response(body=document, content_type="application/xml")
        if path.startswith("/resourcelist-"):
            n = int(path.split("-")[1].split(".")[0])
            part = indexes[n * PART:(n + 1) * PART]
            return web.Response(body=self.render(ListInfo("resourcelist", at=self.at, links=up),
                                                 (self.resource(i) for i in part)), content_type="application/xml")
        if path == "/changelist.xml":
            return web.Response(body=self.render(ListInfo("changelist", from_=self.at, links=up), self.changes),
                                content_type="application/xml")
        if path == "/gets":
            return web.json_response({"gets": self.gets})
        raise web.HTTPNotFound()

    async def make_changes(self, request: web.Request) -> web.Response:
        count = int(request.query.get("count", "10"))
        mixed = request.query.get("kinds", "mixed") == "mixed"
        now = datetime.now(UTC)
        made = []
        # updates walk through the resources, so consecutive batches touch different files
        ordered = sorted(self.versions)
        self.cursor = getattr(self, "cursor", 0) % max(1, len(ordered))
        existing = iter(ordered[self.cursor:] + ordered[:self.cursor])
        self.cursor += count
        for n in range(count):
            share = n % 5
            if not self.versions or len(made) >= len(self.versions) - 1:
                share = 3   # nothing left to update or delete: create
            if (mixed or not self.versions) and share == 3:
                index, kind = self.next_index, ChangeType.CREATED
                self.next_index += 1
                self.versions[index] = 0
            elif mixed and share == 4:
                index, kind = next(existing), ChangeType.DELETED
                del self.versions[index]
            else:
                index, kind = next(existing), ChangeType.UPDATED
                self.versions[index] += 1
            if kind is ChangeType.DELETED:
                change = ResourceChange(self.loc(index), kind, changed_at=now)
            else:
                data = body(index, self.versions[index])
                change = ResourceChange(self.loc(index), kind, changed_at=now, length=len(data),
                                        hashes=(("md5", hashlib.md5(data).hexdigest()),))
            self.changes.append(change)
            made.append({"loc": change.loc, "change": kind.value, "datetime": format_datetime(now),
                         "length": change.length, "hash": change.hash,
                         "md5": hashlib.md5(body(index, self.versions[index])).hexdigest()
                         if kind is not ChangeType.DELETED else None})
        return web.json_response(made)


def main() -> None:
    port, count = int(sys.argv[1]), int(sys.argv[2])
    hub = sys.argv[3] if len(sys.argv) > 3 else None
    source = BenchSource(count, hub)
    source.base = f"http://127.0.0.1:{port}"
    app = web.Application()
    app.router.add_post("/admin/changes", source.make_changes)
    app.router.add_route("GET", "/{tail:.*}", source.handle)
    # run_app prints once the socket listens: that line is the "ready" signal
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=lambda _: print("ready", flush=True))


if __name__ == "__main__":
    main()

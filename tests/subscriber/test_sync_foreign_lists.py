"""A Source is the origin of its Capability List: a Resource List, Change List or an index part
on another origin is refused before it is read (one line, exit 1, nothing fetched or deleted),
unless --allow-host names its host, the user's own word that it belongs to the Source. So a
Capability List cannot make the copy take another server's files, and a re-baseline or an
`audit --repair` fed by a foreign list cannot delete the copy. Real `rsnotify sync --once` and
`rsnotify audit` processes against two loopback servers."""
from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web

from rsnotify.lists import ListInfo, ListRef, Resource
from rsnotify.notification import (
    CapabilityEntry,
    CapabilityList,
    ChangeType,
    ResourceChange,
)
from rsnotify.subscriber.sync.remote import ListOrigins
from rsnotify.xml import capability_list_to_xml
from tests.subscriber.test_sync_trust import RSNOTIFY, snapshot, sync_once
from tests.support.ports import free_port
from tests.support.servers import ThreadedServer
from tests.support.sources import list_bytes

T0 = datetime(2026, 3, 1, tzinfo=UTC)


@dataclass
class Origin:
    """A loopback server serving whatever documents and bodies the test puts at raw paths."""

    port: int
    documents: dict[str, bytes] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.Response:
        self.hits.append(request.raw_path)
        body = self.documents.get(request.raw_path)
        if body is None:
            raise web.HTTPNotFound()
        return web.Response(body=body, content_type="application/xml" if request.raw_path.endswith(".xml")
                            else "text/plain")

    def app(self) -> web.Application:
        app = web.Application()

        async def handle(request: web.Request) -> web.Response:
            return await self.handle(request)

        app.router.add_route("GET", "/{tail:.*}", handle)
        return app

    def serve(self, path: str, body: bytes) -> Resource:
        self.documents[path] = body
        return Resource(self.base + path, hashes=(("md5", hashlib.md5(body).hexdigest()),), length=len(body))

    def caps(self, resourcelist: str, changelist: str | None = None) -> None:
        entries = [CapabilityEntry(resourcelist, "resourcelist")]
        if changelist:
            entries.append(CapabilityEntry(changelist, "changelist"))
        self.documents["/caps.xml"] = capability_list_to_xml(CapabilityList(tuple(entries)))

    def resourcelist(self, path: str, entries: list) -> str:
        info = ListInfo("resourcelist", at=T0, is_index=bool(entries) and isinstance(entries[0], ListRef))
        self.documents[path] = list_bytes(info, entries)
        return self.base + path


def audit_repair(source: Origin, dest: Path) -> tuple[int, str]:
    done = subprocess.run([RSNOTIFY, "audit", "--repair", "--capability-list", source.base + "/caps.xml", "--dir",
                           str(dest)], capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stderr


@pytest.fixture
def two_origins():
    source, other = Origin(free_port()), Origin(free_port())
    servers = [ThreadedServer(o.app(), port=o.port).start() for o in (source, other)]
    yield source, other
    for server in servers:
        server.stop()


def test_a_resource_list_on_another_origin_is_refused_and_nothing_is_taken(two_origins, tmp_path):
    source, other = two_origins
    foreign = other.resourcelist("/rl.xml", [other.serve("/theirs.txt", b"another server's file\n"),
                                             source.serve("/mine.txt", b"the Source's file\n")])
    source.caps(foreign)
    dest = tmp_path / "dest"
    run = sync_once(source, dest)
    assert run.code == 1, run.stderr
    line = [x for x in run.stderr.splitlines() if "another origin" in x]
    assert line and foreign in line[0] and f"--allow-host 127.0.0.1:{other.port}" in line[0], run.stderr
    assert other.hits == [] and "/mine.txt" not in source.hits         # the list was never read
    assert snapshot(dest) == {} or not [p for p in dest.rglob("*.txt")]

    # the user says it is the Source's: read, and both its entries fetched into their host folders
    run = sync_once(source, dest, "--allow-host", f"127.0.0.1:{other.port}")
    assert run.code == 0, run.stderr
    assert (dest / f"127.0.0.1_{other.port}" / "theirs.txt").read_bytes() == b"another server's file\n"
    assert (dest / f"127.0.0.1_{source.port}" / "mine.txt").read_bytes() == b"the Source's file\n"


def synced_copy_of_three(source: Origin, tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    """Three resources listed by the Source's own Resource List, synced: (--dir, the copy, its
    files as they are)."""
    own = [source.serve(f"/r{i}.txt", f"resource {i}\n".encode()) for i in range(3)]
    source.caps(source.resourcelist("/rl.xml", own))
    dest = tmp_path / "dest"
    assert sync_once(source, dest).code == 0
    copy = dest / f"127.0.0.1_{source.port}"
    before = snapshot(copy)
    assert len(before) == 3
    return dest, copy, before


def test_an_index_part_on_another_origin_is_refused_before_anything_is_deleted(two_origins, tmp_path):
    source, other = two_origins
    dest, copy, before = synced_copy_of_three(source, tmp_path)

    # the Source's index now names a part on another server listing nothing of the Source's
    empty = other.resourcelist("/part.xml", [other.serve("/x.txt", b"x\n")])
    source.caps(source.resourcelist("/index.xml", [ListRef(empty, at=T0)]))
    run = sync_once(source, dest)
    assert run.code == 1 and "another origin" in run.stderr, run.stderr
    assert snapshot(copy) == before and other.hits == []
    code, stderr = audit_repair(source, dest)
    assert code == 1 and "another origin" in stderr, stderr
    assert snapshot(copy) == before and other.hits == []


def test_a_capability_list_naming_a_foreign_list_cannot_make_audit_repair_delete_the_copy(two_origins, tmp_path):
    source, other = two_origins
    dest, copy, before = synced_copy_of_three(source, tmp_path)

    source.caps(other.resourcelist("/rl.xml", []))      # an empty list elsewhere: "everything is gone"
    code, stderr = audit_repair(source, dest)
    assert code == 1 and "another origin" in stderr, stderr
    assert snapshot(copy) == before and other.hits == []
    run = sync_once(source, dest)
    assert run.code == 1 and snapshot(copy) == before, run.stderr


def test_a_change_list_on_another_origin_is_refused_and_its_deletes_never_applied(two_origins, tmp_path):
    source, other = two_origins
    own = [source.serve(f"/r{i}.txt", f"resource {i}\n".encode()) for i in range(2)]
    changes = [ResourceChange(r.loc, ChangeType.DELETED, changed_at=T0 + timedelta(minutes=1)) for r in own]
    other.documents["/cl.xml"] = list_bytes(ListInfo("changelist", from_=T0), changes)
    source.caps(source.resourcelist("/rl.xml", own), other.base + "/cl.xml")
    dest = tmp_path / "dest"
    run = sync_once(source, dest)
    assert run.code == 1, run.stderr
    assert [x for x in run.stderr.splitlines() if f"Change List {other.base}/cl.xml refused" in x], run.stderr
    assert other.hits == []
    assert sorted(snapshot(dest / f"127.0.0.1_{source.port}")) == ["r0.txt", "r1.txt"]


def test_a_list_under_the_unicode_spelling_of_the_sources_idn_host_is_the_sources() -> None:
    # discovery records the Capability List's URL with the host as DNS spells it (punycode); a
    # Source writing its own host in Unicode in its lists is still on its own origin
    lists = ListOrigins("http://xn--bcher-kva.example:8080/capabilitylist.xml", allowed_hosts=())
    assert lists.refusal("http://b\u00fccher.example:8080/resourcelist.xml") is None
    assert lists.refusal("http://BÜCHER.example:8080/changelist.xml") is None
    assert lists.refusal("http://b\u00fccher.example:8081/resourcelist.xml") is not None
    assert lists.refusal("http://other.example:8080/resourcelist.xml") is not None

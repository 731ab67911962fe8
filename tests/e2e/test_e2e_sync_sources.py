"""`rsnotify sync` against Sources that offer less than `rsnotify source`: a Resource List and a
channel but no Change List (catch-up is a re-baseline), and a channel alone (a gap cannot be
filled: it is reported, never absorbed). The Source is a small aiohttp site in the test; the
hub and the Destination are real `rsnotify hub` / `rsnotify sync` processes."""
from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web

from rsnotify.lists import ListInfo, Resource
from rsnotify.notification import (
    CapabilityEntry,
    CapabilityList,
    ChangeNotification,
    ChangeType,
    Link,
    ResourceChange,
)
from rsnotify.publisher import Publisher
from tests.support.hubproc import HubProcess, start_hub
from tests.support.ports import free_port
from tests.support.sources import list_bytes
from rsnotify.xml import capability_list_to_xml

RSNOTIFY = str(Path(sys.executable).with_name("rsnotify"))


class SmallSource:
    """Resources in a dict, a Capability List, optionally a Resource List (at = the chain's
    last until), a channel at the hub; notifications chained from/until."""

    def __init__(self, hub: str, with_resource_list: bool) -> None:
        self.hub = hub
        self.with_resource_list = with_resource_list
        self.resources: dict[str, bytes] = {}
        self.base = ""
        self.last_until = datetime(2026, 1, 1, tzinfo=UTC)
        self.resource_gets = 0

    def url(self, path: str) -> str:
        return self.base + path

    @property
    def topic(self) -> str:
        return self.url("/changes")

    async def handle(self, request: web.Request) -> web.Response:
        if request.path == "/capabilitylist.xml":
            entries = [CapabilityEntry(self.topic, "change-notification", links=(Link("hub", self.hub),))]
            if self.with_resource_list:
                entries.insert(0, CapabilityEntry(self.url("/resourcelist.xml"), "resourcelist"))
            document = CapabilityList(tuple(entries), up=self.url("/.well-known/resourcesync"))
            return web.Response(body=capability_list_to_xml(document), content_type="application/xml")
        if request.path == "/resourcelist.xml" and self.with_resource_list:
            body = list_bytes(ListInfo("resourcelist", at=self.last_until), [
                Resource(self.url(path), hashes=(("md5", hashlib.md5(data).hexdigest()),), length=len(data))
                for path, data in sorted(self.resources.items())])
            return web.Response(body=body, content_type="application/xml")
        if request.path in self.resources:
            self.resource_gets += 1
            return web.Response(body=self.resources[request.path], content_type="text/plain")
        raise web.HTTPNotFound()

    def change(self, path: str, body: bytes | None, when: datetime) -> ResourceChange:
        if body is None:
            self.resources.pop(path, None)
            return ResourceChange(self.url(path), ChangeType.DELETED, changed_at=when)
        kind = ChangeType.UPDATED if path in self.resources else ChangeType.CREATED
        self.resources[path] = body
        return ResourceChange(self.url(path), kind, changed_at=when, length=len(body),
                              hashes=(("md5", hashlib.md5(body).hexdigest()),))

    async def publish(self, edits: dict[str, bytes | None]) -> None:
        start = self.last_until
        until = start + timedelta(seconds=10)
        changes = tuple(self.change(path, body, start + timedelta(seconds=1)) for path, body in edits.items())
        async with Publisher(self.hub, self.topic) as publisher:
            await publisher.submit(ChangeNotification(start, until, changes))
        self.last_until = until


async def serve(source: SmallSource) -> web.AppRunner:
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", source.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    source.base = f"http://127.0.0.1:{port}"
    return runner


class SyncProcess:
    def __init__(self, tmp: Path, name: str, args: list[str]) -> None:
        self.out = tmp / f"{name}.jsonl"
        self.log = tmp / f"{name}.log"
        with self.out.open("wb") as out, self.log.open("wb") as err:
            self.process = subprocess.Popen([RSNOTIFY, "sync", "--json", *args], stdout=out, stderr=err)

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def stop(self, sig: int) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


async def wait_until(condition: Callable[[], bool], what: str, proc: SyncProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.process.poll() is not None:
            raise AssertionError(f"{what}: sync exited {proc.process.returncode}\n{proc.log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{proc.log.read_text()[-4000:]}")
        await asyncio.sleep(0.1)


def copy_of(dest: Path, source: SmallSource) -> dict[str, bytes]:
    root = dest / source.base.split("//", 1)[1].replace(":", "_")
    return {"/" + p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()} \
        if root.exists() else {}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RSNOTIFY, *args], check=False, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """One `rsnotify hub` (embedded Redis, one worker, quick retries, dead letter after two
    attempts) for this module: each test has its own Source (its own topic) and Destination."""
    workdir = tmp_path_factory.mktemp("hub")
    process = start_hub(workdir, "--retry-base", "0.2", "--max-attempts", "2", data_dir=workdir / "data", workers=1)
    yield process
    process.stop()


async def test_source_without_change_lists_catches_up_by_rebaseline(hub, tmp_path):
    source = SmallSource(hub.url, with_resource_list=True)
    for i in range(60):
        source.resources[f"/r{i}.txt"] = f"resource {i}".encode()
    runner = await serve(source)
    dest, port = tmp_path / "dest", free_port()
    args = ["--capability-list", source.url("/capabilitylist.xml"), "--dir", str(dest),
            "--listen", f"127.0.0.1:{port}"]
    try:
        first = SyncProcess(tmp_path, "sync1", args)
        await wait_until(lambda: any(e["event"] == "live" for e in first.events()), "live", first)
        assert copy_of(dest, source) == source.resources
        await source.publish({"/r1.txt": b"one, updated", "/new.txt": b"new"})
        await wait_until(lambda: copy_of(dest, source) == source.resources, "the live change", first)

        first.stop(signal.SIGKILL)
        await source.publish({f"/r{i}.txt": b"changed while down" for i in range(10, 20)})
        await source.publish({"/r30.txt": None, "/r31.txt": None, "/gone-soon.txt": b"brief"})
        await source.publish({"/gone-soon.txt": None, "/late.txt": b"late"})
        gets_before = source.resource_gets

        second = SyncProcess(tmp_path, "sync2", args)
        await wait_until(lambda: copy_of(dest, source) == source.resources, "equal after the restart", second)
        await wait_until(lambda: any(e["event"] == "live" for e in second.events()), "live again", second)
        events = second.events()
        assert any(e["event"] == "catchup.impossible" for e in events)
        [rebaseline] = [e for e in events if e["event"] == "baseline.done"]
        assert rebaseline["fetched"] == 11 and rebaseline["deleted"] == 2
        assert source.resource_gets - gets_before == 11   # hash skip: only what changed is fetched
        assert second.stop(signal.SIGTERM) == 0
    finally:
        await runner.cleanup()


async def test_source_with_a_channel_only_reports_the_gap(hub, tmp_path):
    source = SmallSource(hub.url, with_resource_list=False)
    runner = await serve(source)
    dest, port = tmp_path / "dest", free_port()
    args = ["--capability-list", source.url("/capabilitylist.xml"), "--dir", str(dest),
            "--listen", f"127.0.0.1:{port}"]
    try:
        once = await asyncio.to_thread(run, "sync", *args[:4], "--once")
        assert once.returncode == 1, once.stderr
        assert "unrecoverable" in once.stderr

        first = SyncProcess(tmp_path, "sync1", args)
        await wait_until(lambda: any(e["event"] == "live" for e in first.events()), "live", first)
        await source.publish({"/a.txt": b"alpha"})
        await wait_until(lambda: copy_of(dest, source) == {"/a.txt": b"alpha"}, "the first change", first)

        # the Source loses a notification (its interval is never published): nothing can fill it
        source.resources["/lost.txt"] = b"never announced"
        source.last_until += timedelta(minutes=5)
        await source.publish({"/b.txt": b"after the lost interval"})
        await wait_until(lambda: "/b.txt" in copy_of(dest, source), "the change after the gap", first)
        gaps = [e for e in first.events() if e["event"] == "gap"]
        assert any(g["kind"] == "unrecoverable" and g["until"] for g in gaps), first.events()
        assert any(e["event"] == "degraded" for e in first.events())
        assert "/lost.txt" not in copy_of(dest, source)   # lost at the Source's side: reported, not hidden
        status = await asyncio.to_thread(run, "sync", "status", "--dir", str(dest))
        assert "unrecoverable gap" in status.stdout, status.stdout

        # down while the hub keeps a notification: a restart cannot check any list, so it says so
        # until the hub's replay (rsnotify.replay_from) shows nothing was missed
        first.stop(signal.SIGKILL)
        await source.publish({"/c.txt": b"published while down"})
        second = SyncProcess(tmp_path, "sync2", args)
        await wait_until(lambda: any(e["event"] == "live" for e in second.events()), "live again", second)
        events = second.events()
        assert any(e["event"] == "gap" and e["kind"] == "unrecoverable" for e in events), events
        await source.publish({"/d.txt": b"after the restart"})
        await wait_until(lambda: "/d.txt" in copy_of(dest, source), "the change after the restart", second)
        if "/c.txt" in copy_of(dest, source):   # the hub replayed it: the gap is closed again
            await wait_until(lambda: any(e["event"] == "gap" and e["kind"] == "filled" for e in second.events()),
                             "the gap marked filled", second)
        else:   # a hub without replay: the gap stays reported
            status = await asyncio.to_thread(run, "sync", "status", "--dir", str(dest))
            assert "unrecoverable gap" in status.stdout, status.stdout
        assert second.stop(signal.SIGINT) == 0
    finally:
        await runner.cleanup()

"""`rsnotify subscribe --mirror DIR`, the alias of `rsnotify sync --dir DIR --json` (the mirror
of old is gone): the copy is the sync engine's, confined to DIR, fetched and checked, and kept
by the deliveries the hub sends to the subscription it makes."""
from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import timedelta

import pytest
from aiohttp import web

from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange
from rsnotify.subscriber.sync.sink import FolderSink
from rsnotify.xml import to_xml
from tests.support import cli
from tests.support.sources import NS

from .test_subscriber_cli import Process
from .test_sync_engine import T0, ListSource, source  # noqa: F401  (source: the Source fixture)


def test_urls_cannot_escape_the_mirror_folder(tmp_path):
    sink = FolderSink(tmp_path)
    for loc in ("http://h.example/../../etc/passwd", "http://h.example/%2e%2e/%2e%2e/x",
                "http://h.example/a/..%2f..%2fx", "http://../x"):
        try:
            path = sink.path_for(loc)
        except ValueError:
            continue
        assert path.resolve().is_relative_to(tmp_path.resolve()), loc
    with pytest.raises(ValueError, match="absolute http"):
        sink.path_for("file:///etc/passwd")


def test_mirror_needs_the_sources_lists_not_a_bare_topic(tmp_path):
    result = cli.invoke("subscribe", "--topic", "http://a.example/changes", "--mirror", str(tmp_path / "copy"),
                        "--state-file", str(tmp_path / "s.db"))
    assert result.exit_code == 2, result.output
    assert "--mirror needs --source or --capability-list" in result.output and "Traceback" not in result.output


async def test_subscribe_mirror_keeps_the_copy_with_the_sync_engine(fake_hub, source: ListSource, tmp_path):  # noqa: F811
    source.resources["/a.txt"] = b"alpha\n"
    caps = (f'<urlset {NS}><rs:ln rel="up" href="{source.url("/sd.xml")}"/><rs:md capability="capabilitylist"/>'
            f'<url><loc>{source.url("/resourcelist.xml")}</loc><rs:md capability="resourcelist"/></url>'
            f'<url><loc>{source.url("/changes")}</loc><rs:ln rel="hub" href="{fake_hub.url}"/>'
            '<rs:md capability="change-notification"/></url></urlset>')
    source.overrides["/caps.xml"] = web.Response(text=caps, content_type="application/xml")
    copy = tmp_path / "copy"
    process = Process(await cli.start_async(
        "subscribe", "--capability-list", source.url("/caps.xml"), "--no-secret", "--mirror", str(copy),
        "--listen", "127.0.0.1:0", "--verification-timeout", "10", cwd=tmp_path))
    try:
        await process.wait_for_status("subscribed to")
        await fake_hub.settle()
        [subscription] = fake_hub.subscriptions.values()
        assert subscription.topic == source.url("/changes") and subscription.secret is None
        folder = copy / source.base.split("//")[1].replace(":", "_")
        await process.wait_for_status("live (")                            # after the baseline
        assert (folder / "a.txt").read_bytes() == b"alpha\n"
        body = b"bravo bravo\n"
        source.resources["/b.txt"] = body
        created = ResourceChange(source.url("/b.txt"), ChangeType.CREATED, changed_at=T0 + timedelta(minutes=1),
                                 length=len(body), hashes=(("md5", hashlib.md5(body).hexdigest()),))
        deleted = ResourceChange(source.url("/a.txt"), ChangeType.DELETED, changed_at=T0 + timedelta(minutes=2))
        source.resources.pop("/a.txt")
        notification = to_xml(ChangeNotification(T0, T0 + timedelta(minutes=10), (created, deleted)))
        assert (await fake_hub.deliver(subscription.callback, notification, notification_id="n-1", sequence=1))[0] == 200
        await until(lambda: (folder / "b.txt").exists() and not (folder / "a.txt").exists(), process)
        assert (folder / "b.txt").read_bytes() == body and not (folder / "a.txt").exists()
        events = []
        while not any(e.get("event") == "notification.applied" for e in events):
            events.append(json.loads(await asyncio.wait_for(process.process.stdout.readline(), 10)))
        assert (copy / ".rsnotify" / "state.db").exists()
    finally:
        assert await process.interrupt() == 0, "".join(process.stderr)


async def until(condition, process: Process, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"timed out; stderr so far: {''.join(process.stderr)}"
        await asyncio.sleep(0.05)

"""Done-when, as a new user would try it: `rsnotify subscribe --source URL` subscribes through
a real `rsnotify hub` (with a worker), and ResourceSync submissions to the hub (raw POSTs and
`rsnotify publish`) appear on its output as JSON lines. Every part is a real process or server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from rsnotify.websub import build_link_header
from tests.support import cli
from tests.support.hubproc import HubProcess, start_hub

from .conftest import T0, make_notification

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"'


@pytest.fixture
async def rsnotify_hub(redis_url: str, tmp_path: Path) -> AsyncIterator[HubProcess]:
    """`rsnotify hub` with one worker on a shared test Redis, once /health says 200; its log at
    INFO shows when a subscription is activated."""
    hub = await asyncio.to_thread(start_hub, tmp_path, "--log-level", "info", data_dir=tmp_path / "hub-data",
                                  redis_url=redis_url, workers=1)
    yield hub
    await asyncio.to_thread(hub.stop)


@pytest.fixture
def hub(rsnotify_hub: HubProcess) -> str:
    return rsnotify_hub.url


@pytest.fixture
async def source(aiohttp_server, hub: str) -> str:
    """A Source: /.well-known/resourcesync -> Capability List -> channel served by `hub`; the
    topic URL answers 200 application/xml with Link rel=self and rel=hub (CN §4.1)."""
    app = web.Application()
    documents: dict[str, str] = {}

    async def serve(request: web.Request) -> web.Response:
        if request.path == "/changes":
            return web.Response(body=b"", content_type="application/xml", headers={
                "Link": build_link_header([(base + "/changes", "self"), (hub, "hub")])})
        if request.path not in documents:
            return web.Response(status=404)
        return web.Response(text=documents[request.path], content_type="application/xml")

    app.router.add_route("GET", "/{path:.*}", serve)
    server = await aiohttp_server(app)
    base = str(server.make_url("")).rstrip("/")
    documents["/.well-known/resourcesync"] = (
        f'<urlset {NS}><rs:md capability="description"/><url><loc>{base}/capabilitylist.xml</loc>'
        '<rs:md capability="capabilitylist"/></url></urlset>')
    documents["/capabilitylist.xml"] = (
        f'<urlset {NS}><rs:ln rel="up" href="{base}/.well-known/resourcesync"/><rs:md capability="capabilitylist"/>'
        f'<url><loc>{base}/changes</loc><rs:ln rel="hub" href="{hub}"/>'
        '<rs:md capability="change-notification"/></url></urlset>')
    return base


async def wait_hub_log(hub: HubProcess, text: str) -> None:
    while text not in hub.output():
        await asyncio.sleep(0.02)


async def next_line(subscriber: asyncio.subprocess.Process, status: list[str], hub: HubProcess) -> dict:
    try:
        return json.loads(await asyncio.wait_for(subscriber.stdout.readline(), 30))
    except TimeoutError:
        hub_log = "\n".join(hub.output().splitlines()[-80:])
        raise AssertionError("no notification within 30 s\nsubscriber:\n" + "".join(status)
                             + "\nhub:\n" + hub_log) from None


async def test_submission_reaches_rsnotify_subscribe_through_the_real_hub(rsnotify_hub: HubProcess, hub: str,
                                                                            source: str, tmp_path: Path):
    subscriber = await cli.start_async("subscribe", "--source", source + "/", "--listen", "127.0.0.1:0",
                                       "--state-file", str(tmp_path / "subscriber.json"), "--lease-seconds", "600",
                                       "--unsubscribe-on-exit",
                                       cwd=tmp_path)
    status: list[str] = []

    async def wait_status(text: str) -> None:
        while not any(text in line for line in status):
            line = (await subscriber.stderr.readline()).decode()
            assert line, f"subscriber ended before {text!r}:\n" + "".join(status)
            status.append(line)

    try:
        await asyncio.wait_for(wait_status("subscribed to"), 30)
        # The hub activates the subscription (and sets its cursor at the log's end) only after
        # it has read our echo, so a submission in between would be before the cursor.
        await asyncio.wait_for(wait_hub_log(rsnotify_hub, "activated"), 30)
        topic = source + "/changes"
        async with aiohttp.ClientSession() as session:
            for n in range(2):
                body = make_notification(T0.replace(minute=10 * n), 10, f"http://example.com/res{n}")
                async with session.post(hub, data=body, headers={
                        "Content-Type": "application/xml",
                        "Link": build_link_header([(topic, "self"), (hub, "hub")])}) as response:
                    assert response.status == 200, await response.text()
        lines = [await next_line(subscriber, status, rsnotify_hub) for _ in range(2)]
        assert [line["topic"] for line in lines] == [topic, topic]
        assert all(line["hub"] == hub for line in lines)
        assert [line["changes"][0]["loc"] for line in lines] == ["http://example.com/res0", "http://example.com/res1"]
        assert lines[0]["notification_id"] and lines[0]["notification_id"] != lines[1]["notification_id"]
        assert lines[1]["sequence"] == lines[0]["sequence"] + 1
        assert (lines[0]["from"], lines[1]["until"]) == ("2024-05-01T12:00:00Z", "2024-05-01T12:20:00Z")
        assert "gaps" not in lines[1]

        # ... and so does what `rsnotify publish` sends.
        publish = await cli.start_async("publish", "--hub", hub, "--topic", topic, "--updated", "http://example.com/res9",
                                        "--deleted", "http://example.com/res0", cwd=tmp_path,
                                        env={"RSNOTIFY_PUBLISH_STATE": str(tmp_path / "publisher-state")})
        out, err = await asyncio.wait_for(publish.communicate(), 30)
        assert publish.returncode == 0, (out + err).decode()
        line = await next_line(subscriber, status, rsnotify_hub)
        assert line["sequence"] == lines[1]["sequence"] + 1
        assert [(c["loc"], c["change"]) for c in line["changes"]] == [
            ("http://example.com/res9", "updated"), ("http://example.com/res0", "deleted")]
    finally:
        if subscriber.returncode is None:
            subscriber.send_signal(signal.SIGINT)
        rest = await asyncio.wait_for(subscriber.stderr.read(), 30)
        status.append(rest.decode())
        code = await asyncio.wait_for(subscriber.wait(), 30)
    assert code == 0, "".join(status)
    assert "unsubscribed from" in "".join(status)

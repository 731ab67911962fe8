"""`rsnotify subscribe` as a user meets it: stdout closed by `| head -1`, a hub that grants an
absurd lease, a lease shorter than the renewal loop's pause, a Source Description Index."""
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from aiohttp import web

from rsnotify.notification import CapabilityEntry, CapabilityList, Link
from rsnotify.subscriber.discovery import discover_source
from rsnotify.subscriber.settings import SubscriberSettings
from rsnotify.subscriber.store import SqliteStore
from rsnotify.xml import capability_list_to_xml

from .conftest import T0, make_notification

RSNOTIFY = str(Path(sys.executable).parent / "rsnotify")
TOPIC = "http://example.com/dataset1/change/"


async def read_status(stream: asyncio.StreamReader, text: str, seen: list[str], timeout: float = 30.0) -> None:
    async def read() -> None:
        while True:
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError(f"stderr ended before {text!r}: {''.join(seen)}")
            seen.append(line)
            if text in line:
                return

    await asyncio.wait_for(read(), timeout)


async def test_closed_stdout_gets_503_and_a_nonzero_exit(fake_hub, tmp_path):
    read_end, write_end = os.pipe()
    process = await asyncio.create_subprocess_exec(
        RSNOTIFY, "subscribe", "--hub", fake_hub.url, "--topic", TOPIC, "--listen", "127.0.0.1:0",
        "--state-file", str(tmp_path / "state.db"), stdout=write_end, stderr=asyncio.subprocess.PIPE)
    os.close(write_end)
    stderr: list[str] = []
    try:
        await read_status(process.stderr, "subscribed to", stderr)
        await fake_hub.settle()
        [subscription] = fake_hub.subscriptions.values()
        body = make_notification(T0, 10, "http://example.com/res1")
        status, _ = await fake_hub.deliver(subscription.callback, body, secret=subscription.secret,
                                           notification_id="n-1", sequence=1)
        assert status == 200
        assert b'"notification_id": "n-1"' in os.read(read_end, 65536)
        os.close(read_end)   # the reader is gone, as after `| head -1`
        status, reply = await fake_hub.deliver(subscription.callback, body, secret=subscription.secret,
                                               notification_id="n-2", sequence=2)
        assert status == 503, reply
        code = await asyncio.wait_for(process.wait(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    rest = (await process.stderr.read()).decode()
    assert code == 1, "".join(stderr) + rest
    assert "stdout is gone" in "".join(stderr) + rest and "Traceback" not in rest
    # the subscription stays for the next start
    assert fake_hub.requests[-1]["hub.mode"] == "subscribe"


async def test_an_absurd_granted_lease_is_accepted(fake_hub, make_subscriber):
    fake_hub.lease_seconds = 999_999_999_999
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    assert fake_hub.verifications[-1].status == 200
    assert subscription.status == "active" and subscription.expires_at is not None


async def test_a_short_lease_is_renewed_before_it_lapses(fake_hub, make_subscriber, tmp_path):
    fake_hub.lease_seconds = 3
    subscriber = await make_subscriber(SqliteStore(tmp_path / "state.db"),
                                       settings=SubscriberSettings(verification_timeout=5.0))
    await subscriber.start()     # the renewal loop, which pauses up to 30 s between checks
    await subscriber.subscribe(TOPIC, fake_hub.url)
    await asyncio.sleep(0.1)
    verified_before = len(fake_hub.verifications)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while len(fake_hub.verifications) == verified_before:
        assert loop.time() < deadline, "no renewal within 10 s of a 3 s lease"
        await asyncio.sleep(0.05)
    [current] = await subscriber.subscriptions()
    assert current.status == "active"


async def test_a_source_description_index_is_followed(aiohttp_server):
    async def handle(request: web.Request) -> web.Response:
        base = f"http://{request.host}"
        if request.path == "/.well-known/resourcesync":
            body = (f'<?xml version="1.0" encoding="UTF-8"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/'
                    f'sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="description"/>'
                    f'<sitemap><loc>{base}/sd1.xml</loc></sitemap></sitemapindex>')
            return web.Response(text=body, content_type="application/xml")
        if request.path == "/sd1.xml":
            body = (f'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/'
                    f'0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"><rs:md capability="description"/>'
                    f'<url><loc>{base}/caps.xml</loc><rs:md capability="capabilitylist"/></url></urlset>')
            return web.Response(text=body, content_type="application/xml")
        if request.path == "/caps.xml":
            caps = CapabilityList((CapabilityEntry(f"{base}/changes", "change-notification",
                                                   links=(Link("hub", "http://hub.example/"),)),),
                                  up=f"{base}/.well-known/resourcesync")
            return web.Response(body=capability_list_to_xml(caps), content_type="application/xml")
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    server = await aiohttp_server(app)
    base = str(server.make_url("")).rstrip("/")
    [channel] = await discover_source(base + "/")
    assert channel.topic == base + "/changes" and channel.hubs == ("http://hub.example/",)

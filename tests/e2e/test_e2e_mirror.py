"""The whole product from the outside: a Source advertises its channel and publishes with the
publisher library, `rsnotify hub` (embedded Redis, its own workers) relays, and a Destination
that discovered the channel gets every notification, in order, with no gap. (Files on disk
through the real hub: tests/e2e/test_e2e_sync.py, where `rsnotify sync` keeps the copy.)"""
from __future__ import annotations

import hashlib

from aiohttp import web

from rsnotify.notification import CapabilityEntry, SourceDescription
from rsnotify.publisher import Publisher
from rsnotify.publisher.advertise import new_capability_list
from rsnotify.subscriber import MemoryStore, Subscriber, discover_source
from rsnotify.subscriber.callback.aiohttp_adapter import add_callback_routes
from rsnotify.xml import capability_list_to_xml, source_description_to_xml
from tests.support.waiting import eventually


class Source:
    """A Source's web site: resources, /.well-known/resourcesync, a Capability List, a topic."""

    def __init__(self) -> None:
        self.resources: dict[str, bytes] = {}
        self.base = ""
        self.hub = ""

    def url(self, path: str) -> str:
        return self.base + path

    async def handle(self, request: web.Request) -> web.Response:
        path = request.path
        if path == "/.well-known/resourcesync":
            entry = CapabilityEntry(self.url("/dataset1/capabilitylist.xml"), "capabilitylist")
            return web.Response(body=source_description_to_xml(SourceDescription((entry,))),
                                content_type="application/xml")
        if path == "/dataset1/capabilitylist.xml":
            caplist = new_capability_list(self.url("/.well-known/resourcesync"), self.url("/dataset1/change/"), self.hub)
            return web.Response(body=capability_list_to_xml(caplist), content_type="application/xml")
        if path in self.resources:
            return web.Response(body=self.resources[path], content_type="text/plain")
        raise web.HTTPNotFound()

    def change(self, path: str, kind: str, body: bytes | None = None) -> dict:
        if body is None:
            self.resources.pop(path, None)
            return {"loc": self.url(path), "change": kind}
        self.resources[path] = body
        return {"loc": self.url(path), "change": kind, "length": len(body),
                "hash": "md5:" + hashlib.md5(body).hexdigest(), "type": "text/plain"}


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def test_destination_follows_the_source_through_the_embedded_hub(hub_process, tmp_path):
    hub = hub_process(data_dir=tmp_path / "hub", workers=1)
    source = Source()
    source_app = web.Application()
    source_app.router.add_route("GET", "/{tail:.*}", source.handle)
    source_runner, source.base = await serve(source_app)
    source.hub = hub.url

    received = []

    async def on_notification(notification):
        received.append(notification)

    destination_app = web.Application()
    subscriber = Subscriber(None, MemoryStore(), on_notification=on_notification)
    add_callback_routes(destination_app, subscriber.core, "/websub")
    destination_runner, destination = await serve(destination_app)
    subscriber.callback_base_url = destination + "/websub"
    try:
        async with subscriber:
            [channel] = await discover_source(subscriber.session, source.base + "/")
            assert channel.topic == source.url("/dataset1/change/") and channel.hubs == (hub.url,)
            await subscriber.subscribe(channel.topic, channel.hubs[0])  # waits for the verification

            async with Publisher(hub.url, channel.topic, capability_list_url=source.url("/dataset1/capabilitylist.xml")) as publisher:
                await publisher.publish([source.change("/a.txt", "created", b"alpha v1"),
                                         source.change("/b.txt", "created", b"beta")])
                await publisher.publish([source.change("/a.txt", "updated", b"alpha v2")])
                await publisher.publish([source.change("/b.txt", "deleted")])

            await eventually(lambda: len(received) == 3, what="three notifications")
            assert [r.sequence for r in received] == [1, 2, 3]
            assert all(not r.gaps for r in received)
            # consecutive notifications cover consecutive intervals
            notes = [r.notification for r in received]
            assert notes[0].until_time == notes[1].from_time and notes[1].until_time == notes[2].from_time
    finally:
        await destination_runner.cleanup()
        await source_runner.cleanup()
    assert hub.stop() == 0

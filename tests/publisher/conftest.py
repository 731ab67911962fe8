"""Loopback fake hubs for the publisher tests: real aiohttp servers on 127.0.0.1 that record
what they got and answer as told (200 with an id, 4xx, 5xx, or not listening at all)."""
from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from rsnotify.websub import NOTIFICATION_ID_HEADER, parse_link_header
from tests.support.ports import free_port
from tests.support.servers import ThreadedServer


@dataclass
class Submission:
    """One request the fake hub received."""

    method: str
    headers: dict[str, str]
    body: bytes

    def links(self, rel: str) -> list[str]:
        return [link.href for link in parse_link_header(self.headers.get("Link", "")) if rel in link.rels]


@dataclass
class FakeHub:
    """What the fake hub got, and how it answers.

    `answers`: statuses to give, in order, one per request (then 200s). `id_style`: "json"
    (the rsnotify hub's answer), "header" (only the X-RSNotify-Id header), "text" (the id as a
    text/plain body) or "none".
    """

    answers: list[int] = field(default_factory=list)
    id_style: str = "json"
    reason: str = "publisher token not allowed for this topic"
    delay: float = 0.0  # seconds each answer takes: a slow hub
    received: list[Submission] = field(default_factory=list)
    url: str = ""
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def accepted(self) -> list[Submission]:
        return [s for s, status in zip(self.received, self._statuses) if status == 200]

    def __post_init__(self) -> None:
        self._statuses: list[int] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received.append(Submission(request.method, dict(request.headers), body))
        if self.delay:
            await asyncio.sleep(self.delay)
        status = self.answers.pop(0) if self.answers else 200
        self._statuses.append(status)
        if status in (301, 302, 307, 308):
            return web.Response(status=status, headers={"Location": "http://127.0.0.1:9/elsewhere/"})
        if status >= 300:
            return web.Response(status=status, text=self.reason if status < 500 else "storage is busy")
        number = next(self._ids)
        notification_id = f"0000{number}-0"
        topic = (parse_link_header(request.headers.get("Link", "")) or [None])[0]
        if self.id_style == "json":
            payload = {"notification_id": notification_id, "topic": getattr(topic, "href", ""), "sequence": number}
            return web.Response(text=json.dumps(payload), content_type="application/json",
                                headers={NOTIFICATION_ID_HEADER: notification_id})
        if self.id_style == "header":
            return web.Response(text="", headers={NOTIFICATION_ID_HEADER: notification_id})
        if self.id_style == "text":
            return web.Response(text=notification_id + "\n")
        return web.Response(text="")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


@pytest.fixture
def fake_hub() -> FakeHub:
    return FakeHub()


@pytest.fixture
async def hub_server(aiohttp_server, fake_hub: FakeHub):  # type: ignore[no-untyped-def]
    """The fake hub served in the test's own loop (for async tests)."""
    server = await aiohttp_server(fake_hub.app(), host="127.0.0.1")
    fake_hub.url = f"http://127.0.0.1:{server.port}/hub"
    return fake_hub


@pytest.fixture
def threaded_hub(fake_hub: FakeHub) -> Iterator[FakeHub]:
    """The fake hub served from a background thread (for sync tests)."""
    server = ThreadedServer(fake_hub.app()).start()
    fake_hub.url = server.base + "/hub"
    yield fake_hub
    server.stop()


@pytest.fixture
def make_hub() -> type[FakeHub]:
    return FakeHub


@pytest.fixture
def serve_in_thread() -> Iterator[type[ThreadedServer]]:
    """ThreadedServer(app, port=0).start() (tests/support/servers.py); every server started is
    stopped after the test."""
    started: list[ThreadedServer] = []

    class Tracked(ThreadedServer):
        def start(self) -> ThreadedServer:
            started.append(self)
            return super().start()

        def stop(self) -> None:
            if self in started:
                started.remove(self)
                super().stop()

    yield Tracked
    while started:
        started[-1].stop()     # stop() takes it off the list


@pytest.fixture
def unused_port() -> int:
    return free_port()

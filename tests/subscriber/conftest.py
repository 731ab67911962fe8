"""Loopback fakes for the subscriber tests: a WebSub hub that plays edge cases, and helpers.

The fake hub is a real aiohttp server on 127.0.0.1 port 0. It records every request,
verifies intents by GETting the callback (after or before it answers, as configured), and
delivers notifications signed with the subscription's secret.
"""
from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange
from rsnotify.websub import (
    NOTIFICATION_ID_HEADER,
    SEQUENCE_HEADER,
    SIGNATURE_HEADER,
    build_link_header,
    sign,
)
from rsnotify.xml import to_xml

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def make_notification(start: datetime = T0, minutes: int = 10, *locs: str) -> bytes:
    """A valid change notification for [start, start + minutes] with one update per loc."""
    until = start + timedelta(minutes=minutes)
    changes = tuple(
        ResourceChange(loc, ChangeType.UPDATED, changed_at=start + timedelta(seconds=i + 1),
                       hashes=(("md5", "1584abdf8ebdc9802ac0c6a7402c03b6"),), length=8876,
                       media_type="application/pdf")
        for i, loc in enumerate(locs or ("http://example.com/res1",))
    )
    return to_xml(ChangeNotification(start, until, changes))


@dataclass
class Verification:
    query: dict[str, str]
    status: int
    body: str
    content_type: str


@dataclass
class HubSubscription:
    topic: str
    callback: str
    secret: str | None
    lease_seconds: int | None


@dataclass
class FakeHub:
    """A WebSub hub to play edge cases against. `url` is set once the server runs."""

    url: str = ""
    mode: str = "verify-after"      # verify-after | verify-before | no-verify | deny | refuse
    redirect: int | None = None     # 307 or 308: answer the first POST with a redirect to /hub2
    lease_seconds: int = 600
    requests: list[dict[str, str]] = field(default_factory=list)
    request_paths: list[str] = field(default_factory=list)
    verifications: list[Verification] = field(default_factory=list)
    subscriptions: dict[str, HubSubscription] = field(default_factory=dict)
    session: aiohttp.ClientSession | None = None
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    verified: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/hub", self._handle)
        app.router.add_post("/hub2", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        form = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
        self.requests.append(form)
        self.request_paths.append(request.path)
        if self.redirect and request.path == "/hub":
            return web.Response(status=self.redirect, headers={"Location": "/hub2"})
        if self.mode == "refuse":
            return web.Response(status=400, text="hub.topic is not served by this hub")
        if self.mode == "verify-before":
            await self._verify(form)
        elif self.mode in ("verify-after", "deny"):
            task = asyncio.create_task(self._verify(form) if self.mode == "verify-after" else self._deny(form))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return web.Response(status=202, text="accepted")

    async def _verify(self, form: dict[str, str]) -> None:
        challenge = secrets.token_urlsafe(16)
        query = {"hub.mode": form["hub.mode"], "hub.topic": form["hub.topic"], "hub.challenge": challenge}
        if form["hub.mode"] == "subscribe":
            query["hub.lease_seconds"] = str(self.lease_seconds)
        verification = await self.verify(form["hub.callback"], query)
        if verification.status == 200 and verification.body == challenge:
            if form["hub.mode"] == "subscribe":
                self.subscriptions[form["hub.callback"]] = HubSubscription(
                    form["hub.topic"], form["hub.callback"], form.get("hub.secret"), self.lease_seconds)
            else:
                self.subscriptions.pop(form["hub.callback"], None)
        self.verified.set()

    async def _deny(self, form: dict[str, str]) -> None:
        await self.verify(form["hub.callback"], {"hub.mode": "denied", "hub.topic": form["hub.topic"],
                                                 "hub.reason": "topic not allowed"})
        self.verified.set()

    async def verify(self, callback: str, query: dict[str, str]) -> Verification:
        assert self.session is not None
        async with self.session.get(callback, params=query) as response:
            verification = Verification(query, response.status, await response.text(),
                                        response.headers.get("Content-Type", ""))
        self.verifications.append(verification)
        return verification

    async def deliver(self, callback: str, body: bytes, *, secret: str | None = None, algorithm: str = "sha256",
                      signature: str | None = None, notification_id: str | None = None,
                      sequence: int | None = None, content_type: str = "application/xml",
                      topic: str = "http://example.com/dataset1/change/") -> tuple[int, str]:
        """POST a notification to `callback` as a hub does; (status, reply text)."""
        assert self.session is not None
        headers = {"Content-Type": content_type,
                   "Link": build_link_header([(topic, "self"), (self.url, "hub")])}
        if signature is not None:
            headers[SIGNATURE_HEADER] = signature
        elif secret is not None:
            headers[SIGNATURE_HEADER] = sign(body, secret, algorithm)
        if notification_id is not None:
            headers[NOTIFICATION_ID_HEADER] = notification_id
        if sequence is not None:
            headers[SEQUENCE_HEADER] = str(sequence)
        async with self.session.post(callback, data=body, headers=headers) as response:
            return response.status, await response.text()

    async def settle(self) -> None:
        """Wait for verifications still running in the background."""
        if self.tasks:
            await asyncio.gather(*list(self.tasks))


@pytest.fixture
async def fake_hub(aiohttp_server: Callable[..., Any]) -> AsyncIterator[FakeHub]:
    hub = FakeHub()
    server = await aiohttp_server(hub.app())
    hub.url = str(server.make_url("/hub"))
    hub.session = aiohttp.ClientSession()
    yield hub
    await hub.settle()
    await hub.session.close()


class Recorder:
    """An application handler that keeps what it is given (safe to call from any thread)."""

    def __init__(self) -> None:
        self.received: list[Any] = []
        self.denials: list[Any] = []

    async def __call__(self, received: Any) -> None:
        self.received.append(received)

    async def denied(self, subscription: Any) -> None:
        self.denials.append(subscription)

    async def wait(self, count: int = 1, timeout: float = 5.0) -> None:
        """Until `count` things arrived; polls, because handlers may run on another loop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.received) + len(self.denials) < count:
            assert loop.time() < deadline, f"expected {count} calls, got {self.received + self.denials}"
            await asyncio.sleep(0.01)


@pytest.fixture
async def make_subscriber(aiohttp_server: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """A factory of started Subscribers, each served by its own loopback aiohttp server."""
    from rsnotify.subscriber.callback.aiohttp_adapter import add_callback_routes
    from rsnotify.subscriber.client import Subscriber
    from rsnotify.subscriber.settings import SubscriberSettings
    from rsnotify.subscriber.store import MemoryStore

    made: list[Subscriber] = []

    async def make(store: Any = None, *, settings: SubscriberSettings | None = None, port: int | None = None,
                   **options: Any) -> Subscriber:
        subscriber = Subscriber(store=store if store is not None else MemoryStore(),
                                settings=settings or SubscriberSettings(verification_timeout=5.0), **options)
        app = web.Application()
        add_callback_routes(app, subscriber.core, "/websub")
        server = await aiohttp_server(app, port=port)
        subscriber.callback_base_url = str(server.make_url("/websub"))
        subscriber.test_server = server  # type: ignore[attr-defined]
        await subscriber.start(renew=False)
        made.append(subscriber)
        return subscriber

    yield make
    for subscriber in made:
        await subscriber.close()

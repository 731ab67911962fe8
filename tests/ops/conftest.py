"""Ops fixtures: a real hub app on loopback, a real worker context on the test's loop that runs
the queued jobs through the same cores the RQ jobs call, and a recording loopback subscriber."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import redis as redis_lib
from cryptography.fernet import Fernet
from rq import Queue

from rsnotify.hub import keys, store
from rsnotify.hub.settings import HubSettings
from rsnotify.hub.web.app import build_app
from rsnotify.hub.worker.context import close_context, open_context
from rsnotify.hub.enqueue import make_queue
from tests.support.clock import Clock
from tests.support.jobs import JobRunner, deliver_subscription
from tests.support.ports import free_port
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import eventually

TOPIC = "http://source.example.org/changes/rs"
BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
        b' xmlns:rs="http://www.openarchives.org/rs/terms/">\n  <rs:md capability="change-notification" from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>\n'
        b'  <url><loc>http://example.com/res1</loc><rs:md change="updated" datetime="2013-01-03T00:08:52Z"/></url>\n</urlset>\n')


def body(n: int) -> bytes:
    return BODY.replace(b"res1", b"res%d" % n)


@dataclass
class OpsHub:
    """The hub app served on loopback plus a worker context; `drain()` runs what is queued."""

    url: str
    settings: HubSettings
    ctx: Any
    queue: Queue
    http: aiohttp.ClientSession
    clock: Clock
    jobs: JobRunner

    @property
    def redis(self) -> Any:
        return self.ctx.redis

    async def subscribe(self, callback: str, topic: str = TOPIC, **extra: str) -> str:
        form = {"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": callback, **extra}
        async with self.http.post(self.url, data=form) as response:
            assert response.status == 202, await response.text()
        await self.drain()
        return keys.subscription_id(topic, callback)

    async def publish(self, data: bytes = BODY, topic: str = TOPIC) -> dict[str, Any]:
        headers = {"Content-Type": "application/xml",
                   "Link": f'<{topic}>; rel="self", <{self.settings.hub_url}>; rel="hub"'}
        async with self.http.post(self.url, data=data, headers=headers) as response:
            assert response.status == 200, await response.text()
            return await response.json()

    async def admin(self, method: str, path: str, *, token: str | None = None, expect: int = 200) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.http.request(method, self.url.rstrip("/") + path, headers=headers) as response:
            text = await response.text()
            assert response.status == expect, f"{method} {path}: {response.status} {text}"
            return await response.json() if response.content_type == "application/json" else text

    async def drain(self, rounds: int = 50) -> None:
        """Run the queued jobs (as the RQ job functions would) and the due retries, until none is left."""
        for _ in range(rounds):
            jobs = self.queue.get_jobs()
            first = await self.redis.zrange(keys.due_key(), 0, 0, withscores=True)
            if first and not jobs and first[0][1] > self.clock():
                self.clock.set(first[0][1])     # retries are due: move time on
            due = await store.pop_due(self.redis, self.clock())
            if not jobs and not due:
                return
            for job in jobs:
                await self.jobs.run(job)
            for sid in due:
                await deliver_subscription(self.ctx, sid)
        raise AssertionError(f"jobs still queued after {rounds} rounds")

    async def eventually(self, check: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until `check()` holds (work the web process does in the background)."""
        await eventually(check, timeout, "the web process's background work")

    async def counted(self, field_name: str, expected: float, timeout: float = 5.0) -> None:
        """Wait until the workers' batched counters show `expected` (they flush every 0.2 s)."""
        deadline = time.monotonic() + timeout
        while True:
            value = float(await self.redis.hget(keys.stats_key(), field_name) or 0)
            if value >= expected or time.monotonic() > deadline:
                assert value == expected, f"{field_name}: {value}, expected {expected}"
                return
            await asyncio.sleep(0.05)


@pytest.fixture
def ops_clock() -> Clock:
    """Real time until a test moves it on (leases ending soon, signature windows)."""
    return Clock.real()


@pytest.fixture
def ops_settings(redis_url: str, tmp_path) -> HubSettings:
    # Retries 1-2 s out, never waited for: drain() moves the clock to them. (A retry due by the time
    # its run lets go of the subscription, as 10 ms could be on a loaded machine, is left to the
    # reconciler, which this hub does not run: drain() would end before it.)
    return HubSettings(redis_url=redis_url, data_dir=str(tmp_path / "data"), workers=0,
                       secret_key=Fernet.generate_key().decode(), retry_base=1.0, retry_cap=2.0,
                       max_attempts=3, delivery_timeout=2.0, connect_timeout=1.0, fetch_timeout=2.0,
                       lease_min=60)


async def start_hub(aiohttp_server: Callable[..., Any], settings: HubSettings, clock: Clock,
                    ) -> AsyncIterator[OpsHub]:
    """The hub app served on a free loopback port (set in its settings, so hub_url is the served
    URL; never the settings' default 8080, where a developer's hub may run)."""
    settings = settings.with_values(port=free_port())
    server = await aiohttp_server(build_app(settings, now=clock), host="127.0.0.1", port=settings.port)
    connection = redis_lib.Redis.from_url(settings.redis_url)
    queue = make_queue(settings.queue_name, connection)
    ctx = await open_context(settings, queue=queue, clock=clock)
    http = aiohttp.ClientSession()
    try:
        yield OpsHub(str(server.make_url("/")), settings, ctx, queue, http, clock, JobRunner(queue, ctx))
    finally:
        await http.close()
        await close_context(ctx)
        connection.close()


@pytest.fixture
async def ops_hub(aiohttp_server, ops_settings: HubSettings, ops_clock: Clock) -> AsyncIterator[OpsHub]:
    """A hub without an admin token (loopback may use /admin/)."""
    async for hub in start_hub(aiohttp_server, ops_settings, ops_clock):
        yield hub


@pytest.fixture
async def subscriber(aiohttp_server) -> RecordingSubscriber:
    """A recording subscriber served in the test's loop (tests/support/subscribers.py)."""
    recorder = RecordingSubscriber()
    server = await aiohttp_server(recorder.app(), host="127.0.0.1")
    recorder.base = str(server.make_url("")).rstrip("/")
    return recorder

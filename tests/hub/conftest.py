"""Shared hub fixtures: a clock, settings, the app under a test client, an intake context and a
worker context on the test's loop, and recording subscribers (in the loop, or in a thread for
sync tests that run a burst worker in the main thread)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis as redis_lib
import redis.asyncio as redis_async
from cryptography.fernet import Fernet
from rq import Queue

from rsnotify.hub import enqueue, keys, netguard, records, store
from rsnotify.hub.crypto import encrypt_secret, load_fernet
from rsnotify.hub.enqueue import make_queue
from rsnotify.hub.settings import HubSettings
from rsnotify.hub.web.app import build_app
from rsnotify.hub.worker import fanout, runs
from rsnotify.hub.worker.context import close_context, open_context
from rsnotify.outbound import OutboundClient
from tests.support.clock import Clock
from tests.support.jobs import JobRunner, deliver_subscription
from tests.support.subscribers import RecordingSubscriber


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def hub_settings(redis_url: str, tmp_path) -> HubSettings:
    """A hub on loopback (so loopback callbacks are allowed), shared Redis, no workers, no tokens."""
    return HubSettings(redis_url=redis_url, data_dir=str(tmp_path / "data"), workers=0,
                       fetch_timeout=2.0, connect_timeout=1.0)


@pytest.fixture
async def hub_client(aiohttp_client, hub_settings: HubSettings, clock: Clock):
    """An aiohttp test client on build_app(hub_settings) with the injected clock."""
    return await aiohttp_client(build_app(hub_settings, now=clock))


@dataclass
class IntakeContext:
    """What a worker gives the async cores (settings, redis, outbound clients, fernet, queue,
    now), each client guarded as the worker's are for `settings`."""

    settings: HubSettings
    redis: redis_async.Redis
    outbound: OutboundClient      # verifications and denials
    fetcher: OutboundClient       # thin-ping fetches
    fernet: Any
    queue: Queue
    clock: Clock

    def now(self) -> float:
        return self.clock()

    async def use_settings(self, settings: HubSettings) -> None:
        """Take `settings`, with new clients guarded by its allowed networks."""
        await self.close_clients()
        self.settings = settings
        self.outbound, self.fetcher = outbound_client(settings), outbound_client(settings, keep_headers=True)

    async def close_clients(self) -> None:
        await self.outbound.close()
        await self.fetcher.close()


def outbound_client(settings: HubSettings, *, keep_headers: bool = False) -> OutboundClient:
    """An outbound client as a worker with `settings` has (hub/worker/context.py): the
    deliveries' one, or with `keep_headers` the thin-ping fetcher."""
    return netguard.outbound_client(settings, limit=100, max_idle=100, keep_headers=keep_headers)


@pytest.fixture
async def intake_ctx(hub_settings: HubSettings, clock: Clock) -> AsyncIterator[IntakeContext]:
    client = redis_async.Redis.from_url(hub_settings.redis_url)
    connection = redis_lib.Redis.from_url(hub_settings.redis_url)
    ctx = IntakeContext(hub_settings, client, outbound_client(hub_settings),
                        outbound_client(hub_settings, keep_headers=True),
                        load_fernet(hub_settings), make_queue(hub_settings.queue_name, connection), clock)
    yield ctx
    await ctx.close_clients()
    await client.aclose()
    connection.close()


async def run_intake_jobs(ctx: IntakeContext) -> list[Any]:
    """Run the queued verification and fetch jobs through their async cores (fan-out jobs are
    left queued); returns their outcomes in queue order."""
    return await JobRunner(ctx.queue, ctx, leave=[enqueue.FAN_OUT]).run_queued()


@pytest.fixture
def run_jobs() -> Callable[[IntakeContext], Any]:
    return run_intake_jobs


@pytest.fixture
async def callback_server(aiohttp_server) -> RecordingSubscriber:
    """A recording subscriber served in the test's loop (tests/support/subscribers.py)."""
    recorder = RecordingSubscriber()
    server = await aiohttp_server(recorder.app(), host="127.0.0.1")
    recorder.base = str(server.make_url("")).rstrip("/")
    return recorder


# --- a worker's context -------------------------------------------------------------------


@pytest.fixture
def fanout_settings(redis_url: str, tmp_path) -> HubSettings:
    """Loopback hub settings with quick retries, a short claim TTL and a fresh Fernet key."""
    return HubSettings(redis_url=redis_url, data_dir=str(tmp_path / "data"), workers=0,
                       secret_key=Fernet.generate_key().decode(), retry_base=0.01, retry_cap=0.04,
                       max_attempts=5, delivery_timeout=2.0, connect_timeout=1.0, lock_ttl=5,
                       reconcile_interval=0.5)


@dataclass
class FanoutHub:
    """The async core of a worker (a real context on the test's loop) plus subscribe/publish."""

    ctx: Any
    clock: Clock

    @property
    def redis(self) -> redis_async.Redis:
        return self.ctx.redis

    async def subscribe(self, topic: str, callback: str, *, secret: str | None = None,
                        lease_seconds: int = 86400) -> str:
        token = encrypt_secret(self.ctx.fernet, secret)
        sid, _ = await store.activate_subscription(self.redis, topic, callback, secret=token,
                                                    lease_seconds=lease_seconds, now=self.clock())
        return sid

    async def publish(self, topic: str, body: bytes, *, content_type: str = "application/xml",
                      resourcesync: str = "") -> records.AppendedNotification:
        return await store.append_notification(self.redis, topic, body, content_type=content_type,
                                                resourcesync=resourcesync, now=time.time(),
                                                max_len=self.ctx.settings.log_max_len)

    async def fan_out(self, topic: str) -> runs.FanOutReport:
        return await fanout.fan_out(self.ctx, keys.topic_id(topic))

    async def settle(self, rounds: int = 200) -> int:
        """Move the clock to each due retry and serve it, until none is left; returns rounds run."""
        for done in range(rounds):
            due = await self.redis.zrange(keys.due_key(), 0, 0, withscores=True)
            if not due:
                return done
            if due[0][1] > self.clock.peek():
                self.clock.set(due[0][1])
            sids = await store.pop_due(self.redis, self.clock())
            await asyncio.gather(*(deliver_subscription(self.ctx, sid) for sid in sids))
        raise AssertionError(f"retries still due after {rounds} rounds")


@pytest.fixture
async def fanout_hub(fanout_settings: HubSettings, clock: Clock) -> AsyncIterator[FanoutHub]:
    ctx = await open_context(fanout_settings, clock=clock)
    yield FanoutHub(ctx, clock)
    await close_context(ctx)


@pytest.fixture
def sink() -> Iterator[RecordingSubscriber]:
    """A recording subscriber served from a background thread, for sync tests that run HubWorker
    (or wait on a hub process) in the main thread."""
    recorder = RecordingSubscriber()
    server = recorder.serve_in_thread()
    yield recorder
    server.stop()

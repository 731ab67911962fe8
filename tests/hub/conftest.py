"""Shared hub fixtures. Intake's first (clock, settings, app client, outbound context, callback
server); fan-out adds its own below with small str_replace edits."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis as redis_lib
import redis.asyncio as redis_async
from aiohttp import web
from rq import Queue

from hub import fetch, verification
from hub.app import build_app
from hub.netguard import make_session
from hub.secrets import load_fernet
from hub.settings import HubSettings


@dataclass
class Clock:
    """An injected clock (epoch seconds) that only moves when a test says so."""

    t: float = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


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
    """What a worker gives the async cores (settings, redis, session, fernet, queue, now)."""

    settings: HubSettings
    redis: redis_async.Redis
    session: Any
    fernet: Any
    queue: Queue
    clock: Clock

    def now(self) -> float:
        return self.clock()


@pytest.fixture
async def intake_ctx(hub_settings: HubSettings, clock: Clock) -> AsyncIterator[IntakeContext]:
    client = redis_async.Redis.from_url(hub_settings.redis_url)
    connection = redis_lib.Redis.from_url(hub_settings.redis_url)
    session = make_session(hub_settings)
    ctx = IntakeContext(hub_settings, client, session, load_fernet(hub_settings),
                        Queue(hub_settings.queue_name, connection=connection), clock)
    yield ctx
    await session.close()
    await client.aclose()
    connection.close()


async def run_intake_jobs(ctx: IntakeContext) -> list[Any]:
    """Run the queued verification and fetch jobs through intake's async cores (fan-out jobs are
    left queued); returns their outcomes in queue order."""
    outcomes = []
    for job in ctx.queue.get_jobs():
        name = job.func_name.rsplit(".", 1)[-1]
        if name == "verify_intent":
            outcomes.append(await verification.verify_intent(ctx, *job.args))
        elif name == "fetch_topic":
            outcomes.append(await fetch.fetch_topic(ctx, *job.args))
        else:
            continue
        ctx.queue.remove(job)
    return outcomes


@pytest.fixture
def run_jobs() -> Callable[[IntakeContext], Any]:
    return run_intake_jobs


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    raw_query: str
    body: bytes
    headers: dict[str, str]


@dataclass
class CallbackServer:
    """A loopback subscriber/topic server: records every request; `answers[path]` decides the reply
    (default for GET: echo hub.challenge with 200)."""

    base: str = ""
    requests: list[Recorded] = field(default_factory=list)
    answers: dict[str, Callable[[web.Request], Any]] = field(default_factory=dict)

    def url(self, path: str = "/callback") -> str:
        return self.base + path

    def on(self, path: str, answer: Callable[[web.Request], Any]) -> None:
        self.answers[path] = answer

    def seen(self, path: str | None = None) -> list[Recorded]:
        return [r for r in self.requests if path is None or r.path == path]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Recorded(request.method, request.path, dict(request.query), request.rel_url.raw_query_string,
                                      body, dict(request.headers)))
        answer = self.answers.get(request.path)
        if answer is not None:
            result = answer(request)
            return await result if hasattr(result, "__await__") else result
        return web.Response(text=request.query.get("hub.challenge", ""))


@pytest.fixture
async def callback_server(aiohttp_server) -> CallbackServer:
    recorder = CallbackServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    server = await aiohttp_server(app, host="127.0.0.1")
    recorder.base = str(server.make_url("")).rstrip("/")
    return recorder

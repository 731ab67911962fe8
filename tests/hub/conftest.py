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

from rsnotify.hub.crypto import load_fernet
from rsnotify.hub.netguard import make_session
from rsnotify.hub.settings import HubSettings
from rsnotify.hub.web.app import build_app
from rsnotify.hub.worker import fetch, verification


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
                        make_queue(hub_settings.queue_name, connection), clock)
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
        if name == "verify_pending":
            outcomes.extend(await verification.verify_pending(ctx))
        elif name == "verify_intent":
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


# --- fan-out fixtures (fan-out's) -----------------------------------------------------------
import asyncio as _asyncio
import threading as _threading
import time as _time

from cryptography.fernet import Fernet as _Fernet

from rsnotify.hub import keys as _keys
from rsnotify.hub import records as _records
from rsnotify.hub import store as _store
from rsnotify.hub.crypto import encrypt_secret as _encrypt_secret
from rsnotify.hub.worker import context as _context
from rsnotify.hub.worker import fanout as _fanout
from rsnotify.hub.worker import runs as _runs
from rsnotify.hub.enqueue import make_queue


@pytest.fixture
def fanout_settings(redis_url: str, tmp_path) -> HubSettings:
    """Loopback hub settings with quick retries, a short claim TTL and a fresh Fernet key."""
    return HubSettings(redis_url=redis_url, data_dir=str(tmp_path / "data"), workers=0,
                       secret_key=_Fernet.generate_key().decode(), retry_base=0.01, retry_cap=0.04,
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
        token = _encrypt_secret(self.ctx.fernet, secret)
        sid, _ = await _store.activate_subscription(self.redis, topic, callback, secret=token,
                                                    lease_seconds=lease_seconds, now=self.clock())
        return sid

    async def publish(self, topic: str, body: bytes, *, content_type: str = "application/xml",
                      resourcesync: str = "") -> _records.AppendedNotification:
        return await _store.append_notification(self.redis, topic, body, content_type=content_type,
                                                resourcesync=resourcesync, now=_time.time(),
                                                max_len=self.ctx.settings.log_max_len)

    async def fan_out(self, topic: str) -> _runs.FanOutReport:
        return await _fanout.fan_out(self.ctx, _keys.topic_id(topic))

    async def settle(self, rounds: int = 200) -> int:
        """Move the clock to each due retry and serve it, until none is left; returns rounds run."""
        for done in range(rounds):
            due = await self.redis.zrange(_keys.due_key(), 0, 0, withscores=True)
            if not due:
                return done
            self.clock.t = max(self.clock.t, due[0][1])
            sids = await _store.pop_due(self.redis, self.clock())
            await _asyncio.gather(*(_fanout.deliver_subscription(self.ctx, sid) for sid in sids))
        raise AssertionError(f"retries still due after {rounds} rounds")


@pytest.fixture
async def fanout_hub(fanout_settings: HubSettings, clock: Clock) -> AsyncIterator[FanoutHub]:
    ctx = await _context.open_context(fanout_settings, clock=clock)
    yield FanoutHub(ctx, clock)
    await _context.close_context(ctx)


@dataclass
class Sink:
    """Loopback subscribers served from a background thread (for sync tests that run HubWorker in
    the main thread). `behave[path]` is a callable (n = how many requests that path got before)
    -> status, or -> ("hang", seconds). Records (path, query, body, headers, time) per request."""

    base: str = ""
    received: list[tuple[str, str, bytes, dict[str, str], float]] = field(default_factory=list)
    behave: dict[str, Callable[[int], Any]] = field(default_factory=dict)
    lock: Any = field(default_factory=_threading.Lock)

    def url(self, path: str) -> str:
        return self.base + path

    def bodies(self, path: str) -> list[bytes]:
        with self.lock:
            return [body for p, _, body, _, _ in self.received if p == path]

    async def handle(self, request: web.Request) -> web.Response:
        if request.method == "GET":             # intent verification: echo the challenge
            return web.Response(text=request.query.get("hub.challenge", ""))
        body = await request.read()
        with self.lock:
            count = sum(1 for p, *_ in self.received if p == request.path)
            self.received.append((request.path, request.query_string, body, dict(request.headers), _time.time()))
        answer = self.behave.get(request.path, lambda n: 200)(count)
        if isinstance(answer, tuple):
            await _asyncio.sleep(answer[1])
            answer = 200
        return web.Response(status=answer)


@pytest.fixture
def sink() -> Any:
    recorder = Sink()
    loop = _asyncio.new_event_loop()
    started = _threading.Event()
    state: dict[str, Any] = {}

    async def serve() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", recorder.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        recorder.base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        started.set()

    thread = _threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    yield recorder
    _asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)

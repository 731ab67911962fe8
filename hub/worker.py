"""The worker process: HubWorker (a non-forking RQ worker) and its context — one event loop in
a thread of its own, one aiohttp.ClientSession, one async Redis client, the settings — kept for
the life of the process, so connections to subscribers are reused across jobs.

This is the only process-wide state of the hub; job functions reach it through `context()`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import redis as redis_sync
from cryptography.fernet import Fernet
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError
from rq import Queue, SimpleWorker

from . import netguard, secrets
from .delivery import Deliveries
from .errors import SettingsError
from .settings import HubSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
USER_AGENT = "rsnotify-hub (+https://github.com/rsnotify)"
MAX_BATCH = 2000          # Redis commands sent in one pipeline


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # optional: a faster loop when installed
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """An event loop running forever in a daemon thread; the main thread hands it coroutines.

    RQ's job loop and signal handlers stay in the main thread; the deliveries of every job
    share this one loop (and so one ClientSession and its connection pool).
    """

    def __init__(self) -> None:
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self._run, name="rsnotify-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


class RedisBatcher:
    """Sends the Redis commands issued while a pipeline is on its way together, in one next
    pipeline, strictly in issue order. Hundreds of concurrent deliveries then cost a few round
    trips, and a subscription's writes can never overtake each other."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._queue: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._busy = False
        self._sources: dict[str, str] = {}

    def execute(self, *command: Any) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((command, future))
        if not self._busy:
            self._busy = True
            asyncio.get_running_loop().create_task(self._drain())
        return future

    def script(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> asyncio.Future[Any]:
        """Run a store._Script by EVALSHA (loaded again by EVAL when Redis lost it, e.g. a restart)."""
        self._sources[script.sha] = script.source
        return self.execute("EVALSHA", script.sha, len(keys), *keys, *args)

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                await self._send(batch)
        finally:
            self._busy = False

    async def _send(self, batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for command, _ in batch:
                    pipe.execute_command(*command)
                results = await pipe.execute(raise_on_error=False)
            for index, result in enumerate(results):
                if isinstance(result, NoScriptError):
                    command = batch[index][0]
                    results[index] = await self.redis.execute_command("EVAL", self._sources[command[1]], *command[2:])
        except (RedisError, OSError) as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


@dataclass
class WorkerContext:
    """What jobs and the async cores need: settings, Redis, the ClientSession, the Fernet, the
    queue for follow-up jobs, the delivery machinery, the clock, and the loop they all live on."""

    settings: HubSettings
    redis: Redis
    session: aiohttp.ClientSession
    fernet: Fernet
    queue: Queue | None
    batch: RedisBatcher
    clock: Callable[[], float] = time.time
    deliveries: Deliveries = field(init=False)
    loop_thread: LoopThread | None = None

    def now(self) -> float:
        return self.clock()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the worker's loop and wait for it (from the main thread, in a job)."""
        if self.loop_thread is None:
            raise RuntimeError("this worker context has no loop thread; await the coroutine instead")
        return self.loop_thread.run(coro, timeout)

    def run_detachable(self, coro: Coroutine[Any, Any, T], wait: float) -> T | None:
        """Run `coro` on the worker's loop; after `wait` seconds stop waiting (it carries on), so
        one slow subscriber never keeps this worker from its next job. None when detached."""
        if self.loop_thread is None:
            raise RuntimeError("this worker context has no loop thread; await the coroutine instead")
        future = self.loop_thread.submit(self.deliveries.tracked(coro))
        try:
            return future.result(wait)
        except concurrent.futures.TimeoutError:
            return None


async def open_context(settings: HubSettings, *, redis_url: str | None = None, queue: Queue | None = None,
                       clock: Callable[[], float] = time.time, follow_seconds: float = 0.0) -> WorkerContext:
    """Build a worker context on the running loop (close it with close_context).

    With `follow_seconds`, a fan-out keeps following its topic's log that long after the last
    entry (see hub.delivery._follow); 0 for none.
    """
    url = redis_url or settings.redis_url
    if url is None:
        raise SettingsError("a worker needs a Redis URL: give --redis-url (RSNOTIFY_REDIS_URL)")
    redis = Redis.from_url(url)
    fernet = secrets.load_fernet(settings, create=False)
    try:
        await secrets.check_key_matches(redis, fernet)
    except BaseException:
        await redis.aclose()
        raise
    limit = max(100, settings.delivery_concurrency + 50)
    session = aiohttp.ClientSession(
        connector=netguard.make_connector(settings, limit=limit),
        cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=False,
        headers={"User-Agent": USER_AGENT})
    ctx = WorkerContext(settings, redis, session, fernet, queue, RedisBatcher(redis), clock)
    ctx.deliveries = Deliveries(ctx, settings.delivery_concurrency, follow_seconds=follow_seconds)
    ctx.deliveries.start()
    return ctx


async def close_context(ctx: WorkerContext, *, drain: bool = True) -> None:
    """Let in-flight deliveries end (all of their backlog with `drain`, else the current POST),
    release every claim, and close the session and the Redis client."""
    try:
        await ctx.deliveries.close(drain=drain, grace=ctx.settings.delivery_timeout + 5)
    finally:
        await ctx.session.close()
        await ctx.redis.aclose()


_context: WorkerContext | None = None


def context() -> WorkerContext:
    """The running HubWorker's context (for RQ job functions only)."""
    if _context is None:
        raise RuntimeError("hub jobs run inside a HubWorker (`rsnotify worker`); no worker context here")
    return _context


def _url_of(connection: redis_sync.Redis) -> str:
    kw = connection.connection_pool.connection_kwargs
    auth = f"{kw.get('username') or ''}:{kw['password']}@" if kw.get("password") else ""
    if kw.get("path"):
        return f"unix://{auth}{kw['path']}?db={kw.get('db', 0)}"
    return f"redis://{auth}{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


class HubWorker(SimpleWorker):
    """An RQ worker that runs jobs in its own process (no fork per job) and keeps one worker
    context for its whole life; its maintenance (due retries, reconciling lagging
    subscriptions, log retention, lease sweeps) runs beside the jobs on the same loop.

    `HubWorker([queue], connection=redis, settings=settings).work(burst=True)` runs the queued
    jobs and returns once they are done and every delivery they started has finished; burst
    mode runs no maintenance (tests call hub.reconciler's steps themselves).
    """

    def __init__(self, queues: Any, *args: Any, settings: HubSettings | None = None,
                 clock: Callable[[], float] = time.time, **kwargs: Any) -> None:
        super().__init__(queues, *args, **kwargs)
        self.settings = settings or HubSettings()
        self.clock = clock
        self.ctx: WorkerContext | None = None
        self._loop_thread: LoopThread | None = None
        self._maintenance: concurrent.futures.Future[None] | None = None
        self._burst = False

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        self._burst = burst
        return super().work(burst, *args, **kwargs)

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        global _context
        super().bootstrap(*args, **kwargs)
        from . import reconciler
        self._loop_thread = LoopThread()
        queue = Queue(self.settings.queue_name, connection=self.connection)
        url = self.settings.redis_url or _url_of(self.connection)
        try:
            follow = 0.0 if self._burst else self.settings.follow_seconds  # a burst worker ends with its queue
            self.ctx = self._loop_thread.run(open_context(self.settings, redis_url=url, queue=queue, clock=self.clock,
                                                          follow_seconds=follow))
        except BaseException:
            self._loop_thread.stop()
            self._loop_thread = None
            raise
        self.ctx.loop_thread = self._loop_thread
        _context = self.ctx
        if not self._burst:
            self._maintenance = self._loop_thread.submit(reconciler.maintain(self.ctx))
        log.info("worker %s ready: %d subscriptions at once, queue %s", self.name,
                 self.settings.delivery_concurrency, self.settings.queue_name)

    def teardown(self) -> None:
        global _context
        try:
            if self._loop_thread is not None and self.ctx is not None:
                if self._maintenance is not None:
                    self._loop_thread.loop.call_soon_threadsafe(self._maintenance.cancel)
                self._loop_thread.run(close_context(self.ctx, drain=self._burst))
        finally:
            if self._loop_thread is not None:
                self._loop_thread.stop()
            self._loop_thread, self.ctx, _context = None, None, None
            super().teardown()


def run_worker(settings: HubSettings, *, burst: bool = False, queues: Sequence[str] = (),
               concurrency: int | None = None, name: str | None = None, rq_log_level: str = "WARNING") -> None:
    """`rsnotify worker`: serve the hub's queue(s) until SIGINT/SIGTERM (or, with `burst`, until
    they are empty). Raises SettingsError when Redis is not given or cannot be reached."""
    if settings.redis_url is None:
        raise SettingsError("rsnotify worker needs the hub's Redis: give --redis-url (RSNOTIFY_REDIS_URL)")
    if concurrency is not None:
        if concurrency <= 0:
            raise SettingsError(f"concurrency must be a positive number, got {concurrency}")
        settings = settings.with_values(delivery_concurrency=concurrency)
    connection = redis_sync.Redis.from_url(settings.redis_url)
    try:
        connection.ping()
    except RedisError as exc:
        raise SettingsError(f"cannot reach Redis at {settings.redis_url}: {exc}") from None
    names = list(queues) or [settings.queue_name]
    worker = HubWorker([Queue(n, connection=connection) for n in names], connection=connection,
                       settings=settings, name=name)
    worker.work(burst=burst, logging_level=rq_log_level)

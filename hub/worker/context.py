"""The worker process's context: one event loop in a thread of its own, one outbound client for
the deliveries, verifications and denials and one for thin-ping fetches (rsnotify/outbound.py;
that one keeps the answers' header fields), one async Redis client, the settings — kept for the
life of the process, so connections to subscribers are reused across jobs.

This is the only process-wide state of the hub; job functions reach it through `context()`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from cryptography.fernet import Fernet
from redis.asyncio import Redis
from redis.exceptions import RedisError
from rq import Queue

from rsnotify import eventloop
from rsnotify.outbound import OutboundClient

from .. import crypto, netguard, redis_clients, store
from ..batch import RedisBatcher
from ..errors import SettingsError
from ..settings import HubSettings
from .deliveries import Deliveries
from .heartbeat import Heartbeat
from .lane import VerificationLane

log = logging.getLogger(__name__)

T = TypeVar("T")
FETCH_CONNECTIONS = 4     # the thin-ping fetcher's pool
STOP_GRACE = 5.0          # s a stopping worker waits for the deliveries in flight


class LoopThread:
    """An event loop running forever in a daemon thread; the main thread hands it coroutines.

    RQ's job loop and signal handlers stay in the main thread; the deliveries of every job
    share this one loop (and so its connection pools: the outbound client's and the ClientSession's).
    """

    def __init__(self) -> None:
        self.loop = eventloop.new_event_loop()
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



@dataclass
class WorkerContext:
    """What jobs and the async cores need: settings, Redis, the outbound clients, the Fernet, the queue for follow-up jobs, the delivery machinery, the clock, and the loop
    they all live on."""

    settings: HubSettings
    redis: Redis
    outbound: OutboundClient      # the deliveries' POSTs, the verification and denial GETs
    fetcher: OutboundClient       # thin-ping fetches (keeps the answers' header fields)
    fernet: Fernet
    queue: Queue | None
    batch: RedisBatcher
    clock: Callable[[], float] = time.time
    deliveries: Deliveries = field(init=False)
    loop_thread: LoopThread | None = None
    heartbeat: Heartbeat | None = None
    verifying: VerificationLane | None = None      # the verification lane, once a HubWorker runs it

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
    entry (see hub.delivery.follow); 0 for none.
    """
    url = redis_url or settings.redis_url
    if url is None:
        raise SettingsError("a worker needs a Redis URL: give --redis-url (RSNOTIFY_REDIS_URL)")
    target = redis_clients.RedisTarget.of(settings, url)
    redis = redis_clients.async_client(target, settings.redis_connections)
    fernet = crypto.load_fernet(settings, create=False)
    try:
        await crypto.check_key_matches(redis, fernet)
    except BaseException:
        await redis.aclose()
        raise
    # every lane's requests at once, so no lane waits for another's connections
    limit = settings.delivery_concurrency + settings.retry_concurrency + settings.verify_concurrency + 50
    # the deliveries' and verifications' pool, room for every lane's requests at once: each one
    # in flight has a connection, and as many stay idle for the next requests to the same callbacks
    outbound = netguard.outbound_client(settings, limit=limit, max_idle=limit)
    # a worker fetches one thin-ping topic at a time (a job each); a few idle connections serve
    # a Source that is pinged again
    fetcher = netguard.outbound_client(settings, limit=FETCH_CONNECTIONS, max_idle=FETCH_CONNECTIONS,
                                       keep_headers=True)
    ctx = WorkerContext(settings, redis, outbound, fetcher, fernet, queue, RedisBatcher(redis), clock)
    ctx.deliveries = Deliveries(settings, ctx.batch, fernet, settings.delivery_concurrency,
                                follow_seconds=follow_seconds)
    # the heartbeat makes this worker's claims valid: beat before the first claim
    ctx.heartbeat = Heartbeat(redis_clients.sync_client(target, 2), ctx.deliveries.worker_id, settings.heartbeat_ttl)
    try:
        await asyncio.to_thread(ctx.heartbeat.start)
    except BaseException:
        await outbound.close()
        await fetcher.close()
        await redis.aclose()
        raise
    ctx.verifying = VerificationLane(ctx.deliveries.worker_id, settings.verify_concurrency)
    ctx.deliveries.start()
    return ctx


async def close_context(ctx: WorkerContext, *, drain: bool = True) -> None:
    """Let in-flight deliveries end (all of their backlog with `drain`, else the current POST),
    release every claim, put taken verifications back in line, stop the heartbeat, and close the
    outbound clients and the Redis client."""
    try:
        if ctx.verifying is not None and ctx.verifying.task is not None:
            ctx.verifying.task.cancel()
        # a stopping worker has a few seconds (docker, systemd and the embedded hub give ~10):
        # a POST still running then is cancelled, its claim released, and it is sent again later
        grace = ctx.settings.delivery_timeout + 5 if drain else min(ctx.settings.delivery_timeout + 1, STOP_GRACE)
        await ctx.deliveries.close(drain=drain, grace=grace)
        if ctx.verifying is not None:
            try:
                await store.return_taken_challenges(ctx.redis, ctx.verifying.wid)
            except (RedisError, OSError) as exc:
                # the one line of a stop without Redis: what this worker held is not lost
                log.warning("worker %s stops without Redis (%s): its claims and verifications go to the other "
                            "workers once Redis is back", ctx.verifying.wid, exc)
    finally:
        if ctx.heartbeat is not None:
            await asyncio.to_thread(ctx.heartbeat.stop)
        await ctx.outbound.close()
        await ctx.fetcher.close()
        await ctx.redis.aclose()


_context: WorkerContext | None = None


def context() -> WorkerContext:
    """The running HubWorker's context (for RQ job functions only)."""
    if _context is None:
        raise RuntimeError("hub jobs run inside a HubWorker (`rsnotify worker`); no worker context here")
    return _context


def set_context(ctx: WorkerContext | None) -> None:
    """Make `ctx` the context job functions get (the HubWorker sets it while it runs)."""
    global _context
    _context = ctx

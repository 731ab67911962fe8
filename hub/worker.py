"""The worker process: HubWorker (a non-forking RQ worker) and its context — one event loop in
a thread of its own, one aiohttp.ClientSession, one async Redis client, the settings — kept for
the life of the process, so connections to subscribers are reused across jobs.

This is the only process-wide state of the hub; job functions reach it through `context()`.
"""
from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import redis as redis_sync
from cryptography.fernet import Fernet
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError
from rq import Queue, SimpleWorker

from . import netguard, secrets, store
from .delivery import SubRun, callback_url
from .errors import SettingsError
from .secrets import decrypt_secret
from .settings import HubSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
USER_AGENT = "rsnotify-hub (+https://github.com/rsnotify)"
MAX_BATCH = 2000          # Redis commands sent in one pipeline
CHECKPOINT_EVERY = 0.2    # s between cursor/attempt writes of running subscriptions
SECRET_CACHE = 10_000     # decrypted secrets kept per process
TOPIC_URLS = 10_000       # topic URLs cached per process
STOP_GRACE = 5.0          # s a stopping worker waits for the deliveries in flight


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


class Deliveries:
    """This process's delivery machinery: claims (with their lock renewal), concurrency slots,
    ordered checkpoints, counters, and the decrypted-secret cache. One per worker context."""

    def __init__(self, ctx: WorkerContext, concurrency: int, *, follow_seconds: float = 0.0) -> None:
        self.ctx = ctx
        self.slots = asyncio.Semaphore(concurrency)
        self.follow_seconds = follow_seconds      # 0: never follow a topic (burst workers, tests)
        self.following: set[str] = set()
        self.runs: dict[str, SubRun] = {}
        self.claimed = 0                          # claims served so far (for tests and the curious)
        self._topic_urls: dict[str, str] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.stopping = False
        self._prefix = uuid.uuid4().hex[:12]
        self._claims = 0
        self._secrets: dict[str, str] = {}
        self._stats: defaultdict[str, float] = defaultdict(float)
        self._keeper: asyncio.Task[None] | None = None
        settings = ctx.settings
        self.timeout = aiohttp.ClientTimeout(total=settings.delivery_timeout, sock_connect=settings.connect_timeout)

    # -- lifecycle

    def start(self) -> None:
        self._keeper = asyncio.get_running_loop().create_task(self._keep())

    async def close(self, *, drain: bool, grace: float) -> None:
        """Stop: with `drain` let every run finish its backlog, else only its current delivery."""
        self.stopping = not drain
        pending = [t for t in self.tasks if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5)
        if self._keeper:
            self._keeper.cancel()
            try:
                await self._keeper
            except asyncio.CancelledError:
                pass
        try:
            await self._flush_stats()
        except RedisError as exc:
            log.warning("could not write the last delivery counters: %s", exc)

    async def tracked(self, coro: Any) -> Any:
        """Await `coro` as a task `close` waits for (a fan-out its job stopped waiting for)."""
        return await self.spawn(coro)

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- claims

    def new_token(self) -> str:
        # one token per claim, so a late write from an earlier claim of this worker is refused too
        self._claims += 1
        return f"{self._prefix}:{self._claims}"

    async def claim(self, sid: str) -> SubRun | None:
        """Own the subscription (lock with TTL) and read its delivery state; None when owned elsewhere."""
        token = self.new_token()
        ttl_ms = int(self.ctx.settings.lock_ttl * 1000)
        raw = await self.ctx.batch.script(store.CLAIM_SCRIPT, [store.sub_lock_key(sid), store.sub_key(sid)],
                                          [token, ttl_ms])
        if not raw:
            return None
        values = dict(zip(store.DELIVERY_FIELDS, raw))
        if values["callback"] is None:          # removed meanwhile
            await self.ctx.batch.execute("DEL", store.sub_lock_key(sid))
            return None
        return self.run_from(sid, token, values)

    async def topic_url(self, tid: str) -> str:
        url = self._topic_urls.get(tid)
        if url is None:
            url = store._text(await self.ctx.batch.execute("HGET", store.topic_key(tid), "url"))
            if len(self._topic_urls) >= TOPIC_URLS:
                self._topic_urls.clear()
            self._topic_urls[tid] = url
        return url

    def run_from(self, sid: str, token: str, v: dict[str, bytes | None]) -> SubRun:
        """The run of a claim, from the claimed subscription's DELIVERY_FIELDS."""
        text = store._text
        callback = text(v["callback"])
        cursor = text(v["cursor"], "0-0")
        return SubRun(
            sid=sid, token=token, topic=text(v["topic"]), callback=callback, tid=text(v["tid"]),
            url=callback_url(callback), secret=self._secret(text(v["secret"])),
            state=text(v["state"], "active"), expires=store._int(v["expires"]), cursor=cursor,
            cursor_key=store.parse_entry_id(cursor),
            cursor_seq=None if v["cursor_seq"] is None else store._int(v["cursor_seq"]),
            attempts=store._int(v["attempts"]), next_attempt=float(text(v["retry_at"]) or 0),
            resend=store._int(v["resend"]))

    def _secret(self, token: str) -> str | None:
        if not token:
            return None
        secret = self._secrets.get(token)
        if secret is None:
            if len(self._secrets) >= SECRET_CACHE:
                self._secrets.clear()
            secret = self._secrets[token] = decrypt_secret(self.ctx.fernet, token) or ""
        return secret or None

    async def checkpoint(self, run: SubRun, *, release: bool, due_at: float | None = None) -> list[Any]:
        """Write the run's pending state; with `release` also give up the claim. The answer tells
        what the subscription looks like now: {1, state, expires, last log id, resend, next_attempt},
        {0} when the claim was lost, {-1} when the subscription is gone."""
        fields = run.fields
        fields["cursor"] = run.cursor
        if run.cursor_seq is not None:
            fields["cursor_seq"] = run.cursor_seq
        pairs = [x for kv in fields.items() for x in kv]
        records = run.records[-store.RECENT_ATTEMPTS:]   # oldest first: LPUSH leaves the newest on top
        args = [run.token, 1 if release else 0, run.sid, store.RECENT_ATTEMPTS, run.delivered, run.gaps,
                "" if due_at is None else repr(due_at), len(pairs), *pairs, *records]
        run.fields, run.records, run.delivered, run.gaps = {}, [], 0, 0
        keys = [store.sub_lock_key(run.sid), store.sub_key(run.sid), store.sub_attempts_key(run.sid),
                store.due_key(), store.topic_log_key(run.tid)]
        answer = await self.ctx.batch.script(store.CHECKPOINT_SCRIPT, keys, args)
        if answer[0] != 1:
            run.stop = True
        else:
            run.state, run.expires = store._text(answer[1]), store._int(answer[2])
            if run.state != "active":
                run.stop = True
        return answer

    # -- counters

    def count(self, outcome: str, status: int | None, seconds: float, entry: store.LogEntry) -> None:
        s = self._stats
        s[f"outcome:{outcome}"] += 1
        s["status:error" if status is None else f"status:{status // 100}xx"] += 1
        _observe(s, "delivery_seconds", seconds)
        if outcome == "delivered" and entry.published_ms:
            _observe(s, "publish_to_delivery_seconds", max(0.0, time.time() - entry.published_ms / 1000))

    async def _flush_stats(self) -> None:
        stats, self._stats = self._stats, defaultdict(float)
        for name, value in stats.items():
            if name.endswith(":sum"):
                self.ctx.batch.execute("HINCRBYFLOAT", store.stats_key(), name, repr(value))
            else:
                self.ctx.batch.execute("HINCRBY", store.stats_key(), name, int(value))
        if stats:
            await self.ctx.batch.execute("PING")

    # -- the keeper: checkpoints, lock renewal, counters

    async def _keep(self) -> None:
        ttl = self.ctx.settings.lock_ttl
        renew_every = max(0.05, ttl / 3)
        last_renew = time.monotonic()
        while True:
            await asyncio.sleep(min(CHECKPOINT_EVERY, renew_every))
            try:
                runs = [r for r in self.runs.values() if r.is_dirty and not r.stop]
                if runs:
                    await asyncio.gather(*(self.checkpoint(r, release=False) for r in runs))
                if time.monotonic() - last_renew >= renew_every:
                    last_renew = time.monotonic()
                    await self._renew(list(self.runs.values()))
                await self._flush_stats()
            except RedisError as exc:
                log.error("delivery keeper: Redis failed: %s", exc)

    async def _renew(self, runs: list[SubRun]) -> None:
        ttl_ms = int(self.ctx.settings.lock_ttl * 1000)
        for start in range(0, len(runs), 500):
            chunk = runs[start:start + 500]
            keys = [store.sub_lock_key(r.sid) for r in chunk]
            answer = await self.ctx.batch.script(store.RENEW_SCRIPT, keys, [ttl_ms, *(r.token for r in chunk)])
            for run, kept in zip(chunk, answer):
                if not kept and not run.stop:
                    log.warning("lost the claim on subscription %s (%s); another worker takes over",
                                run.sid, run.callback)
                    run.stop = True


def _observe(stats: defaultdict[str, float], name: str, seconds: float) -> None:
    index = bisect.bisect_left(store.LATENCY_BUCKETS, seconds)
    bound = "+Inf" if index == len(store.LATENCY_BUCKETS) else repr(store.LATENCY_BUCKETS[index])
    stats[f"{name}:le:{bound}"] += 1
    stats[f"{name}:sum"] += seconds
    stats[f"{name}:count"] += 1


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
    entry (see hub.delivery.follow); 0 for none.
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
        # a stopping worker has a few seconds (docker, systemd and the embedded hub give ~10):
        # a POST still running then is cancelled, its claim released, and it is sent again later
        grace = ctx.settings.delivery_timeout + 5 if drain else min(ctx.settings.delivery_timeout + 1, STOP_GRACE)
        await ctx.deliveries.close(drain=drain, grace=grace)
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
    url = settings.redis_url
    if url is None:
        raise SettingsError("rsnotify worker needs the hub's Redis: give --redis-url (RSNOTIFY_REDIS_URL)")
    if concurrency is not None:
        if concurrency <= 0:
            raise SettingsError(f"concurrency must be a positive number, got {concurrency}")
        settings = settings.with_values(delivery_concurrency=concurrency)
    connection = redis_sync.Redis.from_url(url)
    try:
        connection.ping()
    except RedisError as exc:
        raise SettingsError(f"cannot reach Redis at {url}: {exc}") from None
    names = list(queues) or [settings.queue_name]
    worker = HubWorker([Queue(n, connection=connection) for n in names], connection=connection,
                       settings=settings, name=name)
    worker.work(burst=burst, logging_level=rq_log_level)

"""The worker process: HubWorker (a non-forking RQ worker that keeps one worker context for its
whole life) and `run_worker`, what `rsnotify worker` runs."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis as redis_sync
from redis.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import MasterNotFoundError
from rq import SimpleWorker

from .. import redis_clients
from ..crypto import KEY_FILE
from ..enqueue import JOB_SERIALIZER, make_queue
from ..errors import SettingsError
from ..settings import HubSettings
from . import reconciler, verifying
from .context import LoopThread, WorkerContext, close_context, open_context, set_context

log = logging.getLogger(__name__)

KEY_WAIT = 30.0           # s a worker waits for the key file of a hub started at the same moment
RQ_CONNECTIONS = 16       # RQ's own connections (job loop, heartbeats, maintenance steps)
# what a Redis failover raises (no primary yet, a connection refused or cut, an answer late)
FAILOVER_ERRORS = (RedisConnectionError, RedisTimeoutError)
FAILOVER_WAIT = 30.0      # s a worker behind Sentinels waits for a primary at start (a failover takes ~5-15 s)


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
    mode runs no maintenance (tests call worker/reconciler.py's steps themselves).
    """

    def __init__(self, queues: Any, *args: Any, settings: HubSettings | None = None,
                 clock: Callable[[], float] = time.time, **kwargs: Any) -> None:
        # jobs are JSON (enqueue.make_queue): the worker never unpickles what Redis holds
        kwargs["serializer"] = JOB_SERIALIZER
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

    # RQ's job loop quits, with exit 0 (which a service manager does not restart), at a Redis error
    # anywhere but the wait inside its dequeue: its heartbeat, its suspension check, its state and
    # maintenance writes, its records around a job. During a failover each of them fails in turn,
    # so each is waited out here. They keep only RQ's own records (its workers list, registries);
    # this worker's liveness is its own heartbeat (heartbeat.py), and a job's work is never lost
    # with them: fan-outs are found again by the reconciler (lagging subscriptions), and
    # verifications wait in their line for the lanes.
    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        if pipeline is not None:            # only queued on the pipeline: its execute reports
            super().heartbeat(timeout, pipeline)
            return
        try:
            super().heartbeat(timeout)
        except FAILOVER_ERRORS as exc:
            log.warning("worker %s: RQ's heartbeat failed (%s); it goes on and writes the next", self.name, exc)

    def execute_job(self, job: Any, queue: Any) -> None:
        try:
            super().execute_job(job, queue)
        except FAILOVER_ERRORS as exc:
            log.warning("worker %s: Redis failed around job %s (%s); its work is picked up again once Redis "
                        "answers; going on in 1 s", self.name, job.id, exc)
            time.sleep(1.0)

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        while True:
            try:
                return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except FAILOVER_ERRORS as exc:
                log.warning("worker %s: cannot take a job (%s); trying again in 1 s", self.name, exc)
                time.sleep(1.0)

    def run_maintenance_tasks(self) -> None:
        try:
            super().run_maintenance_tasks()
        except FAILOVER_ERRORS as exc:
            log.warning("worker %s: RQ's maintenance failed (%s); it runs again at its next turn", self.name, exc)

    def check_for_suspension(self, burst: bool) -> None:
        try:
            super().check_for_suspension(burst)
        except FAILOVER_ERRORS as exc:
            log.warning("worker %s: cannot ask Redis whether workers are suspended (%s); asking again in 1 s",
                        self.name, exc)
            time.sleep(1.0)

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)
        self._loop_thread = LoopThread()
        queue = make_queue(self.settings.queue_name, self.connection)
        # the settings' URL (a Sentinel URL names no single server); else the one RQ was given
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
        self.ctx.deliveries.name = self.name     # its reports in the status page's workers table
        set_context(self.ctx)
        if not self._burst:
            self._maintenance = self._loop_thread.submit(reconciler.maintain(self.ctx))
            self._loop_thread.run(_start_verification_lane(self.ctx))
        log.info("worker %s ready: %d subscriptions at once, queue %s", self.name,
                 self.settings.delivery_concurrency, self.settings.queue_name)

    def teardown(self) -> None:
        try:
            if self._loop_thread is not None and self.ctx is not None:
                if self._maintenance is not None:
                    self._loop_thread.loop.call_soon_threadsafe(self._maintenance.cancel)
                self._loop_thread.run(close_context(self.ctx, drain=self._burst))
        except (RedisError, OSError) as exc:
            log.warning("worker %s stopped without Redis (%s): what it held goes to the other workers", self.name, exc)
        finally:
            if self._loop_thread is not None:
                self._loop_thread.stop()
            self._loop_thread, self.ctx = None, None
            set_context(None)
            try:
                super().teardown()
            except (RedisError, OSError):
                pass              # RQ's own unregistering needs Redis too; said above, once


async def _start_verification_lane(ctx: WorkerContext) -> None:
    if ctx.verifying is not None:
        ctx.verifying.task = asyncio.get_running_loop().create_task(verifying.run_lane(ctx))


def wait_for_key_file(settings: HubSettings, timeout: float = KEY_WAIT) -> None:
    """A worker started beside its hub may look before the hub wrote DATA_DIR/secret.key: wait
    for it (bounded, saying so). A missing key after that is load_fernet's SettingsError."""
    path = settings.data_path / KEY_FILE
    if settings.secret_key or path.exists():
        return
    log.info("waiting up to %.0f s for the hub to create the secret key %s", timeout, path)
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def _first_ping(connection: redis_sync.Redis, target: redis_clients.RedisTarget) -> None:
    """Reach Redis once before serving; SettingsError when it cannot be reached. Behind Sentinels
    a worker started (or restarted) during a failover finds no primary for a few seconds: that is
    waited out (bounded, said once), while a plain URL that does not answer is said at once."""
    deadline = time.monotonic() + (FAILOVER_WAIT if target.address.is_sentinel else 0.0)
    said = False
    while True:
        try:
            connection.ping()
            return
        except MasterNotFoundError as exc:
            if time.monotonic() >= deadline:
                raise SettingsError(f"cannot reach Redis at {target.shown}: {exc}") from None
            if not said:
                log.warning("no Redis primary behind the Sentinels yet (%s); waiting up to %.0f s", exc,
                            FAILOVER_WAIT)
                said = True
            time.sleep(0.5)
        except RedisError as exc:
            raise SettingsError(f"cannot reach Redis at {target.shown}: {exc}") from None


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
    # Redis first: an unreachable Redis is said within the connect timeout, not after the wait
    # for a key file that a hub without its Redis will never write.
    target = redis_clients.RedisTarget.of(settings)
    connection = redis_clients.sync_client(target, RQ_CONNECTIONS, connect_timeout=settings.connect_timeout)
    _first_ping(connection, target)
    wait_for_key_file(settings)
    names = list(queues) or [settings.queue_name]
    worker = HubWorker([make_queue(n, connection) for n in names], connection=connection,
                       settings=settings, name=name)
    worker.work(burst=burst, logging_level=rq_log_level)

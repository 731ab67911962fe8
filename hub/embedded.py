"""Run a whole hub from one command: embedded Redis, child workers, the web server, clean stop.

`run_hub(settings)` blocks until SIGINT/SIGTERM, then stops the web server, the workers
(SIGTERM: they finish their job) and the embedded Redis (which flushes its AOF), in that order.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis as redis_sync
from aiohttp import web

from rsnotify import eventloop
from rsnotify.filelocks import LockBusyError
from rsnotify.filelocks import lock as lock_file
from rsnotify.filelocks import unlock as unlock_file

from . import redis_clients
from .crypto import load_fernet
from .redis_server import RedisServer, RedisServerError, start_redis_server
from .redis_url import redacted
from .settings import HubSettings
from .web.app import build_app

log = logging.getLogger(__name__)

WORKER_STOP_TIMEOUT = 8.0       # seconds a worker gets to finish its job after SIGTERM (docker stop waits 10)
SUPERVISE_INTERVAL = 1.0        # seconds between checks of the child processes
MAX_WORKER_RESTARTS = 20        # restarts of crashed workers before the hub gives up on them
LOCK_FILE = "hub.lock"
HASH_MAX_VALUE = 1024           # bytes: values up to this size keep a hash in its compact encoding
WORKER_COMMAND = [sys.executable, "-c", "from rsnotify.cli import main; main()", "worker"]


class EmbeddedError(Exception):
    """The hub cannot start: data dir in use, Redis would not start, address in use."""


@dataclass
class Children:
    """The worker processes this hub started, and how to start another."""

    settings: HubSettings
    log_level: str = "INFO"
    processes: list[subprocess.Popen] = field(default_factory=list)
    restarts: int = 0

    def start(self, count: int) -> None:
        for _ in range(count):
            self.processes.append(self._spawn())

    def _spawn(self) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RSNOTIFY_")}
        env.update(self.settings.to_env())
        env["RSNOTIFY_LOG_LEVEL"] = self.log_level
        # a session of their own: Ctrl-C reaches only the hub, which stops them in order
        process = subprocess.Popen([*WORKER_COMMAND, "--parent-pid", str(os.getpid())], env=env,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        # set before the interpreter has started a thread (it has only just exec'd): every
        # thread it starts inherits the policy
        run_as_batch(process.pid)
        return process

    def replace_dead(self) -> None:
        """Start a new worker for each one that died on its own (bounded)."""
        for index, process in enumerate(self.processes):
            if process.poll() is not None and self.restarts < MAX_WORKER_RESTARTS:
                self.restarts += 1
                log.warning("worker %s exited with %s; starting another (%d/%d)", process.pid,
                            process.returncode, self.restarts, MAX_WORKER_RESTARTS)
                self.processes[index] = self._spawn()

    def stop(self, timeout: float = WORKER_STOP_TIMEOUT) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %s did not stop within %.0fs; killing it", process.pid, timeout)
                process.kill()
                process.wait()


@contextlib.contextmanager
def data_dir_lock(data: Path) -> Iterator[None]:
    """Hold DATA/hub.lock so two hubs never share one embedded Redis's data."""
    data.mkdir(parents=True, exist_ok=True)
    with open(data / LOCK_FILE, "w") as handle:
        try:
            lock_file(handle, wait=False)
        except LockBusyError:
            raise EmbeddedError(f"another rsnotify hub is using the data dir {data}") from None
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            unlock_file(handle)


def stop_stale_redis(data: Path) -> None:
    """Shut down a Redis left running on DATA/redis.sock by a hub that was killed (we hold the lock)."""
    sock = data / "redis.sock"
    if not sock.exists():
        return
    # no retries (command_timeout): after SHUTDOWN the connection drops by design, and a retry would only wait
    client = redis_clients.sync_client(f"unix://{sock}", 1, command_timeout=True)
    try:
        client.ping()
    except (redis_sync.RedisError, OSError):
        return  # a leftover socket file; redis-server replaces it
    log.warning("a Redis from an earlier hub is still running on %s; shutting it down", sock)
    with contextlib.suppress(redis_sync.RedisError, OSError):
        client.shutdown()  # writes and fsyncs its AOF first
    deadline = time.monotonic() + 10
    while sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    client.close()


def bind_socket(settings: HubSettings) -> socket.socket:
    """The listening socket (bound now, so port 0 becomes a real port before anything else starts)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock: socket.socket | None = None
    try:
        infos = socket.getaddrinfo(settings.host, settings.port, family, socket.SOCK_STREAM)
        sock = socket.socket(infos[0][0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4])
        sock.listen(1024)
    except OSError as exc:
        if sock is not None:
            sock.close()        # the port stays free, not held by a socket that failed to bind
        raise EmbeddedError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def run_hub(settings: HubSettings, *, log_level: str = "INFO", announce: Callable[[str], None] = print) -> None:
    """Serve the hub until SIGINT/SIGTERM; embedded Redis and child workers as settings say."""
    data = settings.data_path
    settings = settings.with_values(data_dir=str(data))  # absolute, for the child workers
    redis_server: RedisServer | None = None
    # only an embedded Redis's data needs one owner; web processes on a shared Redis may share a data dir
    lock = data_dir_lock(data) if settings.is_embedded else contextlib.nullcontext()
    with lock:
        load_fernet(settings)  # creates DATA/secret.key before any worker looks for it
        try:
            if settings.is_embedded:
                stop_stale_redis(data)
                redis_server = _start_redis(data)
                settings = settings.with_values(redis_url=redis_server.url)
            # closed on every way out, also when the app's startup refuses (Redis unreachable, another
            # hub's key, an unreadable tokens file) before the server took the socket: a caller that
            # runs the command in its own process (click's CliRunner) would keep the port bound
            with bind_socket(settings) as sock:
                settings = settings.with_values(port=sock.getsockname()[1])
                app = build_app(settings)
                children = Children(settings, log_level)
                children.start(settings.workers)
                try:
                    eventloop.run(_serve(app, sock, settings, children, redis_server, announce))
                finally:
                    children.stop()
        finally:
            if redis_server is not None:
                redis_server.stop()


def run_as_batch(pid: int) -> None:
    """Every thread of the hub's child `pid` under SCHED_BATCH (same share of the CPU, no
    preemption on wake-up), so the web process is not preempted each time a reply it sends to
    Redis or a delivery's answer wakes them: a child then runs when a core is free or the web
    process waits. With the hub, its Redis, a publisher and a subscriber on two cores the hub
    accepts 5-10 % more publishes so (alternated runs); an idle core still runs a woken child at
    once. Where the policy
    cannot be set (not Linux, a seccomp profile) the child runs as it would have."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    for thread in threads:
        try:
            os.sched_setscheduler(thread, policy, os.sched_param(0))
        except OSError:     # gone meanwhile, or not permitted here
            continue


def _start_redis(data: Path) -> RedisServer:
    try:
        # dies with the hub, even a SIGKILLed one: no Redis is left holding the data dir
        server = start_redis_server(data, unix_socket=True, new_session=True, die_with_parent=True)
    except (RedisServerError, OSError) as exc:
        raise EmbeddedError(f"cannot start the embedded Redis in {data}: {exc}") from exc
    run_as_batch(server.process.pid)     # ready, so its threads are all there
    tune_redis(server.url)
    return server


def tune_redis(url: str) -> None:
    """Keep subscription hashes compact: with Redis's default 64-byte limit a long callback URL
    or an encrypted secret turns a ~450-byte hash into a ~1,450-byte hashtable."""
    client = redis_clients.sync_client(url, 1)
    try:
        client.config_set("hash-max-ziplist-value", HASH_MAX_VALUE)  # = hash-max-listpack-value in Redis 7
    finally:
        client.close()


async def _serve(app: web.Application, sock: socket.socket, settings: HubSettings, children: Children,
                 redis_server: RedisServer | None, announce: Callable[[str], None]) -> None:
    # aiohttp closes a connection that has not sent a whole request within keepalive_timeout of
    # connecting (or of its last answer): the header deadline against trickling clients
    runner = web.AppRunner(app, handle_signals=False, access_log=None, keepalive_timeout=settings.header_timeout)
    await runner.setup()  # runs the app's startup: Redis reachable, secret key matches
    site = web.SockSite(runner, sock)
    await site.start()
    stop = eventloop.stop_on_signals()
    shown = redacted(str(settings.redis_url))    # the data password stays out of logs
    where = f"{settings.data_path} (Redis {shown}, AOF)" if redis_server else f"Redis at {shown}"
    announce(f"rsnotify hub serving at {settings.hub_url}\n"
             f"  listening on {settings.host}:{settings.port}\n"
             f"  data: {where}\n"
             f"  secret key: {'from settings' if settings.secret_key else settings.data_path / 'secret.key'}\n"
             f"  workers: {settings.workers}\n"
             f"Press Ctrl-C to stop.")
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SUPERVISE_INTERVAL)
            if redis_server is not None and redis_server.process.poll() is not None:
                # an error, so the exit status says it: a service manager restarts a failed hub
                raise EmbeddedError(f"the embedded Redis exited with status {redis_server.process.returncode}; "
                                    f"the hub stopped (its data is in {settings.data_path})")
            children.replace_dead()
    finally:
        announce("rsnotify hub stopping…")
        await runner.cleanup()

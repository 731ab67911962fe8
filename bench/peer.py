"""--peer: the fan-out scenario against Flask-WebSub's hub (Flask + Celery on a Redis broker, one
Celery task per delivery, SQLite subscriptions), installed from PyPI into bench/.peer.

Flask-WebSub takes only thin pings: each `hub.mode=publish` makes a task fetch the topic (the
sinks serve it, one new notification per fetch, with the sequence headers it relays) and queue
one delivery task per subscriber. It promises no order, so order is reported but not required.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
import venv
from pathlib import Path

import aiohttp

from rsnotify.hub.redis_server import RedisServer, free_port, start_redis_server

from . import checks
from .procstat import CpuMeter
from .scenarios import Bench, wait_and_check

HERE = Path(__file__).resolve().parent
PEER_DIR = HERE / ".peer"
PEER_PACKAGES = ("flask-websub", "celery[redis]", "packaging")
# Celery prefork processes (--peer-concurrency). Its deliveries are blocking `requests` calls, but
# it is CPU-bound here (~2.4 ms of CPU per delivery, both cores busy): 4, 8 and 16 processes gave
# 445, 430-560 and 485-610 deliveries/s on the 2-core machine, so 16, its best by a little.
PEER_CONCURRENCY = 16
START_TIMEOUT = 60.0


class PeerUnavailable(Exception):
    """Flask-WebSub could not be installed or started."""


def peer_python() -> Path:
    """bench/.peer/bin/python, creating the venv and installing Flask-WebSub into it if needed."""
    python = PEER_DIR / "bin" / "python"
    marker = PEER_DIR / ".installed"
    wanted = " ".join(PEER_PACKAGES) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    try:
        venv.create(PEER_DIR, with_pip=True, clear=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEER_PACKAGES],
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PeerUnavailable(f"cannot create {PEER_DIR}: {exc}") from None
    if done.returncode != 0:
        raise PeerUnavailable(f"pip could not install {' '.join(PEER_PACKAGES)}: {done.stderr.strip()[-500:]}")
    marker.write_text(wanted)
    return python


class PeerHub:
    """Flask-WebSub's web process, its Celery worker and a private Redis broker."""

    def __init__(self, python: Path, concurrency: int = PEER_CONCURRENCY) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="rsnb-peer-", dir="/tmp"))
        self.redis: RedisServer = start_redis_server(self.folder / "redis", unix_socket=False)
        self.db = self.folder / "hub.sqlite"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hub"
        env = {**os.environ, "PEER_BROKER": self.redis.url, "PEER_DB": str(self.db)}
        log = open(self.folder / "peer.log", "wb")
        self.web = subprocess.Popen([str(python), "peer_app.py", str(self.port)], cwd=HERE, env=env,
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.worker = subprocess.Popen([str(python), "-m", "celery", "-A", "peer_app:celery", "worker", "--loglevel", "WARNING",
                                        "--concurrency", str(concurrency), "--pool", "prefork",
                                        "--without-gossip", "--without-mingle", "--without-heartbeat"],
                                       cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)

    async def wait_ready(self, session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.web.poll() is not None or self.worker.poll() is not None:
                break
            try:
                async with session.post(self.url, data={"hub.mode": "nothing", "hub.topic": "x"}) as response:
                    if response.status == 400:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
        raise PeerUnavailable(f"Flask-WebSub's hub did not start; its log:\n{self.log_tail()}")

    def subscriptions(self) -> int:
        if not self.db.exists():
            return 0
        with sqlite3.connect(self.db) as connection:
            return connection.execute("select count(*) from hub").fetchone()[0]

    def pids(self) -> list[int]:
        out = [self.web.pid, self.worker.pid]
        for task in Path(f"/proc/{self.worker.pid}/task").glob("*"):
            try:
                out += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                pass
        return out

    def log_tail(self, lines: int = 20) -> str:
        path = self.folder / "peer.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        for process in (self.worker, self.web):
            if process.poll() is None:
                process.terminate()
        for process in (self.worker, self.web):
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.redis.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


async def scenario_peer(bench: Bench, ours: list[dict], concurrency: int = PEER_CONCURRENCY) -> list[dict]:
    s = bench.sizes
    try:
        python = await asyncio.to_thread(peer_python)
        peer = PeerHub(python, concurrency)
    except PeerUnavailable as exc:
        bench.emit({"scenario": "peer", "run": 0, "skipped": str(exc), "check": {"ok": True}})
        return []
    try:
        await peer.wait_ready(bench.session)
        tag = bench.tag()
        topic = f"{bench.sink.base}/topic/peer-{tag}"
        names = [f"peer-{tag}-{i}" for i in range(s.peer_subscribers)]
        await _subscribe(bench, peer, topic, names)
        ours_rate = checks.median_of(ours, "rate")
        published = 0

        async def run_once(count: int) -> tuple[list[int], float, dict]:
            nonlocal published
            await bench.sink.reset(bench.session)
            cpu = CpuMeter({"peer": peer.pids(), "sinks": [bench.sink.pid], "bench": [0]})
            started = time.time()
            for _ in range(count):
                async with bench.session.post(peer.url, data={"hub.mode": "publish", "hub.topic": topic}) as response:
                    if response.status != 202:
                        raise PeerUnavailable(f"Flask-WebSub refused a ping: {response.status} {await response.text()}")
            seqs = list(range(published + 1, published + count + 1))
            published += count
            _, result = await wait_and_check(bench, {n: seqs for n in names}, started)
            return seqs, started, {**result, "cpu": cpu.done()}

        await run_once(1)  # warm-up: Celery's processes import and connect
        results = []
        for run in range(1, s.runs + 1):
            _, _, result = await run_once(s.peer_notifications)
            check = result["check"]
            order_kept = check["out_of_order"] == 0
            check["ok"] = not (check["missing"] or check["duplicates"] or check["unexpected"])
            result.update(scenario="peer", run=run, subscribers=len(names), notifications=s.peer_notifications,
                          order_kept=order_kept, ours_rate=ours_rate, concurrency=concurrency,
                          ratio=round(ours_rate / result["rate"], 2) if result["rate"] and ours_rate == ours_rate
                          else None)
            bench.emit(result)
            results.append(result)
        return results
    except PeerUnavailable as exc:
        bench.emit({"scenario": "peer", "run": 0, "skipped": str(exc), "check": {"ok": True}})
        return []
    finally:
        peer.stop()


async def _subscribe(bench: Bench, peer: PeerHub, topic: str, names: list[str]) -> None:
    pending = iter(names)

    async def one_by_one() -> None:
        for name in pending:
            form = {"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": bench.sink.url(name),
                    "hub.lease_seconds": "86400"}
            async with bench.session.post(peer.url, data=form) as response:
                if response.status != 202:
                    raise PeerUnavailable(f"Flask-WebSub refused a subscription: {response.status}; "
                                          f"its log:\n{peer.log_tail()}")

    await asyncio.gather(*(one_by_one() for _ in range(min(16, len(names)))))
    deadline = time.monotonic() + bench.timeout
    while peer.subscriptions() < len(names):
        if time.monotonic() > deadline:
            raise PeerUnavailable(f"only {peer.subscriptions()} of {len(names)} subscriptions became active at "
                                  f"Flask-WebSub; its log:\n{peer.log_tail()}")
        await asyncio.sleep(0.2)

"""Scale-out, proven with real processes: two `rsnotify hub --redis-url … --workers 0` web
processes and two `rsnotify worker` processes on one Redis. Subscribe through one web process,
publish through the other, SIGKILL the worker that is delivering in the middle of a POST, and
every notification still arrives, in order (at-least-once: the one in flight may come twice)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from cryptography.fernet import Fernet

from rsnotify.websub import SEQUENCE_HEADER

from .conftest import TOPIC, body

RSNOTIFY = [sys.executable, "-c", "from rsnotify.cli import main; main()"]
NOTIFICATIONS = 40
PUBLIC_URL = "http://hub.rsnotify.test/"
GATE_AT = 10            # the subscriber holds its answer to this POST until the worker is killed


class GatedSubscriber:
    """A loopback subscriber in its own thread: echoes challenges, records each POST's sequence,
    and holds the answer to POST number GATE_AT until `gate` is set."""

    def __init__(self) -> None:
        self.sequences: list[int] = []
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate_reached = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.base = ""

    async def handle(self, request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.Response(text=request.query.get("hub.challenge", ""))
        await request.read()
        with self.lock:
            self.sequences.append(int(request.headers[SEQUENCE_HEADER]))
            count = len(self.sequences)
        if count == GATE_AT:
            self.gate_reached.set()
            while not self.gate.is_set():
                await asyncio.sleep(0.02)
        return web.Response(status=204)

    def start(self) -> None:
        ready = threading.Event()

        async def serve() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self.handle)
            self.runner = web.AppRunner(app, shutdown_timeout=0.1)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
            ready.set()

        self.thread = threading.Thread(target=lambda: (self.loop.run_until_complete(serve()), self.loop.run_forever()),
                                       daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def stop(self) -> None:
        self.gate.set()
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Processes:
    """Processes this test started; stopped (by pid) at the end, killed if they linger."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        with open(log, "w") as handle:      # the child keeps its own copy of the descriptor
            process = subprocess.Popen(RSNOTIFY + args, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    yield started
    started.stop_all()


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def listening_port(log: Path, process: subprocess.Popen) -> int:
    """The port a `rsnotify hub --port 0` process announced ("listening on HOST:PORT")."""
    found: list[int] = []

    def announced() -> bool:
        assert process.poll() is None, log.read_text()
        for line in log.read_text().splitlines():
            if "listening on" in line:
                found.append(int(line.rsplit(":", 1)[1]))
                return True
        return False

    wait_for(announced, 30, f"the hub to start ({log})")
    return found[0]


def http(method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_two_web_processes_two_workers_one_killed_mid_delivery(redis_url: str, tmp_path: Path, processes) -> None:
    subscriber = GatedSubscriber()
    subscriber.start()
    try:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RSNOTIFY_")},
               "RSNOTIFY_REDIS_URL": redis_url, "RSNOTIFY_SECRET_KEY": Fernet.generate_key().decode(),
               "RSNOTIFY_LOCK_TTL": "2", "RSNOTIFY_RECONCILE_INTERVAL": "0.5", "RSNOTIFY_RETRY_BASE": "0.1",
               # one public URL for every process, as behind a load balancer: publishers name it in rel="hub"
               "RSNOTIFY_PUBLIC_URL": PUBLIC_URL}
        webs = []
        for name in ("web-a", "web-b"):
            log = tmp_path / f"{name}.log"
            process = processes.start(["hub", "--workers", "0", "--port", "0", "--data-dir", str(tmp_path / name)],
                                      env, log)
            webs.append(f"http://127.0.0.1:{listening_port(log, process)}/")
        worker_a = processes.start(["worker", "--name", "worker-a"], env, tmp_path / "worker-a.log")

        callback = subscriber.base + "/scaled"
        form = urllib.parse.urlencode({"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": callback}).encode()
        assert http("POST", webs[0], form, {"Content-Type": "application/x-www-form-urlencoded"})[0] == 202

        def subscribed_seen_by_web_b() -> bool:
            status, answer = http("GET", webs[1] + "admin/subscriptions")
            return status == 200 and json.loads(answer)["total"] == 1
        wait_for(subscribed_seen_by_web_b, 30, "the subscription to be verified")

        link = f'<{TOPIC}>; rel="self", <{PUBLIC_URL}>; rel="hub"'
        for n in range(1, NOTIFICATIONS + 1):
            status, answer = http("POST", webs[1], body(n), {"Content-Type": "application/xml", "Link": link})
            assert status == 200, answer
            assert json.loads(answer)["sequence"] == n

        assert subscriber.gate_reached.wait(30), (tmp_path / "worker-a.log").read_text()
        worker_b = processes.start(["worker", "--name", "worker-b"], env, tmp_path / "worker-b.log")

        def two_workers() -> bool:
            status, answer = http("GET", webs[0] + "health")
            return status == 200 and json.loads(answer)["workers"] == 2
        wait_for(two_workers, 30, "worker-b to start")
        worker_a.send_signal(signal.SIGKILL)           # mid-POST: worker-a is waiting for our answer
        worker_a.wait(10)
        subscriber.gate.set()

        wait_for(lambda: set(subscriber.sequences) >= set(range(1, NOTIFICATIONS + 1)), 60,
                 "every notification to arrive after the kill")
        assert worker_b.poll() is None
    finally:
        subscriber.stop()

    received = subscriber.sequences
    highest = 0
    for seq in received:            # in order: never ahead of the next one due (repeats allowed)
        assert seq <= highest + 1, f"{seq} arrived before {highest + 1}: {received}"
        highest = max(highest, seq)
    first_arrivals = list(dict.fromkeys(received))
    assert first_arrivals == list(range(1, NOTIFICATIONS + 1))
    assert received.count(GATE_AT) >= 2          # the one in flight at the kill came again
    assert len(received) <= NOTIFICATIONS + 10   # re-sent from the last checkpoint, not from the start

"""Helpers of the delivery engine's tests: notifications, the hub's HTTP API, subscriber servers
(well-behaved, failing, hanging, black holes that accept TCP and never answer; each in a thread
of its own, so the tests stay plain sync functions), and the hub's worker processes."""
from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange
from rsnotify.websub import SEQUENCE_HEADER, build_link_header
from rsnotify.xml import to_xml

FORM_TYPE = "application/x-www-form-urlencoded"


def notification(index: int, site: str = "http://source.example.org") -> bytes:
    """A valid change notification, different for each `index`."""
    at = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(minutes=index)
    change = ResourceChange(loc=f"{site}/res/{index}", change=ChangeType.UPDATED, changed_at=at)
    return to_xml(ChangeNotification(from_time=at, until_time=at + timedelta(seconds=1), changes=(change,)))


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `condition` until it returns something true; AssertionError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 30.0) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of one request; HTTP errors are answers too."""
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def subscribe(hub_url: str, topic: str, callback: str, *, lease_seconds: int = 86400, **extra: str) -> None:
    """A subscribe request (202 expected); `extra` adds form fields, e.g. rsnotify.replay_from."""
    form = urllib.parse.urlencode({"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": callback,
                                   "hub.lease_seconds": str(lease_seconds), **extra}).encode()
    status, body, _ = http("POST", hub_url, form, {"Content-Type": FORM_TYPE})
    assert status == 202, body


def active_subscriptions(hub_url: str) -> int:
    """How many subscriptions the hub counts as verified and active (GET /health)."""
    _, body, _ = http("GET", hub_url.rstrip("/") + "/health")
    return int(json.loads(body)["subscriptions"])


def publish(hub_url: str, topic: str, body: bytes, **headers: str) -> dict[str, Any]:
    """One ResourceSync submission from loopback; the hub's JSON answer (200 expected)."""
    links = build_link_header([(topic, "self"), (hub_url, "hub")])
    extra = {name.replace("_", "-"): value for name, value in headers.items()}
    status, answer, _ = http("POST", hub_url, body, {"Content-Type": "application/xml", "Link": links, **extra})
    assert status == 200, answer
    return json.loads(answer)


def admin(hub_url: str, path: str, method: str = "GET") -> Any:
    """One admin API call from loopback (state changes as JSON, as a browser could not send them)."""
    body, headers = (b"{}", {"Content-Type": "application/json"}) if method != "GET" else (None, {})
    status, body, _ = http(method, hub_url.rstrip("/") + path, body, headers)
    assert status == 200, f"{method} {path}: {status} {body[:300]!r}"
    return json.loads(body)


@dataclass
class Callbacks:
    """Loopback subscribers on one port. Verification GETs echo the challenge; a POST to a path
    is answered as `answers[path]` says: an int status (default 200), or "hang" (held open until
    the hub gives up). `got[path]` lists the sequence numbers received with a 2xx, in order."""

    base: str = ""
    answers: dict[str, Any] = field(default_factory=dict)
    got: dict[str, list[int]] = field(default_factory=dict)
    times: dict[str, list[float]] = field(default_factory=dict)     # epoch s of each entry of `got`
    posts: dict[str, int] = field(default_factory=dict)
    hanging: int = 0              # POSTs held open right now
    hung_up: int = 0              # held POSTs the hub gave up on
    verified: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return self.base + path

    def received(self, path: str) -> list[int]:
        with self.lock:
            return list(self.got.get(path, []))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            with self.lock:
                self.verified.append(request.path)
            return web.Response(text=request.query.get("hub.challenge", ""))
        await request.read()
        answer = self.answers.get(request.path, 200)
        with self.lock:
            self.posts[request.path] = self.posts.get(request.path, 0) + 1
            if answer == "hang":
                self.hanging += 1
        if answer == "hang":
            try:
                await asyncio.Event().wait()
            finally:
                with self.lock:
                    self.hanging -= 1
                    self.hung_up += 1
        status = answer(self.posts[request.path]) if callable(answer) else answer
        if 200 <= status < 300:
            with self.lock:
                self.got.setdefault(request.path, []).append(int(request.headers[SEQUENCE_HEADER]))
                self.times.setdefault(request.path, []).append(time.time())
        return web.Response(status=status)


class ServerThread:
    """An event loop in a daemon thread serving one aiohttp app or one raw TCP handler on 127.0.0.1."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.closers: list[Callable[[], Any]] = []

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(20)

    def stop(self) -> None:
        for close in reversed(self.closers):
            self.run(close())
        self.run(_cancel_the_rest())            # connections still held (black holes, hanging POSTs)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()                   # else "unclosed event loop" when it is collected


async def _cancel_the_rest() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class BlackHole:
    """Callbacks on a port that accepts TCP and never answers (reads and discards what comes)."""

    base: str = ""
    open: int = 0                 # connections held right now
    closed: int = 0               # connections the hub gave up on

    def url(self, path: str) -> str:
        return self.base + path


def worker_pids(hub_pid: int) -> list[int]:
    """The `rsnotify worker` children of a hub process (read from /proc)."""
    pids = []
    for task in Path(f"/proc/{hub_pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in children:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"worker" in cmdline:
                pids.append(int(pid))
    return pids


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

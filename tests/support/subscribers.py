"""A recording WebSub subscriber on 127.0.0.1: answers the hub's verification GET by echoing
hub.challenge, answers deliveries 200, and records every request with its headers. A test makes
a path answer otherwise with `on(path, answer)`.

One recorder, two ways to serve it: in the test's own loop (`app()` given to pytest-aiohttp's
`aiohttp_server`, for async tests) or from a thread (`serve_in_thread()`, for sync tests whose
main thread blocks on a hub process or a burst worker)."""
from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from .servers import ThreadedServer

# What an answer gives back: a response, or just a status (with an empty body).
Reply = web.StreamResponse | int
Answer = int | Callable[[web.Request], Reply | Awaitable[Reply]]

MAX_BODY = 64 * 1024 * 1024     # big documents (50,000 changes) must arrive whole


@dataclass(frozen=True)
class Recorded:
    """One request the subscriber got."""

    method: str
    path: str
    query: dict[str, str]
    raw_query: str
    body: bytes
    headers: dict[str, str]
    at: float                       # time.time() when it arrived


class RecordingSubscriber:
    """Records every request (safe to read from any thread); `url(path)` is a callback URL."""

    def __init__(self, default_status: int = 200) -> None:
        self.base = ""                                  # http://127.0.0.1:PORT once served
        self.default_status = default_status
        self.answers: dict[tuple[str, str | None], Answer] = {}
        self._requests: list[Recorded] = []
        self._lock = threading.Lock()

    def url(self, path: str = "/callback") -> str:
        return self.base + path

    def on(self, path: str, answer: Answer, method: str | None = "POST") -> None:
        """Answer requests to `path` (deliveries by default; method=None: every method) with a
        status, or with `answer(request)` (a response or a status, or an awaitable of either)."""
        self.answers[(path, method)] = answer

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    def seen(self, path: str | None = None, method: str | None = None) -> list[Recorded]:
        return [r for r in self.requests if (path is None or r.path == path) and (method is None or r.method == method)]

    def verifications(self, path: str | None = None) -> list[Recorded]:
        """The hub's GETs (intent verification, denials, diagnostics)."""
        return self.seen(path, "GET")

    def deliveries(self, path: str | None = None) -> list[Recorded]:
        return self.seen(path, "POST")

    def bodies(self, path: str | None = None) -> list[bytes]:
        return [r.body for r in self.deliveries(path)]

    def count(self, path: str) -> int:
        """Deliveries to `path` so far (inside an answer: this one included)."""
        return len(self.deliveries(path))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        recorded = Recorded(request.method, request.path, dict(request.query), request.rel_url.raw_query_string,
                            body, dict(request.headers), time.time())
        with self._lock:
            self._requests.append(recorded)
        answer = self.answers.get((request.path, request.method), self.answers.get((request.path, None)))
        if answer is None:
            if request.method == "GET":
                return web.Response(text=request.query.get("hub.challenge", ""))
            return web.Response(status=self.default_status)
        reply = answer(request) if callable(answer) else answer
        if inspect.isawaitable(reply):
            reply = await reply
        return web.Response(status=reply) if isinstance(reply, int) else reply

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def serve_in_thread(self, host: str = "127.0.0.1") -> ThreadedServer:
        """Serve from a background thread (on `host`, a loopback address); stop the returned
        server when done."""
        server = ThreadedServer(self.app(), host=host).start()
        self.base = server.base
        return server


def hang(seconds: float, status: int = 200) -> Callable[[web.Request], Awaitable[int]]:
    """An answer that takes `seconds` (a slow or stuck subscriber), then gives `status`."""
    async def answer(request: web.Request) -> int:
        await asyncio.sleep(seconds)
        return status
    return answer

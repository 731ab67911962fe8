"""The subscriber sinks: one aiohttp server in a process of its own, serving many callback paths.

`GET /cb/{name}` answers WebSub verifications (echoes hub.challenge); `POST /cb/{name}` records
a delivery (notification id, sequence, receive time) and answers 200; `GET /topic/{name}` is a
topic for thin pings (its next notification on each fetch). Control endpoints under
`/_` let the benchmark read and reset what was recorded. Run as `python -m bench.sinks`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from rsnotify.websub import NOTIFICATION_ID_HEADER, SEQUENCE_HEADER, build_link_header

from .children import listen, start_child, stop_child
from .payloads import notification_body

CALLBACK_PREFIX = "/cb/"
READY_LINE = "sinks listening on port "


@dataclass
class Recorder:
    """Deliveries per callback path, in receive order: sequence, notification id, receive time."""

    seqs: defaultdict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    ids: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    times: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    deliveries: int = 0
    verifications: int = 0
    bad_requests: int = 0
    last_verification: float = 0.0

    def snapshot(self) -> dict:
        return {"deliveries": self.deliveries, "verifications": self.verifications,
                "bad_requests": self.bad_requests, "last_verification": self.last_verification,
                "paths": {p: {"seq": self.seqs[p], "id": self.ids[p], "t": self.times[p]} for p in self.seqs}}


def build_sink_app() -> web.Application:
    recorder = Recorder()
    clock = time.time

    async def deliver(request: web.Request) -> web.Response:
        await request.read()
        headers = request.headers
        seq_text = headers.get(SEQUENCE_HEADER)
        nid = headers.get(NOTIFICATION_ID_HEADER)
        name = request.path[len(CALLBACK_PREFIX):]
        if seq_text is None or nid is None:
            recorder.bad_requests += 1  # counted: a delivery without the headers fails the check
            return web.Response(status=400, text="missing sequence or notification id header\n")
        recorder.seqs[name].append(int(seq_text))
        recorder.ids[name].append(nid)
        recorder.times[name].append(clock())
        recorder.deliveries += 1
        return web.Response()

    async def verify(request: web.Request) -> web.Response:
        recorder.verifications += 1
        recorder.last_verification = clock()
        return web.Response(text=request.query.get("hub.challenge", ""))

    topics: defaultdict[str, int] = defaultdict(int)
    topic_body = notification_body(0)

    async def topic(request: web.Request) -> web.Response:
        """A topic for thin pings (the peer hub fetches it): each GET is the topic's next notification."""
        name = request.match_info["name"]
        topics[name] += 1
        seq = topics[name]
        links = build_link_header([(str(request.url), "self"), (request.query.get("hub", "http://127.0.0.1/"), "hub")])
        return web.Response(body=topic_body, content_type="application/xml",
                            headers={"Link": links, NOTIFICATION_ID_HEADER: f"{name}-{seq}", SEQUENCE_HEADER: str(seq)})

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"deliveries": recorder.deliveries, "verifications": recorder.verifications,
                                  "bad_requests": recorder.bad_requests,
                                  "last_verification": recorder.last_verification})

    async def records(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(recorder.snapshot()), content_type="application/json")

    async def reset(request: web.Request) -> web.Response:
        nonlocal recorder
        recorder = Recorder()
        return web.Response(text="reset\n")

    app = web.Application()
    app.router.add_post(CALLBACK_PREFIX + "{name:.+}", deliver)
    app.router.add_get(CALLBACK_PREFIX + "{name:.+}", verify)
    app.router.add_get("/topic/{name}", topic)
    app.router.add_get("/_count", count)
    app.router.add_get("/_records", records)
    app.router.add_post("/_reset", reset)
    return app


def _main() -> None:
    parser = argparse.ArgumentParser(description="benchmark subscriber sinks")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()

    async def serve() -> None:
        port = await listen(build_sink_app(), args.host, args.port)
        print(f"{READY_LINE}{port}", flush=True)
        await asyncio.Event().wait()

    try:
        import uvloop  # same loop for sinks whether or not the hub uses it: the ceiling stays fair
        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


# --- the benchmark's side --------------------------------------------------------------------


class SinkProcess:
    """A sink server started as a child process; `url(name)` is a callback URL it serves."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.process, self.port = start_child("bench.sinks", host, READY_LINE, int, "sink server")
        self.base = f"http://{host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, name: str) -> str:
        return f"{self.base}{CALLBACK_PREFIX}{name}"

    async def count(self, session: aiohttp.ClientSession) -> dict:
        async with session.get(f"{self.base}/_count") as response:
            return await response.json()

    async def records(self, session: aiohttp.ClientSession) -> dict:
        async with session.get(f"{self.base}/_records") as response:
            return await response.json(loads=json.loads)

    async def reset(self, session: aiohttp.ClientSession) -> None:
        async with session.post(f"{self.base}/_reset") as response:
            response.raise_for_status()

    async def wait_deliveries(self, session: aiohttp.ClientSession, expected: int, *, timeout: float,
                              poll: float = 0.02, stall: float = 15.0) -> tuple[int, bool]:
        """Poll until `expected` deliveries arrived; (count, complete). Gives up after `timeout`
        seconds, or `stall` seconds without progress."""
        deadline = time.monotonic() + timeout
        last, last_change = -1, time.monotonic()
        while True:
            seen = (await self.count(session))["deliveries"]
            now = time.monotonic()
            if seen >= expected:
                return seen, True
            if seen != last:
                last, last_change = seen, now
            if now > deadline or now - last_change > stall:
                return seen, False
            await asyncio.sleep(poll)

    def stop(self) -> None:
        stop_child(self.process)


if __name__ == "__main__":
    _main()

"""The plain aiohttp programs that bound the hub's ingest, verification and relay figures: what
this machine does with the least work each scenario needs, measured in the same invocation as
the scenario (`python -m bench.ceilings --host H --redis-url URL`, started by CeilingServer).

- POST /ingest: read the body, parse it with lxml, one XADD to the hub's Redis, answer 200
  with the entry's sequence (the hub's JSON answer has the same shape, so the same client runs);
- POST /verify: a subscribe form; GET its callback with a challenge, compare the echo, one
  HSET, answer 202 (the hub answers 202 first and verifies later: here the 202 says it is done);
- POST /relay: answer 200 with a sequence, then forward the body to every callback set with
  POST /_callbacks at once (the latency scenario's subscribers), with the delivery headers,
  each callback's notifications in publish order (the hub's promise, so the same check holds).

No checks, no limits, no retries, no cursor: a floor of work, not a hub.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import secrets
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web
from lxml import etree
from redis.asyncio import Redis

from .children import start_child, stop_child
from .payloads import delivery_headers

READY_LINE = "ceilings listening on port "
STREAM = "rsnotify-bench:ceiling:log"
SUBSCRIPTIONS = "rsnotify-bench:ceiling:subscriptions"
STREAM_MAX = 10_000


def build_ceiling_app(redis: Redis) -> web.Application:
    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    sequences = itertools.count(1)
    callbacks: list[str] = []
    turns: collections.defaultdict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
    pending: set[asyncio.Task[None]] = set()

    async def ingest(request: web.Request) -> web.Response:
        body = await request.read()
        etree.fromstring(body, parser)
        entry_id = await redis.xadd(STREAM, {"body": body}, maxlen=STREAM_MAX, approximate=True)
        nid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        return web.json_response({"notification_id": nid, "sequence": next(sequences)})

    async def verify(request: web.Request) -> web.Response:
        form = dict(parse_qsl((await request.read()).decode()))
        challenge = secrets.token_urlsafe(32)
        query = {"hub.mode": "subscribe", "hub.topic": form["hub.topic"], "hub.challenge": challenge,
                 "hub.lease_seconds": form.get("hub.lease_seconds", "86400")}
        async with session.get(form["hub.callback"], params=query, allow_redirects=False) as answer:
            echoed = await answer.text()
        if answer.status != 200 or echoed != challenge:
            return web.Response(status=409, text="the callback did not echo the challenge\n")
        await redis.hset(SUBSCRIPTIONS, form["hub.callback"], form["hub.topic"])
        return web.Response(status=202, text="verified\n")

    async def relay(request: web.Request) -> web.Response:
        body = await request.read()
        sequence = next(sequences)
        nid = f"relay-{sequence}"
        task = asyncio.get_running_loop().create_task(forward(body, nid, sequence))
        pending.add(task)
        task.add_done_callback(pending.discard)
        return web.json_response({"notification_id": nid, "sequence": sequence})

    async def forward(body: bytes, nid: str, sequence: int) -> None:
        headers = delivery_headers("http://bench.example.org/relay", "http://127.0.0.1/", nid, sequence)

        async def one(url: str) -> None:
            # one callback's notifications in order, as the hub sends them (asyncio locks are FIFO)
            async with turns[url], session.post(url, data=body, headers=headers) as answer:
                await answer.read()

        await asyncio.gather(*(one(url) for url in callbacks), return_exceptions=True)

    async def set_callbacks(request: web.Request) -> web.Response:
        callbacks[:] = (await request.json())["callbacks"]
        return web.Response(text="ok\n")

    session: aiohttp.ClientSession

    async def client_session(app: web.Application):  # type: ignore[no-untyped-def]
        nonlocal session
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512))
        yield
        await session.close()
        await redis.aclose()

    app = web.Application(client_max_size=8 << 20)
    app.cleanup_ctx.append(client_session)
    app.router.add_post("/ingest", ingest)
    app.router.add_post("/verify", verify)
    app.router.add_post("/relay", relay)
    app.router.add_post("/_callbacks", set_callbacks)
    return app


def _main() -> None:
    parser = argparse.ArgumentParser(description="the benchmark's ceiling programs")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--redis-url", required=True)
    args = parser.parse_args()

    async def serve() -> None:
        runner = web.AppRunner(build_ceiling_app(Redis.from_url(args.redis_url)), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, args.host, 0, backlog=4096)
        await site.start()
        print(f"{READY_LINE}{runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    import uvloop  # the hub's processes run uvloop too: the comparison is of the work, not the loop

    try:
        uvloop.run(serve())
    except KeyboardInterrupt:
        pass


class CeilingServer:
    """The ceiling programs in a child process, on the Redis at `redis_url` (the hub's own)."""

    def __init__(self, redis_url: str, host: str = "127.0.0.1") -> None:
        self.process, port = start_child("bench.ceilings", host, READY_LINE, int, "ceiling server",
                                         args=("--redis-url", redis_url))
        self.base = f"http://{host}:{port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, what: str) -> str:
        """The URL of one ceiling: 'ingest', 'verify' or 'relay'."""
        return f"{self.base}/{what}"

    async def set_callbacks(self, session: aiohttp.ClientSession, callbacks: list[str]) -> None:
        async with session.post(f"{self.base}/_callbacks", data=json.dumps({"callbacks": callbacks})) as answer:
            answer.raise_for_status()

    def stop(self) -> None:
        stop_child(self.process)


if __name__ == "__main__":
    _main()

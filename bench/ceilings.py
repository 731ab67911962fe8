"""The plain aiohttp programs that bound the hub's ingest, verification and relay figures: what
this machine does with the least work each scenario needs, measured in the same invocation as
the scenario (`python -m bench.ceilings --host H --redis-url URL`, started by CeilingServer).

- POST /ingest: read the body, parse it with lxml, one XADD to the hub's Redis, answer 200
  with the entry's sequence (the hub's JSON answer has the same shape, so the same client runs);
- POST /verify: a subscribe form; GET its callback with a challenge, compare the echo, one
  HSET, answer 202 (the hub answers 202 first and verifies later: here the 202 says it is done);
- POST /relay: answer 200 with a sequence, then forward the body to every callback set with
  POST /_callbacks at once (the latency scenario's subscribers), with the delivery headers,
  each callback's notifications in publish order (the hub's promise, so the same check holds);
  with several relay processes (as many as the hub has workers) the first also hands the body
  to the others (POST /relay-part), each of which forwards it to its share of the callbacks.

No checks, no limits, no retries, no cursor: a floor of work, not a hub.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import secrets
import subprocess
from urllib.parse import parse_qsl

import aiohttp
from aiohttp import web
from lxml import etree
from redis.asyncio import Redis

from rsnotify.websub import NOTIFICATION_ID_HEADER, SEQUENCE_HEADER

from .children import listen, start_child, stop_child
from .payloads import delivery_headers

READY_LINE = "ceilings listening on port "
STREAM = "rsnotify-bench:ceiling:log"
SUBSCRIPTIONS = "rsnotify-bench:ceiling:subscriptions"
STREAM_MAX = 10_000


def build_ceiling_app(redis: Redis) -> web.Application:
    parser = etree.XMLParser(resolve_entities=False, no_network=True)
    sequences = itertools.count(1)
    callbacks: list[str] = []
    peers: list[str] = []
    queues: dict[str, asyncio.Queue[tuple[bytes, dict[str, str]]]] = {}
    senders: set[asyncio.Task[None]] = set()

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
        for peer in peers:   # the other relay processes forward their share (the hub's hop via Redis)
            queue_for(f"{peer}/relay-part").put_nowait((body, {NOTIFICATION_ID_HEADER: nid,
                                                              SEQUENCE_HEADER: str(sequence)}))
        forward(body, nid, sequence)
        return web.json_response({"notification_id": nid, "sequence": sequence})

    async def relay_part(request: web.Request) -> web.Response:
        body = await request.read()
        forward(body, request.headers[NOTIFICATION_ID_HEADER], int(request.headers[SEQUENCE_HEADER]))
        return web.Response()

    def forward(body: bytes, nid: str, sequence: int) -> None:
        headers = delivery_headers("http://bench.example.org/relay", "http://127.0.0.1/", nid, sequence)
        for url in callbacks:
            queue_for(url).put_nowait((body, headers))

    def queue_for(url: str) -> asyncio.Queue[tuple[bytes, dict[str, str]]]:
        """One sender per destination, its POSTs one after another: each callback gets its
        notifications in order, as the hub sends them."""
        queue = queues.get(url)
        if queue is None:
            queue = queues[url] = asyncio.Queue()
            senders.add(asyncio.get_running_loop().create_task(send_all(url, queue)))
        return queue

    async def send_all(url: str, queue: asyncio.Queue[tuple[bytes, dict[str, str]]]) -> None:
        while True:
            body, headers = await queue.get()
            try:
                async with session.post(url, data=body, headers=headers) as answer:
                    await answer.read()
            except aiohttp.ClientError:
                pass          # the delivery check counts what is missing

    async def set_callbacks(request: web.Request) -> web.Response:
        wanted = await request.json()
        callbacks[:] = wanted["callbacks"]
        peers[:] = wanted.get("peers", [])
        return web.Response(text="ok\n")

    session: aiohttp.ClientSession

    async def client_session(app: web.Application):  # type: ignore[no-untyped-def]
        nonlocal session
        # as lean as the hub's worker session: no cookie jar, no decompression
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512), auto_decompress=False,
                                        cookie_jar=aiohttp.DummyCookieJar())
        yield
        for sender in senders:
            sender.cancel()
        await session.close()
        await redis.aclose()

    app = web.Application(client_max_size=8 << 20)
    app.cleanup_ctx.append(client_session)
    app.router.add_post("/ingest", ingest)
    app.router.add_post("/verify", verify)
    app.router.add_post("/relay", relay)
    app.router.add_post("/relay-part", relay_part)
    app.router.add_post("/_callbacks", set_callbacks)
    return app


def _main() -> None:
    parser = argparse.ArgumentParser(description="the benchmark's ceiling programs")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--redis-url", required=True)
    args = parser.parse_args()

    async def serve() -> None:
        port = await listen(build_ceiling_app(Redis.from_url(args.redis_url)), args.host)
        print(f"{READY_LINE}{port}", flush=True)
        await asyncio.Event().wait()

    import uvloop  # the hub's processes run uvloop too: the comparison is of the work, not the loop

    try:
        uvloop.run(serve())
    except KeyboardInterrupt:
        pass


class CeilingServer:
    """The ceiling programs in `processes` child processes, on the Redis at `redis_url` (the
    hub's own). Ingest and verification run in the first (the hub parses and stores in one web
    process too); the relay forwards from all of them, each to its share of the callbacks, as the
    hub's workers share a topic's subscriptions."""

    def __init__(self, redis_url: str, host: str = "127.0.0.1", processes: int = 1) -> None:
        self.children: list[subprocess.Popen[str]] = []
        self.bases: list[str] = []
        try:
            for _ in range(max(1, processes)):
                process, port = start_child("bench.ceilings", host, READY_LINE, int, "ceiling server",
                                            args=("--redis-url", redis_url))
                self.children.append(process)
                self.bases.append(f"http://{host}:{port}")
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.children[0].pid

    @property
    def pids(self) -> list[int]:
        return [child.pid for child in self.children]

    def url(self, what: str) -> str:
        """The URL of one ceiling: 'ingest', 'verify' or 'relay'."""
        return f"{self.bases[0]}/{what}"

    async def set_callbacks(self, session: aiohttp.ClientSession, callbacks: list[str]) -> None:
        """The relay's callbacks, shared among its processes; the first hands the others theirs."""
        count = len(self.bases)
        for index, base in enumerate(self.bases):
            wanted = {"callbacks": callbacks[index::count], "peers": self.bases[1:] if index == 0 else []}
            async with session.post(f"{base}/_callbacks", data=json.dumps(wanted)) as answer:
                answer.raise_for_status()

    def stop(self) -> None:
        for child in self.children:
            stop_child(child)


if __name__ == "__main__":
    _main()

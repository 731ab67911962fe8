"""The lean client's bound on what an answer sends after its head without a byte of body (chunk
framing, extensions, trailers), on the hub's request() path: a subscriber's endless trailer ends
the delivery at once with the status it gave, instead of filling memory until the total timeout."""
from __future__ import annotations

import asyncio
import time

from yarl import URL

from rsnotify.netguard import parse_networks
from rsnotify.outbound import Limits, OutboundClient
from tests.support.rawhttp import RawServer

LOOPBACK = parse_networks(["127.0.0.0/8"])


async def test_an_endless_trailer_ends_the_exchange_with_its_status_long_before_the_timeout() -> None:
    sent = {"bytes": 0}

    async def endless_trailer(server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await server.next_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: ")
        try:
            while True:
                writer.write(b"y" * 65536)
                await writer.drain()
                sent["bytes"] += 65536
        except ConnectionError:
            pass

    server = await RawServer(endless_trailer).start()
    client = OutboundClient(allowed=LOOPBACK, hint="")
    try:
        started = time.monotonic()
        answer = await client.request("POST", URL(f"http://127.0.0.1:{server.port}/cb"), {}, b"x",
                                      Limits(connect_timeout=1.0, total_timeout=8.0, max_body=1024))
        took = time.monotonic() - started
    finally:
        await client.close()
        await server.stop()
    assert (answer.status, answer.body) == (200, b"ok")
    # before the bound: 8 s (the total timeout) and every byte the subscriber sent kept by httptools
    assert took < 3.0, took
    assert sent["bytes"] < 16 * 1024 * 1024, sent

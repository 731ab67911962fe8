"""CPU per delivery POST of the two clients the worker has had: aiohttp's ClientSession (its
delivery path before rsnotify/outbound.py) and rsnotify/outbound.py, against the bench's sink, on uvloop,
64 POSTs in flight over keep-alive connections, alternated run by run.

    python -m bench.client_cost [--runs 3] [--posts 6000]

Prints each run and the medians. The process's own CPU is measured (time.process_time), so
the sink's share is left out; on a loaded machine the figures move with the load, the ratio less.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp
from yarl import URL

from rsnotify import eventloop
from rsnotify.netguard import make_session
from rsnotify.outbound import Limits, OutboundClient
from rsnotify.websub import NOTIFICATION_ID_HEADER, SEQUENCE_HEADER

from .children import stop_child
from .payloads import notification_body
from .sinks import SinkProcess

IN_FLIGHT = 64
USER_AGENT = "rsnotify-bench"


async def _measure(kind: str, sink: SinkProcess, posts: int) -> float:
    """µs of this process's CPU per POST for `kind` ('aiohttp' or 'outbound')."""
    body = notification_body(0)
    headers = {"Content-Type": "application/xml", "Link": '<http://example.org/t>; rel="self"',
               NOTIFICATION_ID_HEADER: "1-0", SEQUENCE_HEADER: "1"}
    urls = [URL(sink.url(f"cost-{n}"), encoded=True) for n in range(IN_FLIGHT)]
    one: Callable[[URL], Awaitable[int | None]]
    if kind == "aiohttp":
        # as the worker had it: guarded-session options, a per-request timeout, the answer read a little
        session = make_session(None, OSError, "", limit=IN_FLIGHT * 2, auto_decompress=False,
                               headers={"User-Agent": USER_AGENT})
        timeout = aiohttp.ClientTimeout(total=15, sock_connect=5)

        async def one(url: URL) -> int | None:
            async with session.post(url, data=body, headers=headers, allow_redirects=False,
                                    timeout=timeout) as response:
                while not response.content.at_eof():
                    if not await response.content.read(65536):
                        break
                return response.status
        close: Callable[[], Awaitable[None]] = session.close
    else:
        client = OutboundClient(allowed=None, hint="", limit=IN_FLIGHT * 2, max_idle=IN_FLIGHT * 2,
                                user_agent=USER_AGENT)
        limits = Limits(5.0, 15.0, 64 * 1024)

        async def one(url: URL) -> int | None:
            return (await client.request("POST", url, headers, body, limits)).status
        close = client.close

    async def lane(url: URL, count: int) -> None:
        for _ in range(count):
            status = await one(url)
            if status != 200:
                raise RuntimeError(f"the sink answered {status}")

    per_lane = posts // IN_FLIGHT
    try:
        await asyncio.gather(*(lane(url, 10) for url in urls))       # connections open before the clock
        started = time.process_time()
        await asyncio.gather(*(lane(url, per_lane) for url in urls))
        return (time.process_time() - started) / (per_lane * IN_FLIGHT) * 1e6
    finally:
        await close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--posts", type=int, default=6000)
    options = parser.parse_args()
    sink = SinkProcess()
    figures: dict[str, list[float]] = {"aiohttp": [], "outbound": []}
    try:
        for run in range(1, options.runs + 1):
            for kind, costs in figures.items():
                cost = eventloop.run(_measure(kind, sink, options.posts))
                costs.append(cost)
                print(f"# run {run} {kind:8}: {cost:.1f} µs CPU per POST", flush=True)
    finally:
        stop_child(sink.process)
    for kind, values in figures.items():
        print(f"{kind:8}: median {statistics.median(values):.1f} µs CPU per POST "
              f"({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()

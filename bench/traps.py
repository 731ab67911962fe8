"""Hostile subscribers for the isolation scenario, in a process of their own (run as
`python -m bench.traps`): a black hole (accepts TCP and never answers anything, on its own
port) and hanging subscribers (echo the verification challenge, then hold every POST open
without answering, on another port).

Each trap listens on a port of its own, so the hub sees them as callback hosts apart from the
healthy sinks, as a hostile subscriber on someone else's server would be.
"""
from __future__ import annotations

import argparse
import asyncio

from aiohttp import web

from .children import listen, start_child, stop_child

READY_LINE = "traps listening on ports "


def _parse_ports(rest: str) -> tuple[int, int]:
    hole, hanging = rest.split()
    return int(hole), int(hanging)


async def _swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The black hole: read whatever comes, answer nothing, until the client gives up."""
    try:
        while await reader.read(65536):
            pass
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def build_hanging_app() -> web.Application:
    async def verify(request: web.Request) -> web.Response:
        return web.Response(text=request.query.get("hub.challenge", ""))

    async def hang(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.Event().wait()       # until the hub's timeout closes the connection
        return web.Response()

    app = web.Application()
    app.router.add_get("/{name:.+}", verify)
    app.router.add_post("/{name:.+}", hang)
    return app


def _main() -> None:
    parser = argparse.ArgumentParser(description="black-hole and hanging subscribers for the benchmark")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()

    async def serve() -> None:
        hole = await asyncio.start_server(_swallow, args.host, 0, backlog=4096)
        port = await listen(build_hanging_app(), args.host, handler_cancellation=True)
        print(f"{READY_LINE}{hole.sockets[0].getsockname()[1]} {port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


class TrapProcess:
    """The traps as a child process: `black_hole(name)` and `hanging(name)` are callback URLs."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.process, (self.hole_port, self.hanging_port) = start_child(
            "bench.traps", host, READY_LINE, _parse_ports, "trap server")

    def black_hole(self, name: str) -> str:
        return f"http://{self.host}:{self.hole_port}/cb/{name}"

    def hanging(self, name: str) -> str:
        return f"http://{self.host}:{self.hanging_port}/cb/{name}"

    def stop(self) -> None:
        stop_child(self.process)


if __name__ == "__main__":
    _main()

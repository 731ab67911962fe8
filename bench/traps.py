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
import os
import subprocess
import sys
import threading

from aiohttp import web

READY_LINE = "traps listening on ports "
START_TIMEOUT = 20.0


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
        runner = web.AppRunner(build_hanging_app(), access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, args.host, 0, backlog=4096)
        await site.start()
        print(f"{READY_LINE}{hole.sockets[0].getsockname()[1]} {runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass


class TrapProcess:
    """The traps as a child process: `black_hole(name)` and `hanging(name)` are callback URLs."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.process = subprocess.Popen([sys.executable, "-m", "bench.traps", "--host", host],
                                        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        found: list[tuple[int, int]] = []

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                if line.startswith(READY_LINE):
                    hole, hanging = line[len(READY_LINE):].split()
                    found.append((int(hole), int(hanging)))
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        if not found:
            self.stop()
            raise RuntimeError(f"the trap server did not start within {START_TIMEOUT:.0f}s")
        self.hole_port, self.hanging_port = found[0]

    def black_hole(self, name: str) -> str:
        return f"http://{self.host}:{self.hole_port}/cb/{name}"

    def hanging(self, name: str) -> str:
        return f"http://{self.host}:{self.hanging_port}/cb/{name}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


if __name__ == "__main__":
    _main()

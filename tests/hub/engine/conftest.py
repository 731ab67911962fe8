"""Fixtures of the delivery engine's tests: subscriber servers on loopback, each a callback host
of its own. The hub itself is a real `rsnotify hub` started through tests/conftest.py's
`hub_process`."""
from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web

from .support import BlackHole, Callbacks, ServerThread


@pytest.fixture
def callback_servers() -> Iterator[Callable[[], Callbacks]]:
    """Factory: each call starts one more Callbacks server (a callback host of its own)."""
    servers: list[ServerThread] = []

    def start_one() -> Callbacks:
        server, recorder = ServerThread(), Callbacks()
        servers.append(server)

        async def start() -> int:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", recorder.handle)
            runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            server.closers.append(runner.cleanup)
            return runner.addresses[0][1]

        recorder.base = f"http://127.0.0.1:{server.run(start())}"
        return recorder

    yield start_one
    for server in servers:
        server.stop()


@pytest.fixture
def callbacks(callback_servers: Callable[[], Callbacks]) -> Callbacks:
    return callback_servers()


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    server, hole = ServerThread(), BlackHole()

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hole.open += 1
        try:
            while await reader.read(65536):
                pass
        except OSError:
            pass
        except asyncio.CancelledError:
            pass    # stopped with the connection held: end normally (see tests/support/rawhttp.py)
        finally:
            hole.open -= 1
            hole.closed += 1
            writer.close()

    async def start() -> int:
        listener = await asyncio.start_server(swallow, "127.0.0.1", 0, family=socket.AF_INET)

        async def close() -> None:
            listener.close()

        server.closers.append(close)
        return listener.sockets[0].getsockname()[1]

    hole.base = f"http://127.0.0.1:{server.run(start())}"
    yield hole
    server.stop()

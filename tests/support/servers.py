"""An aiohttp app served on 127.0.0.1 from a background thread with its own loop: for sync tests
(a hub subprocess, a burst worker in the main thread, CLI runs) that need a live server while
the main thread blocks."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

from aiohttp import web


class ThreadedServer:
    """`ThreadedServer(app, port=0).start()`; `port` is the bound port; `stop()` when done.
    `host` may be another loopback address (127.0.0.2: a second machine on the same box)."""

    def __init__(self, app: web.Application, port: int = 0, host: str = "127.0.0.1") -> None:
        self.app = app
        self.port = port
        self.host = host
        self.loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=f"test-server-{id(self):x}", daemon=True)

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ThreadedServer:
        self._thread.start()
        if not self._started.wait(10) or self._error is not None:
            raise RuntimeError(f"the threaded test server did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        if self._runner is not None:
            self.call(self._runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def open_connections(self) -> int:
        """The connections clients hold open to the server now (keep-alive ones included); one a
        client closed while its handler still runs is not counted (its transport is gone)."""
        server = self._runner.server if self._runner is not None else None
        return sum(1 for handler in server.connections if handler.transport is not None) if server else 0

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        """Run `coroutine` on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._bind())
        except Exception as exc:  # noqa: BLE001 - reported by start(), which waits for this thread
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()
        # The runner's cleanup cancels a handler still running past its shutdown_timeout (a test's
        # hanging answer) but does not wait for it: end such tasks here, in their loop, as
        # asyncio.run does, or they are destroyed pending when the closed loop is collected
        # ("Task was destroyed but it is pending!" from RequestHandler at a later test).
        self.loop.run_until_complete(_cancel_remaining_tasks())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())

    async def _bind(self) -> None:
        # a short shutdown_timeout: a handler a test left hanging must not hold up stop()
        self._runner = web.AppRunner(self.app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]


async def _cancel_remaining_tasks() -> None:
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

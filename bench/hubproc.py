"""The hub under test: `rsnotify hub` started by the tests' hub launcher (tests/support/hubproc.py:
a free port, a short data dir for the embedded Redis or --redis-url, ready once GET /health
answers 200), or a hub already running at a given URL."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.support.hubproc import HubProcess as LaunchedHub
from tests.support.hubproc import start_hub

START_TIMEOUT = 60.0
STOP_TIMEOUT = 40.0


class HubProcess:
    """A hub for one scenario. `url` is its hub URL; `redis_url` where its Redis is (if known).
    The process starts in `wait_ready`, off the event loop, so the harness's loop keeps running."""

    def __init__(self, *, workers: int = 2, redis_url: str | None = None, hub_url: str | None = None,
                 log_level: str = "WARNING", extra_args: tuple[str, ...] = (), keep_data: bool = False) -> None:
        self.launched: LaunchedHub | None = None
        self.data_dir: Path | None = None
        self.keep_data = keep_data
        self.url = hub_url or ""
        self.redis_url = redis_url
        self._start_args = (workers, log_level, extra_args)

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = START_TIMEOUT) -> dict:
        """Start the hub (unless it runs elsewhere) and wait for GET /health 200; its JSON body."""
        if self.launched is None and self.data_dir is None and not self.url:
            workers, log_level, extra_args = self._start_args
            # short path: the embedded Redis listens on DATA/redis.sock (Unix paths max ~107 bytes)
            self.data_dir = Path(tempfile.mkdtemp(prefix="rsnb-", dir="/tmp"))
            try:
                self.launched = await asyncio.to_thread(start_hub, self.data_dir, "--log-level", log_level, *extra_args,
                                                        data_dir=self.data_dir, redis_url=self.redis_url,
                                                        workers=workers, timeout=timeout)
            except AssertionError as exc:     # the launcher's report (exit status, log) for a test
                raise RuntimeError(str(exc)) from None
            self.url = self.launched.url
            self.redis_url = self.redis_url or f"unix://{self.data_dir / 'redis.sock'}"
        return await self._health_200(session, timeout)

    async def _health_200(self, session: aiohttp.ClientSession, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                async with session.get(self.url.rstrip("/") + "/health") as response:
                    if response.status == 200:
                        return await response.json()
                    last = f"{response.status} {await response.text()}"
            except aiohttp.ClientError as exc:
                last = str(exc)
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the hub at {self.url} was not ready within {timeout:.0f}s ({last}); "
                           f"its log:\n{self.log_tail()}")

    async def health(self, session: aiohttp.ClientSession) -> dict:
        async with session.get(self.url.rstrip("/") + "/health") as response:
            return await response.json()

    @property
    def pid(self) -> int | None:
        return self.launched.pid if self.launched is not None else None

    def child_pids(self) -> dict[str, list[int]]:
        """The hub's children by kind: 'worker' and 'redis' (read from /proc)."""
        kinds: dict[str, list[int]] = {"worker": [], "redis": []}
        if self.launched is None:
            return kinds
        for pid in _children(self.launched.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "redis-server" in cmdline or "valkey-server" in cmdline:
                kinds["redis"].append(pid)
            elif "worker" in cmdline:
                kinds["worker"].append(pid)
        return kinds

    def log_tail(self, lines: int = 30) -> str:
        if self.launched is None or not self.launched.log.exists():
            return "(no log)"
        return "\n".join(self.launched.output().splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM the hub (it stops its workers and Redis in order); kill what outlives the timeout."""
        if self.launched is not None and self.launched.process.poll() is None:
            children = [p for pids in self.child_pids().values() for p in pids]
            self.launched.stop(signal.SIGTERM, STOP_TIMEOUT)
            for pid in children:  # our own hub's children, by pid, if the hub had to be killed
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.data_dir is not None and not self.keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return out

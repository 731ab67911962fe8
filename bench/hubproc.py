"""The hub under test: `rsnotify hub` started as a subprocess (embedded Redis, or --redis-url),
or a hub already running at a given URL. Readiness is GET /health answering 200."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp

ANNOUNCE = "rsnotify hub serving at "
START_TIMEOUT = 60.0
STOP_TIMEOUT = 40.0


class HubProcess:
    """A hub for one scenario. `url` is its hub URL; `redis_url` where its Redis is (if known)."""

    def __init__(self, *, workers: int = 2, redis_url: str | None = None, hub_url: str | None = None,
                 log_level: str = "WARNING", extra_args: tuple[str, ...] = (), keep_data: bool = False) -> None:
        self.process: subprocess.Popen | None = None
        self.data_dir: Path | None = None
        self.keep_data = keep_data
        self.log_path: Path | None = None
        if hub_url is not None:
            self.url, self.redis_url = hub_url, redis_url
            return
        # short path: the embedded Redis listens on DATA/redis.sock (Unix paths max ~107 bytes)
        self.data_dir = Path(tempfile.mkdtemp(prefix="rsnb-", dir="/tmp"))
        self.log_path = self.data_dir / "hub.log"
        args = [sys.executable, "-c", "from rsnotify.cli import main; main()", "hub", "--port", "0",
                "--data-dir", str(self.data_dir), "--workers", str(workers), "--log-level", log_level, *extra_args]
        if redis_url:
            args += ["--redis-url", redis_url]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RSNOTIFY_")}
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
                                        env=env, text=True)
        self.url = self._wait_announce()
        self.redis_url = redis_url or f"unix://{self.data_dir / 'redis.sock'}"

    def _wait_announce(self) -> str:
        found: list[str] = []

        def read() -> None:
            assert self.process is not None and self.process.stdout is not None
            for line in self.process.stdout:
                if line.startswith(ANNOUNCE):
                    found.append(line[len(ANNOUNCE):].strip())
                    break
            for _ in self.process.stdout:  # keep draining so the hub never blocks on a full pipe
                pass

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        while not found and time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                break
            time.sleep(0.05)
        if not found:
            self.stop()
            raise RuntimeError(f"the hub did not start within {START_TIMEOUT:.0f}s; its log:\n{self.log_tail()}")
        return found[0]

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = START_TIMEOUT) -> dict:
        """Poll GET /health until 200 (Redis reachable, a worker seen); its JSON body."""
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
            if self.process is not None and self.process.poll() is not None:
                break
            await _sleep(0.1)
        raise RuntimeError(f"the hub at {self.url} was not ready within {timeout:.0f}s ({last}); "
                           f"its log:\n{self.log_tail()}")

    async def health(self, session: aiohttp.ClientSession) -> dict:
        async with session.get(self.url.rstrip("/") + "/health") as response:
            return await response.json()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def child_pids(self) -> dict[str, list[int]]:
        """The hub's children by kind: 'worker' and 'redis' (read from /proc)."""
        kinds: dict[str, list[int]] = {"worker": [], "redis": []}
        if self.process is None:
            return kinds
        for pid in _children(self.process.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "redis-server" in cmdline:
                kinds["redis"].append(pid)
            elif "worker" in cmdline:
                kinds["worker"].append(pid)
        return kinds

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM the hub (it stops its workers and Redis in order); kill what outlives the timeout."""
        if self.process is not None and self.process.poll() is None:
            children = [p for pids in self.child_pids().values() for p in pids]
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                for pid in children:  # our own hub's children, by pid
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        if self.process is not None:
            self._log.close()
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


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)

"""Shared fixtures: one private redis-server for the whole run (flushed for each test), and
real `rsnotify hub` processes."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis as redis_lib

from rsnotify.redis_server import RedisServer, free_port, start_redis_server

# The spec's example documents, kept verbatim.
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server on a free loopback port, with AOF, for the whole test run."""
    server = start_redis_server(tmp_path_factory.mktemp("redis"), unix_socket=False)
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The URL of a flushed database for this test."""
    client = redis_lib.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
def redis(redis_url: str) -> Iterator[redis_lib.Redis]:
    """A synchronous client on a flushed database."""
    client = redis_lib.Redis.from_url(redis_url)
    yield client
    client.close()


# --- a real `rsnotify hub` process -------------------------------------------------------------
RSNOTIFY = str(Path(sys.executable).with_name("rsnotify"))


@dataclass
class HubProcess:
    """A running `rsnotify hub`; `log` is its stderr file, `url` its public URL."""

    process: subprocess.Popen
    url: str
    log: Path
    args: list[str] = field(default_factory=list)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        """Ctrl-C, as a user would; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_hub(tmp_path: Path, *args: str, port: int | None = None, timeout: float = 60.0) -> HubProcess:
    """Start `rsnotify hub ARGS` on a free port and wait until GET /health answers 200."""
    port = port or free_port()
    log = tmp_path / f"hub-{port}.log"
    argv = [RSNOTIFY, "hub", "--port", str(port), *args]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    hub = HubProcess(process, f"http://127.0.0.1:{port}/", log, argv)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise AssertionError(f"rsnotify hub exited with {process.returncode}:\n{hub.output()}")
        try:
            with urllib.request.urlopen(hub.url + "health", timeout=2) as response:
                if response.status == 200:
                    return hub
        except OSError:
            pass
        if time.monotonic() > deadline:
            hub.stop()
            raise AssertionError(f"rsnotify hub never became healthy:\n{hub.output()}")
        time.sleep(0.1)


@pytest.fixture
def hub_process(tmp_path: Path) -> Iterator[Callable[..., HubProcess]]:
    """Factory: start_hub(tmp_path, *args); every hub started is stopped after the test."""
    started: list[HubProcess] = []

    def start(*args: str, **kwargs) -> HubProcess:
        hub = start_hub(tmp_path, *args, **kwargs)
        started.append(hub)
        return hub

    yield start
    for hub in started:
        hub.stop()

"""Shared fixtures: one private redis-server for the whole run (flushed for each test), and
real `rsnotify hub` processes."""
from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from rsnotify.hub.redis_server import RedisServer, start_redis_server
from tests.support.hubproc import HubProcess, start_hub


def pytest_configure(config: pytest.Config) -> None:
    """Let the processes the tests start be stopped with Ctrl-C (SIGINT), as a user stops them.

    A shell starts background jobs (CI runners, `cmd &`) with SIGINT ignored, and an ignored signal
    stays ignored across exec: every `rsnotify` child would then sit out its stop grace and be
    killed. A handled signal is reset to the default on exec, so handling it here fixes the children.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

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


@pytest.fixture
def hub_process(tmp_path: Path) -> Iterator[Callable[..., HubProcess]]:
    """Factory: start_hub(tmp_path, *args, **options) (tests/support/hubproc.py); every hub started
    is stopped after the test."""
    started: list[HubProcess] = []

    def start(*args: str, **options: Any) -> HubProcess:
        hub = start_hub(tmp_path, *args, **options)
        started.append(hub)
        return hub

    yield start
    for hub in started:
        hub.stop()

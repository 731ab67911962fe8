"""Shared fixtures: one private redis-server per test process (flushed for each test), and real
`rsnotify hub` processes.

The suite runs in several pytest-xdist worker processes (pyproject's addopts). Everything a worker
starts is its own: its Redis server on a free port, its hubs and servers on free ports
(tests/support/ports.py), its files under its own temporary folder. Nothing binds the README's
ports (8080 for `rsnotify hub`, 8081 for `rsnotify subscribe`): under CI the run holds them
itself, so a test that binds one fails there as it would beside a developer's running hub."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from rsnotify.hub.redis_server import RedisServer, start_redis_server
from tests.support import cli
from tests.support.http import fetch
from tests.support.hubproc import HubProcess, start_hub
from tests.support.ports import free_port
from tests.support.rawhttp import LOOP_FACTORIES
from tests.support.waiting import wait_until


def pytest_configure(config: pytest.Config) -> None:
    """Let the processes the tests start be stopped with Ctrl-C (SIGINT), as a user stops them.

    A shell starts background jobs (CI runners, `cmd &`) with SIGINT ignored, and an ignored signal
    stays ignored across exec: every `rsnotify` child would then sit out its stop grace and be
    killed. A handled signal is reset to the default on exec, so handling it here fixes the children.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get("CI") and not hasattr(config, "workerinput"):     # once, in the controlling process
        config.stash[_HELD_PORTS] = _hold(README_PORTS)


def pytest_unconfigure(config: pytest.Config) -> None:
    for held in config.stash.get(_HELD_PORTS, []):
        held.close()


# The slowest files, longest first, collected first so that the xdist workers start them first
# (pyproject: --no-loadscope-reorder) and the run ends on short ones; the rest follow in their usual
# order. The order is that of each file's wall time in a whole run of main on a loaded 2-core
# machine (load 20-26, 26 Nov 2026: 135 s down to 30 s each; about half that at load 8),
# the four bench groups and the two failover files as measured beside it, and the slowest files
# added since (resource list parts, audit pending, hosts DNS cannot carry: 15-18 s at load 3).
# Only the order depends on this list: a file missing from it still runs.
SLOW_FILES = (
    "tests/hub/test_hostile_requests.py", "tests/subscriber/test_subscriber_frameworks.py", "tests/e2e/test_e2e_sync.py",
    "tests/publisher/test_source_cli_mistakes.py", "tests/rsnotify/test_quick_reading.py",
    "tests/bench/test_bench_smoke_sync.py", "tests/publisher/test_static_source.py", "tests/publisher/test_source.py",
    "tests/hub/test_repeated_form_fields.py", "tests/e2e/test_e2e_sync_ops.py", "tests/rsnotify/test_cli_traps.py",
    "tests/subscriber/test_sync_cli_stranger.py", "tests/hub/test_cli_hub.py", "tests/bench/test_bench_smoke_paired.py",
    "tests/hub/test_numeric_hosts.py", "tests/publisher/test_source_edges.py", "tests/subscriber/test_inspect.py",
    "tests/subscriber/test_sync_live_disk.py", "tests/hub/test_worker_e2e.py", "tests/ops/test_ops_browser.py",
    "tests/subscriber/test_sync_trust.py", "tests/bench/test_bench_smoke_isolation.py",
    "tests/subscriber/test_sync_harvest_options.py", "tests/subscriber/test_sync_exclude.py",
    "tests/publisher/test_resourcelist_parts.py", "tests/subscriber/test_sync_audit_pending.py",
    "tests/hub/test_hosts_dns_cannot_carry.py",
    "tests/ops/test_ops_failover.py", "tests/rsnotify/test_properties.py", "tests/bench/test_bench_smoke.py",
    "tests/subscriber/test_sync_hostile_answers.py", "tests/e2e/test_e2e_sync_names.py", "tests/hub/test_edges_intake.py",
    "tests/hub/test_cli_embedded_workers.py", "tests/ops/test_ops_failover_tls.py", "tests/rsnotify/test_house.py",
    "tests/hub/test_diagnostics_timestamp.py", "tests/hub/engine/test_follow_cost.py", "tests/rsnotify/test_cli_startup.py",
    "tests/subscriber/test_inspect_served_source.py", "tests/subscriber/test_sync_leftovers.py",
    "tests/publisher/test_publisher_real_hub.py", "tests/e2e/test_e2e_sync_sources.py",
    "tests/subscriber/test_sync_resume_without_source.py", "tests/ops/test_ops_scaleout.py",
    "tests/hub/test_min_replicas.py", "tests/hub/test_edges_replay.py", "tests/hub/engine/test_failover.py",
    "tests/hub/engine/test_lanes.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(SLOW_FILES)))     # stable


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loops pytest-asyncio runs an async test on: the ones its module names with
    `pytest.mark.asyncio(loop_factories=...)` (tests/support/rawhttp.py's LOOPS), else asyncio's
    alone (one factory: the test's id is left as it is). The hook answers for every async test
    (pytest-asyncio refuses a None), so the choice is the marker's."""
    marker = item.get_closest_marker("asyncio")
    names = marker.kwargs.get("loop_factories", ("asyncio",)) if marker else ("asyncio",)
    return {name: LOOP_FACTORIES[name] for name in names}


# `rsnotify hub` and `rsnotify subscribe` listen here by default: a developer may be running them.
README_PORTS = (8080, 8081)
_HELD_PORTS = pytest.StashKey[list[socket.socket]]()


def _hold(ports: tuple[int, ...]) -> list[socket.socket]:
    """Listen on 127.0.0.1:PORT for each port not already taken (taken is as good: by someone
    else), so a test's server that binds it fails with "address in use" instead of passing."""
    held = []
    for port in ports:
        listener = socket.socket()
        try:
            listener.bind(("127.0.0.1", port))
            listener.listen()
        except OSError:
            listener.close()
            continue
        held.append(listener)
    return held


# The spec's example documents, kept verbatim.
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server on a free loopback port, with AOF, for this test process (each
    xdist worker has its own: its data under the worker's own temporary folder)."""
    server = start_redis_server(tmp_path_factory.mktemp("redis"), port=free_port(), unix_socket=False)
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


@pytest.fixture
def run_source(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Factory: `rsnotify source ARGS` (output in tmp_path/source.log), started once `ready_url`
    answers 200; every source still running is stopped with Ctrl-C after the test."""
    started: list[subprocess.Popen] = []
    log = tmp_path / "source.log"

    def answers(url: str) -> bool:
        try:
            return fetch(url).status == 200
        except OSError:
            return False

    def start(*args: str, ready_url: str) -> subprocess.Popen:
        source = cli.start("source", *args, log=log)
        started.append(source)
        wait_until(lambda: source.poll() is not None or answers(ready_url), 60.0, "rsnotify source to serve",
                   logs=[log])
        assert source.poll() is None, log.read_text(errors="replace")
        return source

    yield start
    for source in started:
        cli.stop(source, signal.SIGINT)

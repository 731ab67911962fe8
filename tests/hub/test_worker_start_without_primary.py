"""A worker started behind Sentinels while they know no primary (a failover under way, the
primary down) waits for one, saying so, serves once it is back, and stops at once on SIGTERM;
real servers and Sentinel."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from tests.support import cli
from tests.support.sentinels import SentinelGroup, start_sentinel_group
from tests.support.waiting import wait_until

WAITING = "no Redis primary behind the Sentinels yet"


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    started = start_sentinel_group(tmp_path / "redis", replicas=0, sentinels=1, down_after_ms=300)
    yield started
    started.stop()


def _primary_known(group: SentinelGroup) -> bool:
    sentinel = group.client(group.sentinels[0])
    try:
        flags = str(sentinel.sentinel_masters()).lower()
        return "s_down" not in flags and "o_down" not in flags and "'is_sdown': true" not in flags
    finally:
        sentinel.close()


def test_a_worker_started_while_no_primary_is_known_waits_for_it_and_serves(group: SentinelGroup,
                                                                            tmp_path: Path) -> None:
    primary = group.nodes[0]
    primary.kill()
    wait_until(lambda: not _primary_known(group), 20, "the Sentinel to see the primary down")
    log = tmp_path / "worker.log"
    env = {"RSNOTIFY_REDIS_URL": group.url(), "RSNOTIFY_SECRET_KEY": Fernet.generate_key().decode()}
    worker = cli.start("worker", "--name", "patient", log=log, env=env)
    try:
        wait_until(lambda: WAITING in log.read_text(errors="replace") or worker.poll() is not None, 20,
                   "the worker to say it waits for a primary")
        assert worker.poll() is None, f"the worker exited ({worker.returncode}): {log.read_text(errors='replace')}"
        primary.start()
        wait_until(lambda: _primary_known(group), 20, "the Sentinel to see the primary again")
        client = group.client(primary)
        try:
            # RQ registers a serving worker under its name
            wait_until(lambda: any(b"patient" in k for k in client.smembers("rq:workers")) or worker.poll() is not None,
                       30, "the worker to register with RQ")
        finally:
            client.close()
        time.sleep(0.5)
        assert worker.poll() is None, f"the worker exited ({worker.returncode}): {log.read_text(errors='replace')}"
        # SIGTERM ends it at once, also while RQ waits on the queue (a blocking BLMOVE cut short
        # must not leave its reply pending on a pooled Sentinel connection)
        started = time.monotonic()
        assert cli.stop(worker, timeout=15) == 0, log.read_text(errors="replace")
        assert time.monotonic() - started < 10
    finally:
        if worker.poll() is None:
            cli.stop(worker)

"""/health names the Redis server that answers ROLE as the primary, not the name the hub's pool
last had from the Sentinels: real servers (a primary, a replica, a Sentinel) and a real failover."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from cryptography.fernet import Fernet
from redis.exceptions import RedisError

from rsnotify.hub import redis_clients
from rsnotify.hub.settings import HubSettings
from rsnotify.hub.web.app import build_app
from rsnotify.hub.web.appkeys import REDIS
from tests.support.sentinels import SERVICE, Node, SentinelGroup, start_sentinel_group


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    # One Sentinel and a long down-after: only the failover this test asks for happens. The first
    # primary has no CLIENT command, so the Sentinel's reconfiguration (SLAVEOF + CLIENT KILL TYPE
    # normal in one MULTI) cannot close the hub's connections to it, as when the Sentinels cannot
    # reach it but the hub can; the test makes it a replica itself.
    started = start_sentinel_group(tmp_path / "redis", replicas=1, sentinels=1, down_after_ms=30_000,
                                   primary_lines=('rename-command CLIENT ""',))
    yield started
    started.stop()


def fail_over(group: SentinelGroup) -> None:
    """SENTINEL FAILOVER, then the old primary made a replica of the new one (keeping its client
    connections); back once the Sentinel names the new one and both servers state their new roles."""
    old = group.primary()
    sentinel = group.client(group.sentinels[0])
    try:
        sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
    finally:
        sentinel.close()
    deadline = time.monotonic() + 30
    # GET-MASTER-ADDR-BY-NAME names the promoted replica while the failover is still under way;
    # SENTINEL MASTER (what redis-py asks) names it once the failover is done
    while not (group.primary() is not old and group.role(group.primary()) == "master" and switched(group)):
        assert time.monotonic() < deadline, "the Sentinel never promoted the replica"
        time.sleep(0.1)
    demoted = group.client(old)
    try:
        demoted.replicaof("127.0.0.1", group.primary().port)
    finally:
        demoted.close()
    while group.role(old) != "slave":
        assert time.monotonic() < deadline, "the old primary never became a replica"
        time.sleep(0.1)


def switched(group: SentinelGroup) -> bool:
    sentinel = group.client(group.sentinels[0])
    try:
        state = sentinel.sentinel_master(SERVICE)
    finally:
        sentinel.close()
    return int(state["port"]) == group.primary().port and state["flags"] == "master"


async def hub_on(aiohttp_client, group: SentinelGroup, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A hub's web app (no workers) on the Sentinel group, served for the test."""
    settings = HubSettings(redis_url=group.url(), data_dir=str(tmp_path / "data"), workers=0,
                           secret_key=Fernet.generate_key().decode())
    return await aiohttp_client(build_app(settings))


async def test_health_names_the_server_that_answers_as_primary_after_a_failover(
        aiohttp_client, group: SentinelGroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = await hub_on(aiohttp_client, group, tmp_path)
    app = client.app
    first = group.primary()
    health = await (await client.get("/health")).json()
    assert health["replication"]["primary"] == first.address, health

    # The pool asks the Sentinels at most once a second (and gives up on them after 0.5 s under
    # load); here that check does not come round, as in the window where the flake happened.
    monkeypatch.setattr(redis_clients, "ROLE_CHECK_EVERY", 3600.0)
    pool = app[REDIS].connection_pool
    busy = await pool.get_connection()          # a command in flight on the old primary...
    await busy.send_command("PING")
    assert await busy.read_response() in (b"PONG", "PONG", True)
    await pool.disconnect(inuse_connections=False)
    await asyncio.to_thread(fail_over, group)
    second = group.primary()
    # ...while another request opens a connection, which asks the Sentinels and reaches the new one
    answer = await client.get("/health")
    assert answer.status == 200 and (await answer.json())["replication"]["primary"] == second.address, await answer.text()
    await pool.release(busy)                    # the command on the old primary ends; it is a replica now

    for _ in range(3):          # whichever connection each request gets
        answer = await client.get("/health")
        health = await answer.json()
        assert answer.status == 200, health
        assert health["replication"]["primary"] == second.address, health
        assert group.role(second) == "master"
        assert health["replication"]["last_failover"]["from"] == first.address, health
        assert health["replication"]["last_failover"]["to"] == second.address, health


@pytest.fixture
def plain_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    started = start_sentinel_group(tmp_path / "redis", replicas=1, sentinels=1, down_after_ms=30_000)
    yield started
    started.stop()


def fail_over_by_sentinel(group: SentinelGroup) -> None:
    """The failover above; back once the old primary is a replica in sync again."""
    fail_over(group)
    group.wait_for_replicas(1)


async def test_health_shows_a_failover_there_and_back_between_two_reports(
        aiohttp_client, plain_group: SentinelGroup, tmp_path: Path) -> None:
    group = plain_group
    client = await hub_on(aiohttp_client, group, tmp_path)
    app = client.app
    first = group.primary()
    health = await (await client.get("/health")).json()
    assert health["replication"]["primary"] == first.address and health["replication"]["last_failover"] is None

    # Two failovers, A -> B -> A, while the hub serves other requests (its pool follows the
    # primary) and nobody asks /health: the second one is spurious and brings the first primary back.
    await asyncio.to_thread(fail_over_by_sentinel, group)
    second = group.primary()
    await serve_until(app, second)
    await asyncio.to_thread(fail_over_by_sentinel, group)
    assert group.primary() is first
    await serve_until(app, first)

    answer = await client.get("/health")
    health = await answer.json()
    assert answer.status == 200 and health["replication"]["primary"] == first.address, health
    assert health["replication"]["last_failover"]["from"] == second.address, health
    assert health["replication"]["last_failover"]["to"] == first.address, health


async def serve_until(app: web.Application, primary: Node) -> None:
    """Commands on the hub's own client (as requests would send) until its pool has followed the
    Sentinels to `primary`."""
    deadline = time.monotonic() + 15
    while redis_clients.last_primary_change(app[REDIS]) is None or \
            redis_clients.last_primary_change(app[REDIS]).new != primary.address:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"the hub's pool never followed the Sentinels to {primary.address}"
        try:
            await app[REDIS].ping()
        except (RedisError, OSError):
            pass                    # a connection to the demoted primary, dropped: the next one asks again
        await asyncio.sleep(0.2)

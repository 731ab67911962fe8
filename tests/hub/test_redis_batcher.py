"""RedisBatcher: the commands of many concurrent deliveries or publishes, sent together on one
connection of the client's pool. Each command gets its own reply (an error reply fails only its
own command), in issue order; a script Redis lost is loaded again; a connection Redis dropped is
not used again. Against the suite's real Redis server."""
from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rsnotify.hub import redis_clients
from rsnotify.hub.batch import RedisBatcher
from rsnotify.hub.lua import Script

ECHO = Script("return {ARGV[1], redis.call('INCR', KEYS[1])}")


@pytest.fixture
async def batch(redis_url: str):
    client = redis_clients.async_client(redis_url, 4)       # as a worker builds its client
    yield RedisBatcher(client)
    await client.aclose()


async def test_commands_issued_together_get_their_own_replies_in_issue_order(batch: RedisBatcher) -> None:
    futures = [batch.execute("HSET", "h", "a", "1"),
               batch.execute("LPUSH", "h", "x"),              # WRONGTYPE: this command alone fails
               batch.execute("HGET", "h", "a"),
               *(batch.script(ECHO, ["n"], [f"call {i}"]) for i in range(5)),
               batch.execute("XADD", "log", "*", "body", b"\x00\xff"),
               batch.execute("XRANGE", "log", "-", "+")]
    replies = await asyncio.gather(*futures, return_exceptions=True)
    assert replies[0] == 1
    assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])
    assert replies[2] == b"1"
    # the scripts ran one after another, in the order they were issued
    assert replies[3:8] == [[f"call {i}".encode(), i + 1] for i in range(5)]
    entry_id = replies[8]
    assert replies[9] == [[entry_id, [b"body", b"\x00\xff"]]]     # as Redis sent it, bytes kept


async def test_a_script_redis_lost_is_loaded_again(batch: RedisBatcher) -> None:
    assert await batch.script(ECHO, ["n"], ["first"]) == [b"first", 1]
    await batch.redis.script_flush()                               # as after a restart or a failover
    assert await asyncio.gather(*(batch.script(ECHO, ["n"], [f"again {i}"]) for i in range(3))) == [
        [f"again {i}".encode(), i + 2] for i in range(3)]              # loaded again, still in order


async def test_a_dropped_connection_is_not_used_again_and_a_dead_server_fails_every_command(
        batch: RedisBatcher, redis) -> None:
    assert await batch.execute("SET", "k", "v")
    redis.client_kill_filter(_type="normal", skipme=True)        # Redis drops the pooled connection
    try:
        first = await batch.execute("GET", "k")                  # ridden out only if the client retries
    except RedisConnectionError:
        first = None
    assert first in (b"v", None)
    assert await batch.execute("GET", "k") == b"v"                # the next batch goes on a fresh connection

    client = redis_clients.async_client("redis://127.0.0.1:9/0", 2)    # the discard port: nobody answers
    dead = RedisBatcher(client)
    try:
        replies = await asyncio.gather(dead.execute("GET", "k"), dead.script(ECHO, ["n"], ["x"]),
                                       return_exceptions=True)
        assert all(isinstance(reply, RedisConnectionError) for reply in replies), replies
    finally:
        await client.aclose()


async def test_a_batch_redis_does_not_answer_in_time_fails_as_a_redis_timeout(redis_url: str, redis) -> None:
    # the web process's client: every command bounded by --redis-timeout (here 0.3 s)
    client = redis_clients.async_client(redis_url, 2, command_timeout=True, connect_timeout=0.3)
    batch = RedisBatcher(client)
    try:
        assert await batch.execute("SET", "k", "v")
        redis.client_pause(1500)                                   # Redis holds every client's commands
        started = time.monotonic()
        replies = await asyncio.gather(batch.execute("GET", "k"), batch.script(ECHO, ["n"], ["x"]),
                                       return_exceptions=True)
        assert all(isinstance(reply, RedisTimeoutError) for reply in replies), replies
        assert time.monotonic() - started < 1.2
        redis.client_unpause()
        assert await batch.execute("GET", "k") == b"v"            # the connection it gave up on is not reused
    finally:
        redis.client_unpause()
        await client.aclose()

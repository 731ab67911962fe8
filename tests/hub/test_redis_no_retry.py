"""The hub's asyncio Redis clients send a command once: a command whose reply was lost may have
run, and a script (an append, a claim, an outcome) must not run twice. Their callers wait out a
failover instead. Against a loopback server that hangs up on every connection."""
from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from rsnotify.hub import redis_clients
from tests.support.ports import free_port


@pytest.mark.parametrize("command_timeout", [False, True], ids=["worker", "web"])
async def test_a_command_whose_connection_drops_is_not_sent_again(command_timeout: bool) -> None:
    connections = 0

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.read(1)           # the command (or the handshake) is on its way: drop it
        writer.close()

    port = free_port()
    server = await asyncio.start_server(hang_up, "127.0.0.1", port)
    client = redis_clients.async_client(f"redis://127.0.0.1:{port}/0", 2, command_timeout=command_timeout,
                                        connect_timeout=2.0)
    try:
        with pytest.raises(RedisConnectionError):
            await client.set("k", "v")
        await asyncio.sleep(0.3)       # a retry with backoff would have connected again by now
        assert connections == 1
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()

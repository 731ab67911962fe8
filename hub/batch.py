"""RedisBatcher: the Redis commands of many concurrent deliveries (the worker) or publishes (the
web process), sent together."""
from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .lua import Script

MAX_BATCH = 2000          # Redis commands sent in one pipeline


class RedisBatcher:
    """Sends the Redis commands issued while a pipeline is on its way together, in one next
    pipeline, strictly in issue order. Hundreds of concurrent deliveries (or publishes) then cost
    a few round trips, and a subscription's writes can never overtake each other. Nothing waits
    for a batch to fill: a command issued while none is on its way leaves at once."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._queue: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._busy = False
        self._sources: dict[str, str] = {}
        self._drainer: asyncio.Task[None] | None = None   # held: the loop keeps only weak references

    def execute(self, *command: Any) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((command, future))
        if not self._busy:
            self._busy = True
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        return future

    def script(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> asyncio.Future[Any]:
        """Run a Script by EVALSHA (loaded again by EVAL when Redis lost it, e.g. a restart)."""
        self._sources[script.sha] = script.source
        return self.execute("EVALSHA", script.sha, len(keys), *keys, *args)

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                await self._send(batch)
        finally:
            self._busy = False

    async def _send(self, batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        try:
            results = await self._exchange([command for command, _ in batch])
            for index, result in enumerate(results):
                if isinstance(result, NoScriptError):
                    command = batch[index][0]
                    results[index] = await self.redis.execute_command("EVAL", self._sources[command[1]], *command[2:])
        except (RedisError, OSError) as exc:
            for _, future in batch:
                if not future.done():
                    _fail(future, exc)
            return
        for (_, future), result in zip(batch, results):
            if future.done():
                continue
            if isinstance(result, Exception):
                _fail(future, result)
            else:
                future.set_result(result)

    async def _exchange(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """The replies to `commands`, sent at once on one connection of the client's pool; an error
        reply is its exception in the list. Replies come as Redis sends them: redis-py's pipeline
        object, its per-command reply callbacks and its bookkeeping cost ~20 µs a batch (of ~50-70
        for a batch of one), in the web process as much as a publish's own Python code; the callers
        here read raw replies."""
        pool = self.redis.connection_pool
        conn = await pool.get_connection()
        try:
            # the client's retry policy, as its pipeline applied it
            return await conn.retry.call_with_retry(
                lambda: exchange(conn, commands, conn.socket_timeout, f"{len(commands)} commands"),
                lambda _: conn.disconnect())
        except BaseException:
            await conn.disconnect()         # a reply cut short must not reach the next user
            raise
        finally:
            await pool.release(conn)


async def exchange(conn: Any, commands: Sequence[tuple[Any, ...]], timeout: float | None, what: str) -> list[Any]:
    """Send `commands` at once on the pooled connection `conn` and read their replies, as Redis
    sends them, under one deadline of `timeout` s (each reply under a timer of its own cost ~3 us);
    an error reply is its exception in the list (the connection reads on). RedisTimeoutError
    naming `what` past the deadline; the caller disconnects `conn` after any failure (a reply cut
    short must not reach its next user)."""
    try:
        async with asyncio.timeout(timeout):
            await conn.send_packed_command(conn.pack_commands(commands))
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(await conn.read_response(timeout=math.inf))
                except ResponseError as exc:
                    replies.append(exc)
            return replies
    except TimeoutError:
        raise RedisTimeoutError(f"Redis did not answer {what} within {timeout} s") from None


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    # Some commands are sent without waiting for their answer (counters, the workers table):
    # asyncio would log each of their failures with a traceback during a Redis outage or
    # failover. Marking the exception retrieved keeps the log to the lines callers write; a
    # caller that awaits the future still gets the exception.
    future.set_exception(exc)
    future.exception()

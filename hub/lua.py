"""Lua scripts run by EVALSHA: one round trip for a multi-key update that must not interleave."""
from __future__ import annotations

import hashlib
from typing import Any

import redis as redis_sync
from redis.asyncio import Redis
from redis.exceptions import NoScriptError


class Script:
    """A Lua script run by EVALSHA (one round trip), loaded on first use on each server."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()

    async def __call__(self, redis: Redis, keys: list[str], args: list[Any]) -> Any:
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await redis.eval(self.source, len(keys), *keys, *args)

    def run_sync(self, connection: redis_sync.Redis, keys: list[str], args: list[Any]) -> Any:
        """The same on a synchronous client (the workers' maintenance runs in a thread)."""
        try:
            return connection.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return connection.eval(self.source, len(keys), *keys, *args)

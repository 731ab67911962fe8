"""Redis clients whose connection pools wait for a free connection (bounded) instead of failing:
a burst of work queues up for connections, where redis-py's default pool (redis-py 8: 100
connections) raises MaxConnectionsError and fails the job or request that asked."""
from __future__ import annotations

import redis as redis_sync
import redis.asyncio as redis_async

POOL_WAIT = 30.0        # s a command waits for a free connection before it fails


def async_client(url: str, max_connections: int) -> redis_async.Redis:
    """An asyncio client (bytes replies) owning a waiting pool of at most `max_connections`."""
    pool = redis_async.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=POOL_WAIT)
    return redis_async.Redis.from_pool(pool)


def sync_client(url: str, max_connections: int, *, connect_timeout: float | None = None) -> redis_sync.Redis:
    """A synchronous client (bytes replies) owning a waiting pool of at most `max_connections`;
    `connect_timeout`: seconds a new connection may take (None: the OS's own, minutes for a
    black-holed address)."""
    pool = redis_sync.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=POOL_WAIT,
                                                      socket_connect_timeout=connect_timeout)
    return redis_sync.Redis.from_pool(pool)

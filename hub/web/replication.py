"""What the web process asks of Redis replication: a publish waits for --min-replicas replicas
before its 200, and /health and the status page show the primary, its replicas and the last
failover."""
from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web
from redis.asyncio import Redis

from .. import redis_clients, store
from ..errors import ReplicasBehindError, UnavailableError
from .appkeys import REDIS, SETTINGS

log = logging.getLogger(__name__)

RETRY_AFTER = 1           # s: replicas catch up, or Sentinel promotes one, within a few seconds


async def wait_for_replicas(app: web.Application) -> None:
    """Return once --min-replicas replicas hold every write of this process so far (the publish
    just stored among them); ReplicasBehindError (503 + Retry-After) when fewer confirm within
    --replica-timeout."""
    settings = app[SETTINGS]
    wanted = settings.replicas_to_wait_for
    if wanted == 0:
        return
    acknowledged = await store.replication.wait_for_replicas(app[REDIS], wanted, settings.replica_timeout)
    if acknowledged < wanted:
        log.warning("publish stored but confirmed by %d of %d replicas within %g s (--min-replicas): answered 503",
                    acknowledged, wanted, settings.replica_timeout)
        raise ReplicasBehindError(
            f"the notification reached the hub's Redis primary but only {acknowledged} of {wanted} replicas "
            f"(--min-replicas) confirmed it within {settings.replica_timeout:g} s; send it again with the same "
            "Idempotency-Key (it is stored once)", RETRY_AFTER)


async def replication_report(app: web.Application) -> dict[str, Any]:
    """The primary's address and role, the replicas it feeds (state, lag) and the last failover
    any process of this hub saw; UnavailableError when the server we write to is not a primary."""
    redis = app[REDIS]
    # asked of the server itself: the pool's name for the primary can lag a failover (or two)
    role, address = await redis_clients.server_role(redis)
    if role != "master":
        raise UnavailableError(f"the Redis server at {address} is a {role or 'non-primary'}, not the primary")
    info = await store.replication.replication_info(redis)
    if info.role != "master":       # another connection reached another server: a failover under way
        raise UnavailableError(f"the Redis server {address} was the primary a moment ago, and another one "
                               f"answered as a {info.role or 'non-primary'}: a failover is under way")
    failover = await _note_primary(redis, address)
    report: dict[str, Any] = {
        "primary": address,
        "role": role,
        "sentinel": app[SETTINGS].is_sentinel,
        "min_replicas": app[SETTINGS].replicas_to_wait_for,
        "replicas": [{"address": r.address, "state": r.state, "lag_seconds": r.lag, "behind_bytes": r.behind}
                     for r in info.replicas],
        "last_failover": None if failover is None else {
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(failover.at)), "from": failover.old,
            "to": failover.new},
    }
    return report


async def _note_primary(redis: Redis, address: str) -> store.replication.Failover | None:
    """Record `address` as the primary and return the last failover. The record changes only when
    a report is made, so a failover there and back between two reports (A -> B -> A: a second,
    spurious one) would leave no trace; this process's pool saw it, though, and its change is
    recorded when the record does not have it (older, or another one)."""
    change = redis_clients.last_primary_change(redis)
    seen_at = change.at if change is not None and change.new == address else time.time()
    failover = await store.replication.note_primary(redis, address, seen_at)
    if change is None or change.new != address:
        return failover
    if failover is None or (failover.at <= change.at and (failover.old, failover.new) != (change.old, change.new)):
        failover = await store.replication.record_failover(redis, change.old, address, change.at)
    return failover

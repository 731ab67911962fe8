"""Replication of the hub's Redis: waiting for replicas to hold a publish, reading what the
primary says of its replicas, and keeping the primary's address (and the last failover) where
every process sees it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from ..keys import primary_key, replication_probe_key
from ..records import text


@dataclass(frozen=True)
class Replica:
    address: str
    state: str              # "online" once in sync
    lag: int                # s since its last acknowledgement
    behind: int             # bytes of the replication stream it has not acknowledged


@dataclass(frozen=True)
class Replication:
    role: str               # "master" on a primary; anything else means we talk to a replica
    replicas: tuple[Replica, ...]


@dataclass(frozen=True)
class Failover:
    at: float               # epoch s a process of this hub first saw the new primary
    old: str
    new: str


async def wait_for_replicas(redis: Redis, count: int, timeout: float) -> int:
    """How many replicas hold every write this hub made so far, waiting up to `timeout` s for
    `count` of them.

    WAIT counts the replicas that acknowledged the last write *of its own connection*; the pool
    may hand WAIT another connection than the publish's. So a probe write and WAIT go together
    on one connection: the replication stream is ordered, so a replica that has the probe has
    the publish (written before it) too. On a demoted primary the probe fails (READONLY), so a
    replica never acknowledges a publish.
    """
    pipe = redis.pipeline(transaction=False)
    pipe.incr(replication_probe_key())
    pipe.execute_command("WAIT", count, max(1, int(timeout * 1000)))
    _, acknowledged = await pipe.execute()
    return int(acknowledged)


async def replication_info(redis: Redis) -> Replication:
    """The role of the server `redis` writes to and the replicas it feeds (INFO replication)."""
    info: dict[str, Any] = await redis.info("replication")
    offset = int(info.get("master_repl_offset", 0))
    replicas = []
    for name, value in sorted(info.items()):
        if name.startswith("slave") and isinstance(value, dict):
            replicas.append(Replica(f"{value.get('ip')}:{value.get('port')}", str(value.get("state", "")),
                                    int(value.get("lag", 0)), max(0, offset - int(value.get("offset", 0)))))
    return Replication(str(info.get("role", "")), tuple(replicas))


async def note_primary(redis: Redis, address: str, seen_at: float) -> Failover | None:
    """Record `address` as the primary; when it differs from the one recorded, that is a failover
    (seen at `seen_at`). Returns the last failover recorded, if any."""
    stored = {text(k): text(v) for k, v in (await redis.hgetall(primary_key())).items()}
    if stored.get("address") != address:       # written on a change only: /health reads this often
        if stored.get("address"):
            stored.update(failover_at=str(seen_at), failover_from=stored["address"], failover_to=address)
        stored["address"] = address
        fields: dict[Any, Any] = stored
        await redis.hset(primary_key(), mapping=fields)
    if "failover_at" not in stored:
        return None
    return Failover(float(stored["failover_at"]), stored["failover_from"], stored["failover_to"])


async def record_failover(redis: Redis, old: str, new: str, at: float) -> Failover:
    """Record a failover from `old` to `new` seen at `at` (one this process's pool saw between two
    reports, which note_primary cannot tell from the record), `new` being the primary now."""
    fields: dict[Any, Any] = {"address": new, "failover_at": str(at), "failover_from": old, "failover_to": new}
    await redis.hset(primary_key(), mapping=fields)
    return Failover(at, old, new)

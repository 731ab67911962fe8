"""The "a job is queued" flags that keep a burst of events from queueing a burst of jobs: one
per topic for fan-out, one per subscription for its delivery job (hub/enqueue.py sets them, and
a publish's append sets the fan-out flag in its own script, store.logs.append_notification; the
job clears its own when it starts). Each flag has a TTL, so a lost job is queued again."""
from __future__ import annotations

from collections.abc import Sequence

import redis as redis_sync
from redis.asyncio import Redis

from ..keys import fanout_queued_key, sub_queued_key, verify_queued_key


def flag_deliveries(connection: redis_sync.Redis, sids: Sequence[str], ttl: int) -> list[str]:
    """Flag each subscription's delivery job as queued; returns those that had no flag yet."""
    with connection.pipeline(transaction=False) as pipe:
        for sid in sids:
            pipe.set(sub_queued_key(sid), 1, nx=True, ex=ttl)
        return [sid for sid, was_set in zip(sids, pipe.execute()) if was_set]


def flag_fan_out_sync(connection: redis_sync.Redis, tid: str, ttl: int) -> bool:
    """Flag the topic's fan-out as queued; False when it was already."""
    return bool(connection.set(fanout_queued_key(tid), 1, nx=True, ex=ttl))


async def flag_fan_out(redis: Redis, tid: str, ttl: int) -> bool:
    """flag_fan_out_sync on the asyncio client."""
    return bool(await redis.set(fanout_queued_key(tid), 1, nx=True, ex=ttl))


def unflag_fan_out_sync(connection: redis_sync.Redis, tid: str) -> None:
    """The fan-out job could not be queued: let the next publish try again."""
    connection.delete(fanout_queued_key(tid))


def flag_verify_pending(connection: redis_sync.Redis, ttl: int) -> bool:
    """Flag the verify_pending job as queued; False when it was already."""
    return bool(connection.set(verify_queued_key(), 1, nx=True, ex=ttl))

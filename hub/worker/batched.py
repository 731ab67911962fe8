"""The deliveries' plain Redis commands (the scripted ones are in claims.py), sent through the
worker's RedisBatcher so hundreds of concurrent runs share a few round trips, in issue order:
log reads, lookups, the "job queued" flags a job clears when it starts, and the counters."""
from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..batch import RedisBatcher
from ..keys import (
    fanout_queued_key,
    renewals_key,
    stats_key,
    sub_dead_body_key,
    sub_dead_key,
    sub_key,
    sub_queued_key,
    sub_resend_key,
    topic_key,
    topic_log_key,
)
from ..records import LogEntry, stream_pairs, text

RESEND_BATCH = 100        # dead letters taken from the re-send queue at a time


def clear_fan_out_flag(batch: RedisBatcher, tid: str) -> asyncio.Future[Any]:
    """A fan-out job started: a publish from now on queues (or wakes) the next one."""
    return batch.execute("DEL", fanout_queued_key(tid))


def clear_delivery_flag(batch: RedisBatcher, sid: str) -> asyncio.Future[Any]:
    """A deliver_subscription job started: the next due retry may queue another."""
    return batch.execute("DEL", sub_queued_key(sid))


async def topic_url(batch: RedisBatcher, tid: str) -> str:
    return text(await batch.execute("HGET", topic_key(tid), "url"))


async def subscription_topic_id(batch: RedisBatcher, sid: str) -> str:
    """The subscription's topic id; "" when the subscription is gone."""
    return text(await batch.execute("HGET", sub_key(sid), "tid"))


async def renewal_count(batch: RedisBatcher) -> int:
    """How many renewals so far set, changed or dropped a secret (store.activate_subscription)."""
    return int(await batch.execute("GET", renewals_key()) or 0)


async def subscription_secret(batch: RedisBatcher, sid: str) -> str | None:
    """The subscription's stored secret (a Fernet token, "" for none); None when it is gone."""
    token = await batch.execute("HGET", sub_key(sid), "secret")
    return None if token is None else text(token)


async def read_log(batch: RedisBatcher, tid: str, after: str, count: int) -> list[LogEntry]:
    """Up to `count` entries of the topic's log after entry id `after` (exclusive), oldest first."""
    raw = await batch.execute("XRANGE", topic_log_key(tid), f"({after}", "+", "COUNT", count)
    return [LogEntry.from_stream(entry_id, dict(stream_pairs(flat))) for entry_id, flat in raw]


async def last_log_id(batch: RedisBatcher, tid: str) -> str | None:
    """The id of the topic log's newest entry; None for an empty log."""
    last = await batch.execute("XREVRANGE", topic_log_key(tid), "+", "-", "COUNT", 1)
    return text(last[0][0]) if last else None


async def resend_queue(batch: RedisBatcher, sid: str) -> list[tuple[str, Any, Any]]:
    """The dead letters queued for re-sending, in queue order: (notification id, its dead-letter
    record or None, its body or None); None when it was re-sent or its subscription renewed anew."""
    nids = [text(n) for n in await batch.execute("LRANGE", sub_resend_key(sid), 0, RESEND_BATCH - 1)]
    if not nids:
        return []
    metas = await batch.execute("HMGET", sub_dead_key(sid), *nids)
    bodies = await batch.execute("HMGET", sub_dead_body_key(sid), *nids)
    return list(zip(nids, metas, bodies))


async def add_stats(batch: RedisBatcher, stats: Mapping[str, float]) -> None:
    """Add delivery counters to the hub's stats hash (":sum" fields are floats, the rest counts)."""
    for name, value in stats.items():
        if name.endswith(":sum"):
            batch.execute("HINCRBYFLOAT", stats_key(), name, repr(value))
        else:
            batch.execute("HINCRBY", stats_key(), name, int(value))
    if stats:
        await batch.execute("PING")

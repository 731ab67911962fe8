"""What the operators' views read (admin API, status page, /metrics, subscriber diagnostics):
many subscriptions or topics at once, in a few pipelined round trips. Reads only."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from ..keys import (
    activity_key,
    leases_key,
    stats_key,
    sub_dead_key,
    sub_key,
    topic_key,
    topic_log_key,
    topic_seq_key,
    topic_subs_key,
    topics_key,
)
from ..records import text, to_int

CHUNK = 500    # subscriptions read per pipeline


async def subscription_rows(redis: Redis, sids: Sequence[str], fields: Sequence[str],
                            ) -> list[tuple[str, list[Any], int]]:
    """(sid, values of `fields`, dead letters) of each subscription whose hash holds fields[1],
    in the order given; the others (removed meanwhile) are left out."""
    rows: list[tuple[str, list[Any], int]] = []
    for start in range(0, len(sids), CHUNK):
        chunk = sids[start:start + CHUNK]
        async with redis.pipeline(transaction=False) as pipe:
            for sid in chunk:
                pipe.hmget(sub_key(sid), *fields)
                pipe.hlen(sub_dead_key(sid))
            answers = await pipe.execute()
        for i, sid in enumerate(chunk):
            values, dead = answers[2 * i], answers[2 * i + 1]
            if values[1] is not None:
                rows.append((sid, values, int(dead)))
    return rows


async def topic_sequences(redis: Redis, tids: Sequence[str]) -> dict[str, Any]:
    """The last sequence number given out per topic (raw replies; None for none yet)."""
    if not tids:
        return {}
    return dict(zip(tids, await redis.mget([topic_seq_key(t) for t in tids])))


async def subscription_cursor(redis: Redis, sid: str) -> tuple[bool, str]:
    """(has a secret, cursor) of one subscription."""
    secret, cursor = await redis.hmget(sub_key(sid), "secret", "cursor")
    return bool(secret), text(cursor, "0-0")


async def subscription_replayed(redis: Redis, sid: str) -> int:
    """Log entries re-sent to one subscription for rsnotify.replay_from over its life."""
    return to_int(await redis.hget(sub_key(sid), "replayed"))


async def topic_row_replies(redis: Redis, tids: Sequence[str]) -> list[tuple[Any, ...]]:
    """Per topic: ((url, created), seq, log length, subscriptions, [last entry]) as Redis answers them."""
    async with redis.pipeline(transaction=False) as pipe:
        for tid in tids:
            pipe.hmget(topic_key(tid), "url", "created")
            pipe.get(topic_seq_key(tid))
            pipe.xlen(topic_log_key(tid))
            pipe.scard(topic_subs_key(tid))
            pipe.xrevrange(topic_log_key(tid), "+", "-", count=1)
        answers = await pipe.execute()
    return [tuple(answers[5 * i:5 * i + 5]) for i in range(len(tids))]


async def recent_entries(redis: Redis, tid: str, count: int) -> list[Any]:
    """The topic's last `count` log entries, newest first, as (entry id, fields) replies."""
    found: list[Any] = await redis.xrevrange(topic_log_key(tid), "+", "-", count=count) or []
    return found


async def activity_replies(redis: Redis, minutes: Sequence[int], busiest: int) -> list[tuple[Any, Any]]:
    """Per minute: (publishes of all topics, the `busiest` topics with their publishes)."""
    async with redis.pipeline(transaction=False) as pipe:
        for m in minutes:
            pipe.zscore(activity_key(m), "*")
            pipe.zrevrange(activity_key(m), 0, busiest, withscores=True)
        answers = await pipe.execute()
    return [(answers[2 * i], answers[2 * i + 1]) for i in range(len(minutes))]


async def totals(redis: Redis) -> tuple[int, int, dict[str, float]]:
    """(topics, subscriptions, the counters hash) in one round trip."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.scard(topics_key())
        pipe.zcard(leases_key())
        pipe.hgetall(stats_key())
        topics, subscriptions, raw_stats = await pipe.execute()
    return int(topics), int(subscriptions), {text(k): float(v) for k, v in raw_stats.items()}

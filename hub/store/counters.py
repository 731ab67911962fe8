"""The hub-wide counters (deliveries, verifications) and what /health and /metrics read about the queue."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis

from ..keys import (
    due_key,
    intent_key,
    leases_key,
    rq_job_key,
    rq_keys,
    rq_workers_key,
    stats_key,
    topics_key,
    verification_field,
    verify_pending_key,
    verify_taken_key,
    workers_key,
)
from ..records import (
    text,
)


async def delivery_stats(redis: Redis) -> dict[str, float]:
    """Hub-wide delivery counters and latency histograms, as written by the workers.

    Fields: `outcome:<delivered|retry|gone|dead>`, `status:<2xx|3xx|4xx|5xx|error>` (counts);
    for each histogram `delivery_seconds` (one POST) and `publish_to_delivery_seconds` (publish
    to confirmed delivery): `<name>:le:<bound>` per bucket of LATENCY_BUCKETS plus `<name>:le:+Inf`
    (non-cumulative counts), `<name>:sum` and `<name>:count`.
    """
    raw = await redis.hgetall(stats_key())
    return {text(k): float(v) for k, v in raw.items()}


async def count_verifications(redis: Redis, counts: Mapping[str, int]) -> None:
    """Add verification outcomes (VerificationOutcome.result -> how many) to the hub's counters."""
    if len(counts) == 1:
        (result, count), = counts.items()
        await redis.hincrby(stats_key(), verification_field(result), count)
        return
    async with redis.pipeline(transaction=False) as pipe:
        for result, count in counts.items():
            pipe.hincrby(stats_key(), verification_field(result), count)
        await pipe.execute()


@dataclass(frozen=True, slots=True)
class HealthCounts:
    """What /health reports: RQ's queue by state, live workers, and the hub's totals."""

    queued: int
    started: int
    scheduled: int
    failed: int
    workers: int
    subscriptions: int
    topics: int
    verifications_pending: int


async def live_workers(redis: Redis, members: Iterable[Any]) -> int:
    """How many of RQ's registered workers (keys.rq_workers_key() members) are still alive."""
    members = list(members)
    if not members:
        return 0
    async with redis.pipeline(transaction=False) as pipe:
        for member in members:
            pipe.exists(member)
        return sum(await pipe.execute())


async def health_counts(redis: Redis, queue: str) -> HealthCounts:
    """One round trip (PING first: an unreachable Redis raises) plus one for the workers."""
    rq = rq_keys(queue)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.ping()
        pipe.smembers(rq_workers_key())
        pipe.llen(rq["queued"])
        for registry in ("started", "scheduled", "failed"):
            pipe.zcard(rq[registry])
        pipe.zcard(leases_key())
        pipe.scard(topics_key())
        pipe.llen(verify_pending_key())
        _, members, queued, started, scheduled, failed, subscriptions, topics, pending = await pipe.execute()
    return HealthCounts(queued, started, scheduled, failed, await live_workers(redis, members), subscriptions,
                        topics, pending)


@dataclass(frozen=True, slots=True)
class Lane:
    """One lane's backlog for /health: items waiting, and how long the oldest has waited (s)."""

    waiting: int
    oldest_seconds: float

    def is_behind(self, lag: float) -> bool:
        return self.oldest_seconds > lag


async def lane_backlogs(redis: Redis, queue: str, intent_ttl: int, now: float) -> dict[str, Lane]:
    """The lanes' backlogs: verifications in line (a request's age is the TTL its intent spent),
    due retries (by due time), and queued jobs (fan-outs and the rest, by RQ's enqueued_at)."""
    rq = rq_keys(queue)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.llen(verify_pending_key())
        pipe.lindex(verify_pending_key(), 0)
        pipe.zcount(due_key(), "-inf", now)
        pipe.zrange(due_key(), 0, 0, withscores=True)
        pipe.llen(rq["queued"])
        pipe.lindex(rq["queued"], 0)
        pipe.zrange(workers_key(), 0, -1)
        in_line, first_challenge, due, first_due, queued, first_job, wids = await pipe.execute()
    # requests a worker took but has not verified yet (waiting for their host) wait too
    async with redis.pipeline(transaction=False) as pipe:
        for wid in wids:
            pipe.llen(verify_taken_key(text(wid)))
            pipe.lindex(verify_taken_key(text(wid)), 0)
        taken = await pipe.execute()
    heads = [text(c) for c in [first_challenge, *taken[1::2]] if c]
    async with redis.pipeline(transaction=False) as pipe:
        for challenge in heads:
            pipe.ttl(intent_key(challenge))
        pipe.hget(rq_job_key(text(first_job)), "enqueued_at")
        *intents_left, enqueued_at = await pipe.execute()
    in_line += sum(taken[0::2])
    verify_age = max((intent_ttl - left for left in intents_left if left and left > 0), default=0.0)
    due_age = now - first_due[0][1] if due and first_due else 0.0
    job_age = 0.0
    if first_job and enqueued_at:
        try:
            at = datetime.strptime(text(enqueued_at).rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC)
            job_age = now - at.timestamp()
        except ValueError:
            job_age = 0.0           # a format this RQ version does not write
    return {"verification": Lane(in_line, round(max(0.0, verify_age), 1)),
            "retries": Lane(due, round(max(0.0, due_age), 1)),
            "jobs": Lane(queued, round(max(0.0, job_age), 1))}


async def queue_depths(redis: Redis, queue: str, now: float) -> dict[str, Any]:
    """RQ queue depths, retries waiting (due zset), and live workers."""
    rq = rq_keys(queue)
    async with redis.pipeline(transaction=False) as pipe:
        pipe.llen(rq["queued"])
        for name in ("started", "scheduled", "failed"):
            pipe.zcard(rq[name])
        pipe.zcard(due_key())
        pipe.zcount(due_key(), "-inf", now)
        pipe.smembers(rq_workers_key())
        queued, started, scheduled, failed, due, due_now, members = await pipe.execute()
    return {"queue": queue, "queued": queued, "started": started, "scheduled": scheduled,
            "failed": failed, "waiting_retries": due, "due_now": due_now, "workers": await live_workers(redis, members)}

"""Every RQ job of the hub (plain functions: RQ imports and calls them) and the helpers that
queue them. Jobs take ids only and hand the work to the worker's loop through `ctx.run`.

The async helpers are what the web process calls; RQ's client is synchronous, so they go
through `asyncio.to_thread`, and the hand-off lives here only.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Iterable

from redis.asyncio import Redis
from rq import Queue

from . import delivery, store, worker

log = logging.getLogger(__name__)

JOB_TIMEOUT = 600         # s; a job that waits longer for its coroutine is failed by RQ
DETACH_AFTER = 2.0        # s a fan-out job waits for its deliveries before taking the next job
QUEUED_TTL = 60           # s a "job queued" flag lives; a lost job is then queued again
FAILURE_TTL = 7 * 86400   # s RQ keeps a failed job for inspection


# --- jobs -----------------------------------------------------------------------------------

def fan_out(topic_id: str) -> None:
    """Deliver the topic's log to its subscriptions (hub.delivery.fan_out)."""
    ctx = worker.context()
    ctx.run_detachable(delivery.fan_out(ctx, topic_id), DETACH_AFTER)


def follow_topic(topic_id: str, hops: int = 0) -> None:
    """Follow a busy topic's log too (hub.delivery.follow), sharing its deliveries with the
    worker that asked. Landed on a worker that follows it already: passed on, at most twice."""
    ctx = worker.context()
    if topic_id in ctx.deliveries.following:
        if hops < 2 and ctx.queue is not None:
            queue_follow(ctx.queue, topic_id, hops + 1)
        return
    ctx.run(_start_following(ctx, topic_id))


async def _start_following(ctx: worker.WorkerContext, topic_id: str) -> None:
    ctx.deliveries.spawn(delivery.follow(ctx, topic_id))


def deliver_subscription(sid: str) -> None:
    """Serve one subscription: a due retry, a re-send, a resume, or a lag the reconciler found."""
    ctx = worker.context()
    ctx.run_detachable(delivery.deliver_subscription(ctx, sid), DETACH_AFTER)


def verify_intent(challenge: str) -> None:
    """Verify (or deny) the subscription request stored under `challenge` (hub.verification)."""
    from . import metrics, verification
    ctx = worker.context()
    outcome = ctx.run(verification.verify_intent(ctx, challenge))
    ctx.run(metrics.count_verification(ctx.redis, outcome.result))   # /metrics: rsnotify_verifications_total


def verify_pending() -> None:
    """Verify every subscription request lined up by the web process (hub.verification), concurrently."""
    from . import verification
    ctx = worker.context()
    outcomes = ctx.run(verification.verify_pending(ctx))
    counts = Counter(outcome.result for outcome in outcomes)
    if counts:  # /metrics: rsnotify_verifications_total, one HINCRBY per kind of outcome
        ctx.run(_count_verifications(ctx, counts))


async def _count_verifications(ctx: worker.WorkerContext, counts: Counter[str]) -> None:
    from . import metrics
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for result, count in counts.items():
            pipe.hincrby(store.stats_key(), metrics.verification_field(result), count)
        await pipe.execute()


def fetch_topic(topic_url: str) -> None:
    """Thin ping: fetch the topic and append what it serves to its log (hub.fetch)."""
    from . import fetch
    ctx = worker.context()
    ctx.run(fetch.fetch_topic(ctx, topic_url))


def sweep_leases() -> None:
    """Remove the subscriptions whose lease ended (queued by the workers every sweep_interval)."""
    from . import verification
    ctx = worker.context()
    removed = ctx.run(verification.sweep_expired(ctx))
    if removed:
        log.info("lease sweep removed %d expired subscriptions", removed)


# --- queueing (sync: the worker's maintenance and tests) ------------------------------------

def _options(description: str) -> dict[str, object]:
    return {"job_timeout": JOB_TIMEOUT, "result_ttl": 0, "failure_ttl": FAILURE_TTL,
            "description": description}


def queue_fan_out(queue: Queue, topic_id: str) -> None:
    """Queue a fan-out job for the topic, whether or not one is queued already."""
    queue.enqueue(fan_out, topic_id, **_options(f"fan_out {topic_id}"))


def queue_deliveries(queue: Queue, sids: Iterable[str]) -> int:
    """Queue deliver_subscription jobs for those of `sids` that have none queued; returns how many."""
    sids = list(sids)
    if not sids:
        return 0
    with queue.connection.pipeline(transaction=False) as pipe:
        for sid in sids:
            pipe.set(store.sub_queued_key(sid), 1, nx=True, ex=QUEUED_TTL)
        fresh = [sid for sid, was_set in zip(sids, pipe.execute()) if was_set]
    if fresh:
        queue.enqueue_many([Queue.prepare_data(deliver_subscription, (sid,), timeout=JOB_TIMEOUT, result_ttl=0,
                                               failure_ttl=FAILURE_TTL, description=f"deliver {sid}")
                            for sid in fresh])
    return len(fresh)


def queue_follow(queue: Queue, topic_id: str, hops: int = 0) -> None:
    """Ask another worker to follow the topic as well (see follow_topic)."""
    queue.enqueue(follow_topic, topic_id, hops, **_options(f"follow {topic_id}"))


def queue_sweep(queue: Queue) -> None:
    queue.enqueue(sweep_leases, **_options("sweep leases"))


def _ensure_fan_out_sync(queue: Queue, topic_id: str) -> bool:
    if not queue.connection.set(store.fanout_queued_key(topic_id), 1, nx=True, ex=QUEUED_TTL):
        return False
    _queue_or_unflag(queue, topic_id)
    return True


def _queue_or_unflag(queue: Queue, topic_id: str) -> None:
    try:
        queue_fan_out(queue, topic_id)
    except BaseException:
        queue.connection.delete(store.fanout_queued_key(topic_id))  # let the next publish try again
        raise


# --- queueing (async: the web process) ------------------------------------------------------

async def ensure_fan_out(queue: Queue, topic_id: str, *, redis: Redis | None = None) -> bool:
    """Make sure a fan-out job for the topic is queued; True when this call queued it.

    A burst of publishes queues few jobs: a flag says one is queued, and the job clears it when
    it starts, before it reads the log, so a publish that lands during a fan-out queues the
    next one and is never missed. With the async `redis` the flag costs one command and the
    thread hop happens only when a job is really queued.
    """
    if redis is None:
        return await asyncio.to_thread(_ensure_fan_out_sync, queue, topic_id)
    if not await redis.set(store.fanout_queued_key(topic_id), 1, nx=True, ex=QUEUED_TTL):
        return False
    await asyncio.to_thread(_queue_or_unflag, queue, topic_id)
    return True


async def enqueue_verification(queue: Queue, challenge: str) -> None:
    """Queue the verification of the intent stored under `challenge`."""
    await asyncio.to_thread(functools.partial(queue.enqueue, verify_intent, challenge, **_options("verify intent")))


async def enqueue_pending_verifications(queue: Queue) -> None:
    """Queue a verify_pending job (the caller saw store.queue_intent ask for one)."""
    await asyncio.to_thread(queue.enqueue, verify_pending, **_options("verify pending intents"))


async def enqueue_fetch(queue: Queue, topic_url: str) -> None:
    """Queue a thin-ping fetch of `topic_url`."""
    await asyncio.to_thread(functools.partial(queue.enqueue, fetch_topic, topic_url,
                                              **_options(f"fetch {topic_url}")))

"""Every RQ job body of the hub (plain functions: RQ imports and calls them by the dotted paths
in hub/enqueue.py; nothing else imports this module). Jobs take ids only and hand the work to
the worker's loop through the context's `run`.
"""
from __future__ import annotations

import logging
from collections import Counter

from .. import enqueue, store
from . import fanout, fetch, verification, verifying
from .context import WorkerContext, context

log = logging.getLogger(__name__)

# s a fan-out job waits for its deliveries before taking the next job (they go on in the worker's
# loop after that). Measured, not reasoned: at 0.05 s the bench's steady-rate latency had p99 tails
# of 1.2-2.4 s against 0.2-0.3 s at 2 s (paired runs, same load); the cause is not pinned down
DETACH_AFTER = 2.0


def fan_out(topic_id: str) -> None:
    """Deliver the topic's log to its subscriptions (worker/fanout.py)."""
    ctx = context()
    ctx.run_detachable(fanout.fan_out(ctx, topic_id), DETACH_AFTER)


def follow_topic(topic_id: str, hops: int = 0) -> None:
    """Follow a busy topic's log too (fanout.follow), sharing its deliveries with the
    worker that asked. Landed on a worker that follows it already: passed on, at most twice."""
    ctx = context()
    if topic_id in ctx.deliveries.following:
        if hops < 2 and ctx.queue is not None:
            enqueue.queue_follow(ctx.queue, topic_id, hops + 1)
        return
    ctx.run(_start_following(ctx, topic_id))


async def _start_following(ctx: WorkerContext, topic_id: str) -> None:
    ctx.deliveries.spawn(fanout.follow(ctx, topic_id))


def deliver_subscription(sid: str) -> None:
    """Serve one subscription: a due retry, a re-send, a resume, or a lag the reconciler found."""
    ctx = context()
    ctx.run_detachable(fanout.deliver_subscription(ctx, sid), DETACH_AFTER)


def verify_intent(challenge: str) -> None:
    """Verify (or deny) the subscription request stored under `challenge` (worker/verification.py)."""
    ctx = context()
    outcome = ctx.run(verification.verify_intent(ctx, challenge))
    ctx.run(store.count_verifications(ctx.redis, {outcome.result: 1}))   # /metrics: rsnotify_verifications_total


def verify_pending() -> None:
    """Verify every subscription request lined up by the web process, concurrently: a running
    worker's verification lane is only woken (it verifies in its own loop, no job slot held);
    a burst worker, which runs no lane, verifies the line here."""
    ctx = context()
    if ctx.verifying is not None and ctx.verifying.is_running:
        ctx.run(verifying.wake(ctx))
        return
    outcomes = ctx.run(verification.verify_pending(ctx))
    counts = Counter(outcome.result for outcome in outcomes)
    if counts:  # /metrics: rsnotify_verifications_total, one HINCRBY per kind of outcome
        ctx.run(store.count_verifications(ctx.redis, counts))


def fetch_topic(topic_url: str) -> None:
    """Thin ping: fetch the topic and append what it serves to its log (worker/fetch.py)."""
    ctx = context()
    ctx.run(fetch.fetch_topic(ctx, topic_url))


def sweep_leases() -> None:
    """Remove the subscriptions whose lease ended (queued by the workers every sweep_interval)."""
    ctx = context()
    removed = ctx.run(verification.sweep_expired(ctx))
    if removed:
        log.info("lease sweep removed %d expired subscriptions", removed)

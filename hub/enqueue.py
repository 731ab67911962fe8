"""Queueing the hub's RQ jobs. The job bodies (hub/worker/jobs.py) are named by their dotted
paths: RQ imports them in the worker, and nothing else needs to, so the web process never
loads the worker's code.

The sync helpers serve the worker's maintenance (in a thread) and tests; the async ones are
what the web process and the worker's loop call. RQ's client is synchronous, so they go
through `asyncio.to_thread`, and that hand-off lives here only.
"""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable

from redis import Redis as SyncRedis
from redis.asyncio import Redis
from rq import Queue
from rq.serializers import JSONSerializer

from .store import queued

JOBS = "rsnotify.hub.worker.jobs"
FAN_OUT = f"{JOBS}.fan_out"
FOLLOW_TOPIC = f"{JOBS}.follow_topic"
DELIVER_SUBSCRIPTION = f"{JOBS}.deliver_subscription"
VERIFY_INTENT = f"{JOBS}.verify_intent"
VERIFY_PENDING = f"{JOBS}.verify_pending"
FETCH_TOPIC = f"{JOBS}.fetch_topic"
SWEEP_LEASES = f"{JOBS}.sweep_leases"

# Jobs carry only ids and URLs, so JSON holds them; pickle would let anyone who can write to
# Redis run code in every worker.
JOB_SERIALIZER = JSONSerializer
JOB_TIMEOUT = 600         # s; a job that waits longer for its coroutine is failed by RQ
QUEUED_TTL = 60           # s a "job queued" flag lives; a lost job is then queued again
FAILURE_TTL = 7 * 86400   # s RQ keeps a failed job for inspection


def make_queue(name: str, connection: SyncRedis) -> Queue:
    """The hub's RQ queue `name`, with the JSON job serializer every hub process uses."""
    return Queue(name, connection=connection, serializer=JOB_SERIALIZER)


def job_options(description: str) -> dict[str, object]:
    """The options every hub job is queued with (no result kept; failures kept a week)."""
    return {"job_timeout": JOB_TIMEOUT, "result_ttl": 0, "failure_ttl": FAILURE_TTL,
            "description": description}


# --- sync: the worker's maintenance and tests ------------------------------------------------

def queue_fan_out(queue: Queue, topic_id: str) -> None:
    """Queue a fan-out job for the topic, whether or not one is queued already."""
    queue.enqueue(FAN_OUT, topic_id, **job_options(f"fan_out {topic_id}"))


def queue_deliveries(queue: Queue, sids: Iterable[str]) -> int:
    """Queue deliver_subscription jobs for those of `sids` that have none queued; returns how many."""
    sids = list(sids)
    if not sids:
        return 0
    fresh = queued.flag_deliveries(queue.connection, sids, QUEUED_TTL)
    if fresh:
        queue.enqueue_many([Queue.prepare_data(DELIVER_SUBSCRIPTION, (sid,), timeout=JOB_TIMEOUT, result_ttl=0,
                                               failure_ttl=FAILURE_TTL, description=f"deliver {sid}")
                            for sid in fresh])
    return len(fresh)


def queue_follow(queue: Queue, topic_id: str, hops: int = 0) -> None:
    """Ask another worker to follow the topic as well (see jobs.follow_topic)."""
    queue.enqueue(FOLLOW_TOPIC, topic_id, hops, **job_options(f"follow {topic_id}"))


def queue_sweep(queue: Queue) -> None:
    queue.enqueue(SWEEP_LEASES, **job_options("sweep leases"))


def queue_pending_verifications(queue: Queue) -> bool:
    """Queue a verify_pending job unless one is queued (its flag is set); True when queued."""
    if not queued.flag_verify_pending(queue.connection, QUEUED_TTL):
        return False
    queue.enqueue(VERIFY_PENDING, **job_options("verify pending intents"))
    return True


def _ensure_fan_out_sync(queue: Queue, topic_id: str) -> bool:
    if not queued.flag_fan_out_sync(queue.connection, topic_id, QUEUED_TTL):
        return False
    _queue_or_unflag(queue, topic_id)
    return True


def _queue_or_unflag(queue: Queue, topic_id: str) -> None:
    try:
        queue_fan_out(queue, topic_id)
    except BaseException:
        queued.unflag_fan_out_sync(queue.connection, topic_id)
        raise


# --- async: the web process and the worker's loop --------------------------------------------

async def ensure_fan_out(queue: Queue, topic_id: str, *, redis: Redis | None = None) -> bool:
    """Make sure a fan-out job for the topic is queued; True when this call queued it.

    A burst of publishes queues few jobs: a flag says one is queued, and the job clears it when
    it starts, before it reads the log, so a publish that lands during a fan-out queues the
    next one and is never missed. With the async `redis` the flag costs one command and the
    thread hop happens only when a job is really queued.
    """
    if redis is None:
        return await asyncio.to_thread(_ensure_fan_out_sync, queue, topic_id)
    if not await queued.flag_fan_out(redis, topic_id, QUEUED_TTL):
        return False
    await asyncio.to_thread(_queue_or_unflag, queue, topic_id)
    return True


async def queue_flagged_fan_out(queue: Queue, topic_id: str) -> None:
    """Queue the fan-out job whose flag the publish's append already set (store.append_notification
    with a fan_out_flag_ttl: the flag rides in the append's round trip); ensure_fan_out's guarantee
    holds the same way, since the flag is cleared again when the job cannot be queued."""
    await asyncio.to_thread(_queue_or_unflag, queue, topic_id)


async def enqueue_follow(queue: Queue, topic_id: str) -> None:
    """Ask another worker to follow the topic as well, from the worker's loop."""
    await asyncio.to_thread(queue_follow, queue, topic_id)


async def enqueue_verification(queue: Queue, challenge: str) -> None:
    """Queue the verification of the intent stored under `challenge`."""
    await asyncio.to_thread(functools.partial(queue.enqueue, VERIFY_INTENT, challenge,
                                              **job_options("verify intent")))


async def enqueue_pending_verifications(queue: Queue) -> None:
    """Queue a verify_pending job (the caller saw store.queue_intent ask for one)."""
    await asyncio.to_thread(functools.partial(queue.enqueue, VERIFY_PENDING, **job_options("verify pending intents")))


async def enqueue_fetch(queue: Queue, topic_url: str) -> None:
    """Queue a thin-ping fetch of `topic_url`."""
    await asyncio.to_thread(functools.partial(queue.enqueue, FETCH_TOPIC, topic_url,
                                              **job_options(f"fetch {topic_url}")))

"""The verification lane: inside each worker's event loop, challenges are taken from the line
and verified concurrently (verify_concurrency at once, each callback host within its cap), so
no batch holds a job slot and no host's black-hole callbacks hold up anybody else's request.

Taken challenges sit in the worker's taken list until verified; a worker that dies leaves them
there for heartbeat.bury_dead_workers, and one that stops puts them back itself.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.exceptions import RedisError

from .. import store
from ..logs import OutageLog
from ..records import Intent
from .context import WorkerContext
from .hosts import host_of
from .verification import verify

log = logging.getLogger(__name__)

HELD = 10_000        # challenges one worker holds at once (verifying, or waiting for their host: a future each)
HOST_HELD = 1000     # of them for one callback host; more go back to the end of the line, so a flood
                     # from one host never fills the worker and leaves others' requests unread
TAKE_BATCH = 500     # challenges taken from the line at once
POLL = 0.5           # s between looks at the line when no job woke the lane
LINGER = 1.0         # s a lane that found work keeps looking at the line, GLANCE apart, before it
GLANCE = 0.01        # waits for a job's bell: during a burst, requests are seen without an RQ job each


async def run_lane(ctx: WorkerContext) -> None:
    """Take challenges from the line while there is room, and verify each in a task of its own."""
    lane = ctx.verifying
    assert lane is not None
    outage = OutageLog(log, "verification lane")
    loop = asyncio.get_running_loop()
    found_at = float("-inf")     # when the lane last found work (loop time)
    while True:
        if lane.held >= HELD:
            lane.room.clear()
            await lane.room.wait()
            continue
        lane.bell.clear()
        is_busy = loop.time() - found_at < LINGER
        try:
            challenges = await store.take_challenges(ctx.redis, lane.wid, min(TAKE_BATCH, HELD - lane.held),
                                                     is_idle=not is_busy)
        except RedisError as exc:
            outage.failed(exc)
            await asyncio.sleep(1.0)
            continue
        outage.recovered()
        if not challenges:
            # a busy lane left the job flag set: requests queue no job, so it looks again soon
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lane.bell.wait(), GLANCE if is_busy else POLL)
            continue
        found_at = loop.time()
        for challenge, intent in challenges:
            lane.held += 1
            ctx.deliveries.spawn(verify_taken(ctx, challenge, intent))
        if lane.sent_back:
            # some went back to the end of the line (their host has enough waiting here): the
            # line may hold little else, so look again a little later instead of taking them
            # round and round
            lane.sent_back = 0
            await asyncio.sleep(POLL)


async def verify_taken(ctx: WorkerContext, challenge: str, intent: Intent | None) -> None:
    """Verify one taken challenge (its intent read when it was taken) within its host's cap; its
    lane slot is taken only once the host lets it in, so requests waiting for a busy host never
    keep others from their turn. Its Redis calls share the worker's pipelines (ctx.batch)."""
    lane = ctx.verifying
    assert lane is not None
    host = ""
    try:
        if intent is None:                       # expired, or verified by a worker thought dead
            await store.finish_challenge(ctx.redis, lane.wid, challenge, batch=ctx.batch)
            return
        host = host_of(intent.callback)
        if lane.by_host[host] >= HOST_HELD:
            host = ""
            lane.sent_back += 1
            await store.return_challenge(ctx.redis, lane.wid, challenge)
            return
        lane.by_host[host] += 1
        async with ctx.deliveries.hosts.hold(host), lane.slots:
            # finished and counted (/metrics: rsnotify_verifications_total) by verify itself
            await verify(ctx, challenge, intent, taken_by=lane.wid, batch=ctx.batch)
    except RedisError as exc:
        # it stays in this worker's taken list: back in line when this worker stops or dies
        log.warning("verification %s…: Redis failed (%s); it is tried again later", challenge[:8], exc)
    except Exception:
        # a bug: left in the taken list, the request would hold the lane "behind" in /health for
        # as long as this worker lives, and fail the same way after every take-over
        log.exception("verification %s… failed; the request is dropped (the subscriber may send it again)",
                      challenge[:8])
        with contextlib.suppress(RedisError):
            await store.finish_challenge(ctx.redis, lane.wid, challenge, batch=ctx.batch)
    finally:
        if host:
            lane.by_host[host] -= 1
            if lane.by_host[host] <= 0:
                del lane.by_host[host]
        lane.held -= 1
        lane.room.set()


async def wake(ctx: WorkerContext) -> None:
    """A verify_pending job's work once the lane runs: ring the lane's bell. Its flag is left to
    the lanes: one that finds the line empty clears it (store.take_challenges), so a burst of
    requests queues a job when a lane went idle, not one for every job a worker runs meanwhile."""
    if ctx.verifying is not None:
        ctx.verifying.wake()

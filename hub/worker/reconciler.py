"""The workers' periodic maintenance: serve due retries (the retry lane), notice dead workers,
hand lagging subscriptions to a worker again (a dead worker's claims are taken over, and what
it had not confirmed is delivered by another), trim topic logs by age, and queue the lease sweep.

Each step is a plain function on a synchronous Redis client (tests call them directly); the
running worker calls them from `maintain` through a thread, so its event loop stays free.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis as redis_sync
from redis.exceptions import RedisError
from rq import Queue

from .. import enqueue, store
from ..logs import OutageLog
from ..records import parse_entry_id, text, to_int
from ..settings import HubSettings
from . import fanout, heartbeat
from .context import WorkerContext

log = logging.getLogger(__name__)

SCAN_BATCH = 500          # topics (or subscriptions) read per pipeline


def queue_due(queue: Queue, now: float | None = None) -> int:
    """Queue a deliver_subscription job for every subscription whose next attempt is due."""
    connection = queue.connection
    now = time.time() if now is None else now
    queued = 0
    for _ in range(20):                       # bounded: at most 20 * 500 per call
        sids = store.pop_due_sync(connection, now, SCAN_BATCH)
        if not sids:
            break
        queued += enqueue.queue_deliveries(queue, sids)
        if len(sids) < SCAN_BATCH:
            break
    return queued


def reconcile(queue: Queue, settings: HubSettings, now: float | None = None,
              settled: dict[str, str] | None = None, *, everything: bool = False) -> int:
    """Queue a fan-out for every topic with an active subscription that lags its log although
    nobody owns it and it is not backing off. Returns how many fan-outs were queued.

    Only topics whose newest entry is older than reconcile_interval are looked at: a fresher
    one has its fan-out queued or running. `settled` (topic id -> last entry id) remembers the
    topics found fully delivered, so an idle hub is not read through on every pass. With
    `everything` (a worker just died) every topic is looked at.
    """
    connection = queue.connection
    now = time.time() if now is None else now
    settled = {} if settled is None else settled
    fresh_after = (now - settings.reconcile_interval) * 1000
    if everything:
        settled.clear()
        fresh_after = float("inf")
    requeued = 0
    cursor = 0
    while True:
        cursor, tids = store.maintenance.scan_topic_ids(connection, cursor, SCAN_BATCH)
        for tid, (last_id, sids) in zip(tids, store.maintenance.topic_ends(connection, tids)):
            if last_id is None or not sids:
                continue
            if settled.get(tid) == last_id or parse_entry_id(last_id)[0] > fresh_after:
                continue
            if _lagging(connection, tid, last_id, sids, now, settled):
                log.info("reconciler: topic %s has unconfirmed notifications nobody is delivering; "
                         "queueing its fan-out", tid)
                enqueue.queue_fan_out(queue, tid)
                requeued += 1
        if cursor == 0:
            return requeued


def _lagging(connection: redis_sync.Redis, tid: str, last_id: str, sids: list[str], now: float,
             settled: dict[str, str]) -> bool:
    last_key = parse_entry_id(last_id)
    caught_up, orphaned = True, False
    for start in range(0, len(sids), SCAN_BATCH):
        chunk = sids[start:start + SCAN_BATCH]
        for state, expires, cursor, retry_at, resend, locked in store.maintenance.delivery_states(connection, chunk):
            if cursor is None or text(state, "active") != "active" or to_int(expires) < now:
                continue                      # gone, paused (resume wakes it) or expired (swept)
            if parse_entry_id(text(cursor)) >= last_key and not to_int(resend):
                continue
            caught_up = False
            if not locked and float(text(retry_at) or 0) <= now:
                orphaned = True
    if caught_up:
        settled[tid] = last_id
    return orphaned


def requeue_verifications(queue: Queue) -> bool:
    """Queue a verify_pending job when subscription requests wait in line and none is queued
    (its worker died): True when one was queued."""
    if not store.maintenance.has_pending_verifications(queue.connection):
        return False
    if not enqueue.queue_pending_verifications(queue):
        return False
    log.info("reconciler: subscription requests were waiting with no verification job; queued one")
    return True


def trim_logs(connection: redis_sync.Redis, settings: HubSettings, now: float | None = None) -> None:
    """Drop log entries older than log_max_age (the length bound is kept by every append).

    A subscriber whose backlog is dropped sees the gap in the sequence numbers it receives,
    and the hub records it on the subscription (gaps, last_gap).
    """
    now = time.time() if now is None else now
    min_id = f"{int((now - settings.log_max_age) * 1000)}-0"
    cursor = 0
    while True:
        cursor, tids = store.maintenance.scan_topic_ids(connection, cursor, SCAN_BATCH)
        store.maintenance.trim_logs(connection, tids, min_id)
        if cursor == 0:
            return


async def maintain(ctx: WorkerContext) -> None:
    """Run the periodic steps for as long as the worker lives (a task on the worker's loop)."""
    settings = ctx.settings
    queue = ctx.queue
    if queue is None:
        raise RuntimeError("maintenance needs the worker context's queue")
    tick = max(0.02, min(0.25, settings.retry_base / 4, settings.reconcile_interval))
    settled: dict[str, str] = {}
    next_reconcile = next_sweep = next_bury = 0.0
    outage = OutageLog(log, "maintenance")
    while True:
        try:
            await fanout.serve_due(ctx)
            if time.monotonic() >= next_bury:
                next_bury = time.monotonic() + settings.heartbeat_ttl / 4
                buried = await asyncio.to_thread(_bury_turn, queue, settings, ctx.now(), settled)
                if buried and ctx.verifying is not None:
                    ctx.verifying.wake()
            if time.monotonic() >= next_reconcile:
                next_reconcile = time.monotonic() + settings.reconcile_interval
                await asyncio.to_thread(_reconcile_turn, queue, settings, ctx.now(), settled)
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + settings.sweep_interval
                await asyncio.to_thread(_sweep_turn, queue, settings, ctx.now())
        except (RedisError, OSError) as exc:
            outage.failed(exc)
            await asyncio.sleep(1.0)
            continue
        outage.recovered()
        await asyncio.sleep(tick)


def _bury_turn(queue: Queue, settings: HubSettings, now: float, settled: dict[str, Any]) -> bool:
    """Notice dead workers; when there are some, hand their subscriptions to live workers now
    rather than at the next reconcile. True when a worker was found dead."""
    dead = heartbeat.bury_dead_workers(queue.connection, settings.heartbeat_ttl, now)
    for wid, moved in dead:
        log.warning("worker %s stopped beating; its subscriptions move to live workers "
                    "(%d verification(s) back in line)", wid, moved)
    if dead:
        reconcile(queue, settings, now, settled, everything=True)
    return bool(dead)


def _reconcile_turn(queue: Queue, settings: HubSettings, now: float, settled: dict[str, Any]) -> None:
    # a little under the interval, so that with several workers one of them runs every interval
    if store.maintenance.take_turn(queue.connection, "reconcile", settings.reconcile_interval * 0.9):
        reconcile(queue, settings, now, settled)
        requeue_verifications(queue)


def _sweep_turn(queue: Queue, settings: HubSettings, now: float) -> None:
    if store.maintenance.take_turn(queue.connection, "sweep", settings.sweep_interval * 0.9):
        trim_logs(queue.connection, settings, now)
        enqueue.queue_sweep(queue)

"""Fan-out: a topic's subscriptions served concurrently, each one's log entries sent strictly
one after another (outcomes are mapped in worker/outcomes.py); following a busy topic's log.

No RQ and no process-wide state: everything comes through `ctx` (a WorkerContext), whose
`deliveries` holds this process's claims, slots and counters.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from redis.exceptions import RedisError

from .. import enqueue, store
from ..logs import redact_callback, redact_in
from ..records import (
    DELIVERY_FIELDS,
    parse_entry_id,
    text,
    to_int,
)
from . import batched, claims
from .context import WorkerContext
from .outcomes import apply_outcome, resend_items
from .runs import FanOutReport, SubRun
from .sending import send
from .topic_log import WINDOW, TopicLog

log = logging.getLogger(__name__)

RUN_SLICE = 5.0           # s a subscription keeps a slot before yielding it to others (then re-queued)
FOLLOW_LEASE = 3.0        # s a follower's hold on a topic lasts unless renewed (a dead worker's ends)
SHARE_FROM = 32           # subscriptions from which a fan-out asks a second worker to follow the topic too
LINGER = 0.2              # s a subscription of a followed topic stays claimed after its last entry
MAX_FOLLOWED = 100        # topics one worker follows at once (each holds a Redis connection)


async def fan_out(ctx: WorkerContext, topic_id: str) -> FanOutReport:
    """Deliver the topic's log to every active subscription past its cursor.

    Subscriptions run concurrently (bounded by the worker's slots); each one's entries go one
    after another. A subscription another run owns is left to that run, which looks at the log
    again when it lets go, so no publish is missed. Afterwards the worker follows the topic for
    a while (see `follow`), so the next publishes need no job at all; a big topic asks a second
    worker to follow it too, and the followers share its subscriptions.
    """
    d = ctx.deliveries
    report = FanOutReport(topic_id)
    # Clearing the flag first: a publish after this point queues (or wakes) the next fan-out.
    batched.clear_fan_out_flag(ctx.batch, topic_id)
    topic_log = TopicLog(ctx, topic_id, await d.topic_url(topic_id))
    last_id, tasks = await _dispatch(ctx, topic_log, report)
    topic_log.subscriptions = report.served + report.busy    # every active one lags at a fan-out
    if d.follow_seconds > 0 and last_id is not None:
        d.spawn(follow(ctx, topic_id, topic_log, last_id or "0-0"))
        if report.served + report.busy >= SHARE_FROM and ctx.queue is not None:
            await enqueue.enqueue_follow(ctx.queue, topic_id)
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    return report


async def _dispatch(ctx: WorkerContext, topic_log: TopicLog, report: FanOutReport, *, share: bool = False,
                    ) -> tuple[str | None, list[asyncio.Task[Any]]]:
    """Claim the topic's lagging subscriptions (as slots allow; with `share` only this
    follower's part) and start their runs. Returns the log's last id (None: no log) and the runs."""
    d, tid = ctx.deliveries, topic_log.tid
    ttl_ms = int(ctx.settings.lock_ttl * 1000)
    tasks: list[asyncio.Task[Any]] = []
    last_id: str | None = None
    more = 1
    # The first claim takes as many slots as the topic can need now (its subscriptions this worker
    # does not hold, once a fan-out counted them), not every free one: taking and giving back ~200
    # slots cost ~0.1 ms, at every read of a followed topic. A claim that limit cut short says so
    # (more), and the next round takes every free slot.
    limit: int | None = None
    if topic_log.subscriptions:
        limit = max(1, topic_log.subscriptions - len(topic_log.holders))
    while more and not d.stopping:
        await d.slots.acquire()
        free = 1
        while (limit is None or free < limit) and not d.slots.locked():
            await d.slots.acquire()         # free slots are taken at once, without waiting
            free += 1
        limit = None
        prefix = d.new_token() + ":"
        answer = await claims.claim_lagging(ctx.batch, tid, prefix, ttl_ms, ctx.now(), free, share)
        last_id, flat, more = text(answer[0]), answer[1], answer[2]
        report.busy += int(answer[3])
        topic_log.note_pass(int(answer[4]), answer[5])
        runs = [d.run_from(text(sid), prefix + text(sid), dict(zip(DELIVERY_FIELDS, fields), renewals=answer[6]))
                for sid, fields in zip(flat[::2], flat[1::2])]
        for run in runs:
            run.lane, run.has_slot = d.slots, True
        for _ in range(free - len(runs)):
            d.slots.release()
        if runs and not topic_log.is_primed:
            await topic_log.prime(min((r.cursor for r in runs), key=parse_entry_id))
        report.served += len(runs)
        tasks.extend(d.spawn(_serve(ctx, run, topic_log, report)) for run in runs)
        if not last_id:
            return None, tasks
    return last_id, tasks


async def follow(ctx: WorkerContext, tid: str, topic_log: TopicLog | None = None, last_id: str | None = None) -> None:
    """Keep serving a busy topic without jobs: block on its log (XREAD) and dispatch each new
    entry at once, for as long as entries keep coming (follow_seconds of quiet ends it).

    Followers register in fanout_followers_key (with a short lease they renew) and keep the
    topic's "queued" flag set, so publishes queue no job; when the last one stops, it clears the
    flag and looks at the log once more. If a follower dies, its lease and the flag run out:
    other followers, the next publish's job or the reconciler deliver what it left.
    """
    d = ctx.deliveries
    if tid in d.following or len(d.following) >= MAX_FOLLOWED:
        return
    if topic_log is None:
        topic_log = TopicLog(ctx, tid, await d.topic_url(tid))
    if last_id is None:
        last_id = await batched.last_log_id(ctx.batch, tid) or "0-0"
    token, lease_ms = d.new_token(), int(FOLLOW_LEASE * 1000)
    reader = store.LogFollower(ctx.redis, tid)
    d.following.add(tid)
    try:
        quiet_until = time.monotonic() + d.follow_seconds
        renew_at = 0.0
        while not d.stopping:
            now = time.monotonic()
            if now >= renew_at:
                # renewed a third of a lease ahead, not at every read: a busy topic's reads come
                # back at once, and a script per read was a third of the follower's Redis calls.
                # The reader's connection goes back to the pool meanwhile (see LogFollower).
                await reader.release()
                topic_log.followers = max(1, int(await claims.follow(ctx.batch, tid, token, lease_ms)))
                renew_at = now + FOLLOW_LEASE / 3
            wait = quiet_until - time.monotonic()
            if wait <= 0:
                break
            block_ms = max(1, int(min(wait, renew_at - time.monotonic()) * 1000))
            entries, changes = await reader.wait(last_id, WINDOW, block_ms)
            if entries:
                topic_log.feed(last_id, entries)
                last_id = entries[-1].notification_id
                quiet_until = time.monotonic() + d.follow_seconds
                # a topic whose every subscription this worker's runs hold (lingering on the
                # window just fed) has nothing to claim: no pass, which was a script per read
                # scanning all its subscriptions
                if not topic_log.holds_all(changes):
                    await _dispatch(ctx, topic_log, FanOutReport(tid), share=True)
    except RedisError as exc:
        log.error("stopped following topic %s: Redis failed: %s", tid, exc)
    finally:
        d.following.discard(tid)
        await reader.release()
        await _unfollow(ctx, tid, token, last_id)


async def _unfollow(ctx: WorkerContext, tid: str, token: str, last_id: str) -> None:
    # The last follower clears the flag, then looks once more: an entry that came after its
    # last read but before the flag went queued no job, so it queues one now.
    try:
        left = await claims.unfollow(ctx.batch, tid, token)
        last = await batched.last_log_id(ctx.batch, tid)
        if not left and last and parse_entry_id(last) > parse_entry_id(last_id) and ctx.queue is not None:
            await enqueue.ensure_fan_out(ctx.queue, tid, redis=ctx.redis)
    except RedisError as exc:
        log.error("could not hand topic %s back: %s (the reconciler will)", tid, exc)


async def deliver_subscription(ctx: WorkerContext, sid: str, *, has_slot: bool = False) -> FanOutReport:
    """Serve one subscription in the retry lane: a due retry, a re-send, a resume, or a reconciled
    lag. With `has_slot` the caller took a retry slot for it already (serve_due)."""
    d = ctx.deliveries
    batched.clear_delivery_flag(ctx.batch, sid)
    if not has_slot:
        await d.retry_slots.acquire()
    run: SubRun | None = None
    try:
        tid = await batched.subscription_topic_id(ctx.batch, sid)
        report = FanOutReport(tid)
        if tid:
            report.subscriptions = 1
            run = await d.claim(sid)
            report.busy = int(run is None)
    finally:
        if run is None:
            d.retry_slots.release()
    if run is None:
        return report
    run.lane, run.has_slot = d.retry_slots, True
    report.served = 1
    topic_log = TopicLog(ctx, tid, await d.topic_url(tid))
    await d.spawn(_serve(ctx, run, topic_log, report))
    return report


async def serve_due(ctx: WorkerContext) -> int:
    """The retry lane, run by the worker's maintenance: take the subscriptions whose next attempt
    is due, as many as the lane has free slots, and serve each (no job per retry). Returns how many."""
    d = ctx.deliveries
    if d.stopping:
        return 0                            # what is due is left to the workers that stay
    free = 0
    while not d.retry_slots.locked():
        await d.retry_slots.acquire()       # free slots are taken at once, without waiting
        free += 1
    sids: list[str] = []
    try:
        if free:
            sids = await store.pop_due(ctx.redis, ctx.now(), free)
    finally:
        for _ in range(free - len(sids)):
            d.retry_slots.release()
    for sid in sids:
        d.spawn(deliver_subscription(ctx, sid, has_slot=True))
    return len(sids)


async def _serve(ctx: WorkerContext, run: SubRun, topic_log: TopicLog, report: FanOutReport) -> None:
    """Send the subscription everything past its cursor, in order, then let go of it — and if the
    log grew meanwhile, take it again (the fan-out queued for that publish may have skipped it)."""
    d = ctx.deliveries
    d.runs[run.sid] = run
    d.claimed += 1
    try:
        while True:
            topic_log.holders.add(run.sid)
            verdict = await _work(ctx, run, topic_log)
            if verdict == "idle" and await _linger(ctx, run, topic_log):
                continue
            if d.runs.get(run.sid) is run:
                del d.runs[run.sid]
            if verdict == "gone":
                return
            now = ctx.now()
            due_at = None
            if verdict == "yield" or (d.stopping and not run.stop and run.state == "active"):
                # let others have the slot (or this stopping worker's backlog): a worker takes it
                # up again at once (or when its retry is due) rather than the reconciler, later
                due_at = max(now, run.next_attempt)
            elif (run.next_attempt > now or verdict == "retry") and not run.stop and run.state == "active":
                # a retry (also one claimed before its time): wake it then. A retry whose backoff
                # has passed already (a tiny retry_base, or a thread preempted since the attempt)
                # is due now: without its entry it would wait for the reconciler, seconds later.
                # Only after a failed attempt: an idle run with a past next_attempt has nothing
                # to send, and waking it at once would claim it again and again.
                due_at = max(run.next_attempt, now)
            # out of the holders before letting go: the follower counts on a holder for what
            # it reads next (TopicLog.holds_all), and this run looks at the log only once more
            topic_log.holders.discard(run.sid)
            answer = await d.checkpoint(run, release=True, due_at=due_at)
            if verdict != "idle" or answer[0] != 1 or run.stop or d.stopping:
                return
            # released; anything appended (or queued for re-send) since our last read?
            last_key = parse_entry_id(text(answer[3]) or "0-0")
            run.resend, run.next_attempt = to_int(answer[4]), float(text(answer[5]) or 0)
            if not (run.lags(last_key) and run.may_send(ctx.now())):
                return
            again = await d.claim(run.sid)
            if again is None:
                return                      # someone else owns it now, and delivers
            again.delivered_total, again.failed_total = run.delivered_total, run.failed_total
            again.lane, again.has_slot, run.has_slot = run.lane, run.has_slot, False
            d.claimed += 1
            run = again
            d.runs[run.sid] = run
    except asyncio.CancelledError:
        # the worker is stopping: hand the subscription back now rather than when the claim expires,
        # due at once (or when its retry is), so another worker's retry lane takes it up in a tick;
        # without the due entry only the reconciler would, a reconcile_interval or more later
        if d.runs.get(run.sid) is run:
            del d.runs[run.sid]
        due_at = max(ctx.now(), run.next_attempt) if not run.stop and run.state == "active" else None
        try:
            await asyncio.wait_for(d.checkpoint(run, release=True, due_at=due_at), 2.0)
        except (TimeoutError, RedisError):
            pass
        raise
    except RedisError as exc:
        # Redis failed (a failover, a restart): the keeper hands the claim back, cursor included,
        # as soon as Redis answers again, so the subscription goes on at once rather than after
        # --lock-ttl; should this process die first, the claim expires by itself
        log.error("delivery to %s (subscription %s) stopped: Redis failed: %s", redact_callback(run.callback),
                  run.sid, redact_in(exc, run.callback))
        d.strand(run)
    except Exception:
        # a bug must not strand the subscription: its claim goes back, and the retry lane takes
        # it up again later, so the topic's other subscriptions and its later runs go on
        log.exception("delivery to %s (subscription %s) failed unexpectedly; it is tried again in %g s",
                      redact_callback(run.callback), run.sid, ctx.settings.retry_base)
        with contextlib.suppress(RedisError, OSError):
            await d.checkpoint(run, release=True, due_at=ctx.now() + ctx.settings.retry_base)
    finally:
        topic_log.holders.discard(run.sid)
        if d.runs.get(run.sid) is run:
            del d.runs[run.sid]
        if run.has_slot and run.lane is not None:
            run.lane.release()
            run.has_slot = False
        report.add(run)


async def _linger(ctx: WorkerContext, run: SubRun, topic_log: TopicLog) -> bool:
    """On a topic this worker follows, keep the subscription a moment after its last entry: the
    next publish then goes out at once, without a new claim and a release (most of the cost of
    a delivery at a steady rate). Only while slots are free, so nobody waits for them, and only
    for this worker's share of a topic that several workers follow: the rest are let go, so the
    other followers claim them and the topic's sends are spread over the workers (lingering
    runs would otherwise keep every subscription on the worker that fanned out first)."""
    d = ctx.deliveries
    if topic_log.tid not in d.following or d.slots.locked() or run.stop or d.stopping or run.resend \
            or not run.has_slot:
        return False
    share = topic_log.fair_share()
    if share is not None and len(topic_log.holders) > share:
        topic_log.holders.discard(run.sid)     # at once, so only the runs beyond the share let go
        return False
    return await topic_log.wait_beyond(run.cursor_key, LINGER)


async def _work(ctx: WorkerContext, run: SubRun, topic_log: TopicLog) -> str:
    """Deliver until there is nothing more: 'idle'; or 'retry', 'gone', 'stopped', 'yield'.

    The run holds a place at its callback host from its first send until it returns (a slice at
    most), so one host gets at most host_concurrency of this worker's sends at once."""
    d = ctx.deliveries
    run.slot_since = time.monotonic()
    must_reach: tuple[int, int] | None = None
    at_host = False
    try:
        while True:
            if run.resend:
                items = await resend_items(ctx, run)
            else:
                items = await topic_log.after(run.cursor, run.cursor_key, must_reach)
            if not items:
                return "idle"
            for item in items:
                if run.stop or d.stopping or not run.may_send(ctx.now()):
                    return "stopped"
                if not at_host:
                    at_host = await _enter_host(ctx, run)
                    if not at_host:
                        return "stopped"
                verdict = await apply_outcome(ctx, run, item, await send(ctx, run, item))
                if verdict != "next":
                    return verdict
                if time.monotonic() - run.slot_since > RUN_SLICE:     # time waiting for its host not counted
                    return "yield"
            must_reach = items[-1].key if not run.resend else None
    finally:
        if at_host:
            d.hosts.leave(run.host)


async def _enter_host(ctx: WorkerContext, run: SubRun) -> bool:
    """Take a place at the run's callback host. While the host is busy the run gives its lane
    slot back, so another host's subscriptions can use it meanwhile. False (and no place held)
    when the run was stopped while it waited."""
    d = ctx.deliveries
    if d.hosts.is_open(run.host) or run.lane is None:
        await d.hosts.enter(run.host)
        return True
    run.lane.release()
    run.has_slot = False
    await d.hosts.enter(run.host)
    try:
        await run.lane.acquire()
    except BaseException:
        d.hosts.leave(run.host)
        raise
    run.has_slot, run.slot_since = True, time.monotonic()
    if run.stop or d.stopping or not run.may_send(ctx.now()):
        d.hosts.leave(run.host)
        return False
    return True

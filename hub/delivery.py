"""Async core of fan-out: a topic's subscriptions served concurrently, each one's log entries
sent strictly one after another, and every outcome mapped in one place (`apply_outcome`).

No RQ and no process-wide state: everything comes through `ctx` (hub.worker.WorkerContext,
or a test's own), whose `deliveries` holds this process's claims, slots and counters.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import math
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from redis.exceptions import RedisError
from yarl import URL

from rsnotify.websub import (
    NOTIFICATION_ID_HEADER,
    SEQUENCE_HEADER,
    SIGNATURE_HEADER,
    build_link_header,
    sign,
)

from . import store
from .netguard import describe_refusal

if TYPE_CHECKING:
    from .worker import WorkerContext

log = logging.getLogger(__name__)

WINDOW = 512              # log entries a fan-out keeps in memory for its topic
READ_BATCH = 100          # entries read at once for a subscription behind that window
FRESH = 0.002             # s: an empty log read this recent is trusted (the release re-checks anyway)
RUN_SLICE = 5.0           # s a subscription keeps a slot before yielding it to others (then re-queued)
FOLLOW_LEASE = 3.0        # s a follower's hold on a topic lasts unless renewed (a dead worker's ends)
SHARE_FROM = 32           # subscriptions from which a fan-out asks a second worker to follow the topic too
LINGER = 0.2              # s a subscription of a followed topic stays claimed after its last entry
MAX_FOLLOWED = 100        # topics one worker follows at once (each holds a Redis connection)


def retry_delay(failures: int, base: float, cap: float, rand: float | None = None) -> float:
    """Seconds before the next attempt after `failures` failed ones: base * 2^(failures-1), capped,
    half of it fixed and half random (jitter), so retries of many subscribers spread out."""
    ceiling = min(cap, base * 2.0 ** min(failures - 1, 60))
    return ceiling / 2 + (random.random() if rand is None else rand) * ceiling / 2


@dataclass(frozen=True, slots=True)
class Item:
    """One thing to send to a subscription: a log entry, or a dead letter being re-sent."""

    entry: store.LogEntry
    headers: dict[str, str]       # everything but the signature, built once per notification
    key: tuple[int, int]          # the entry id, comparable
    is_resend: bool = False


def notification_headers(entry: store.LogEntry, topic: str, hub_url: str) -> dict[str, str]:
    """The headers every subscriber gets with `entry` (the signature is added per subscriber)."""
    links = [(topic, "self"), (hub_url, "hub")]
    if entry.resourcesync:
        links.append((entry.resourcesync, "resourcesync"))
    return {"Content-Type": entry.content_type, "Link": build_link_header(links),
            NOTIFICATION_ID_HEADER: entry.notification_id, SEQUENCE_HEADER: str(entry.sequence)}


@dataclass(slots=True)
class FanOutReport:
    """What one fan-out (or one subscription's delivery job) did."""

    topic_id: str
    subscriptions: int = 0        # subscriptions of the topic looked at
    served: int = 0               # claimed and served by this call
    busy: int = 0                 # owned by another run at that moment (that run delivers)
    delivered: int = 0
    failed: int = 0               # attempts that will be retried, or ended as dead letters
    gone: int = 0

    def add(self, run: SubRun) -> None:
        self.delivered += run.delivered_total
        self.failed += run.failed_total
        self.gone += run.gone


@dataclass(slots=True)
class SubRun:
    """One claim on a subscription: its delivery state in memory while this worker owns it."""

    sid: str
    token: str
    topic: str
    callback: str
    tid: str
    url: URL
    secret: str | None = field(repr=False)
    state: str
    expires: int
    cursor: str
    cursor_key: tuple[int, int]
    cursor_seq: int | None
    attempts: int
    next_attempt: float
    resend: int
    stop: bool = False            # lost its lock, removed, paused, or the worker is stopping
    gone: int = 0
    # written at the next checkpoint
    fields: dict[str, Any] = field(default_factory=dict)
    records: list[str] = field(default_factory=list)
    delivered: int = 0
    gaps: int = 0
    delivered_total: int = 0
    failed_total: int = 0

    @property
    def is_dirty(self) -> bool:
        return bool(self.fields or self.records)

    def lags(self, last_key: tuple[int, int]) -> bool:
        return self.cursor_key < last_key or self.resend > 0

    def may_send(self, now: float) -> bool:
        return self.state == "active" and self.expires >= now and self.next_attempt <= now and not self.stop


def callback_url(callback: str) -> URL:
    # the exact callback, query string included: no re-quoting of what the subscriber sent
    return URL(callback, encoded=True) if callback.isascii() else URL(callback)


class TopicLog:
    """A window of one topic's log shared by the subscriptions a fan-out serves, so the log is
    read once per round for all of them instead of once per subscription."""

    def __init__(self, ctx: WorkerContext, tid: str, topic: str) -> None:
        self.ctx, self.tid, self.topic = ctx, tid, topic
        self.hub_url = ctx.settings.hub_url
        self.items: list[Item] = []
        self.keys: list[tuple[int, int]] = []
        self.start_key: tuple[int, int] | None = None   # the window holds entries after this
        self.end_id = ""
        self.end_key = (0, 0)
        self._refresh: asyncio.Future[None] | None = None
        self._grown = asyncio.Event()                     # set (and replaced) when the window grows
        self._refreshed_at = 0.0

    def item(self, entry: store.LogEntry, key: tuple[int, int] | None = None) -> Item:
        return Item(entry, notification_headers(entry, self.topic, self.hub_url),
                    key or store.parse_entry_id(entry.notification_id))

    @property
    def is_primed(self) -> bool:
        return self.start_key is not None

    def feed(self, after: str, entries: list[store.LogEntry]) -> None:
        """Extend the window with entries just read after `after` (XREAD), when no entry can lie
        between the window's end and them; otherwise the next `after` call reads them itself."""
        if not self.is_primed or store.parse_entry_id(after) > self.end_key:
            return
        self._append(entries)

    async def prime(self, after: str) -> None:
        self.start_key = store.parse_entry_id(after)
        self.end_id, self.end_key = after, self.start_key
        await self._read_more()

    async def after(self, cursor: str, cursor_key: tuple[int, int], must_reach: tuple[int, int] | None = None,
                    ) -> list[Item]:
        """Entries after `cursor`, oldest first (a batch, not necessarily all)."""
        if self.start_key is None or cursor_key < self.start_key:
            entries = await self._xrange(cursor, READ_BATCH)   # behind the window: its own read
            return [self.item(e) for e in entries]
        if cursor_key >= self.end_key:
            if self._refresh is not None:
                await asyncio.shield(self._refresh)
            elif (time.monotonic() - self._refreshed_at > FRESH
                  or (must_reach is not None and self.end_key < must_reach)):
                await self._read_more()
            if cursor_key >= self.end_key:
                return []
        index = bisect.bisect_right(self.keys, cursor_key)
        return self.items[index:index + READ_BATCH]

    async def wait_beyond(self, key: tuple[int, int], timeout: float) -> bool:
        """Wait up to `timeout` for the window to hold an entry after `key`; True when it does."""
        if self.end_key <= key:
            try:
                await asyncio.wait_for(self._grown.wait(), timeout)
            except TimeoutError:
                pass
        return self.end_key > key

    async def _read_more(self) -> None:
        self._refresh = asyncio.get_running_loop().create_future()
        try:
            self._append(await self._xrange(self.end_id, WINDOW))
            self._refreshed_at = time.monotonic()
        finally:
            self._refresh.set_result(None)
            self._refresh = None

    def _append(self, entries: list[store.LogEntry]) -> None:
        # a read and a feed can overlap: keep each entry once, in log order
        for entry in entries:
            key = store.parse_entry_id(entry.notification_id)
            if key > self.end_key:
                self.items.append(self.item(entry, key))
                self.keys.append(key)
                self.end_id, self.end_key = entry.notification_id, key
                self._grown.set()
                self._grown = asyncio.Event()
        if len(self.items) > 2 * WINDOW:
            drop = len(self.items) - WINDOW
            self.start_key = self.keys[drop - 1]
            del self.items[:drop], self.keys[:drop]

    async def _xrange(self, after: str, count: int) -> list[store.LogEntry]:
        raw = await self.ctx.batch.execute("XRANGE", store.topic_log_key(self.tid), f"({after}", "+",
                                           "COUNT", count)
        return [store.LogEntry.from_stream(entry_id, dict(_pairs(flat))) for entry_id, flat in raw]


def _pairs(flat: Any) -> Iterable[tuple[bytes, bytes]]:
    if isinstance(flat, dict):
        return flat.items()
    return zip(flat[::2], flat[1::2])


# --- the fan-out --------------------------------------------------------------------------

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
    ctx.batch.execute("DEL", store.fanout_queued_key(topic_id))
    topic_log = TopicLog(ctx, topic_id, await d.topic_url(topic_id))
    last_id, tasks = await _dispatch(ctx, topic_log, report)
    if d.follow_seconds > 0 and last_id is not None:
        d.spawn(follow(ctx, topic_id, topic_log, last_id or "0-0"))
        if report.served + report.busy >= SHARE_FROM and ctx.queue is not None:
            from . import jobs
            await asyncio.to_thread(jobs.queue_follow, ctx.queue, topic_id)
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    return report


async def _dispatch(ctx: WorkerContext, topic_log: TopicLog, report: FanOutReport, *, share: bool = False,
                    ) -> tuple[str | None, list[asyncio.Task[Any]]]:
    """Claim the topic's lagging subscriptions (as slots allow; with `share` only this
    follower's part) and start their runs. Returns the log's last id (None: no log) and the runs."""
    d, tid = ctx.deliveries, topic_log.tid
    keys = [store.topic_subs_key(tid), store.topic_log_key(tid), store.fanout_followers_key(tid)]
    ttl_ms = int(ctx.settings.lock_ttl * 1000)
    tasks: list[asyncio.Task[Any]] = []
    last_id: str | None = None
    more = 1
    while more and not d.stopping:
        await d.slots.acquire()
        free = 1
        while not d.slots.locked():
            await d.slots.acquire()         # free slots are taken at once, without waiting
            free += 1
        prefix = d.new_token() + ":"
        answer = await ctx.batch.script(
            store.CLAIM_LAGGING_SCRIPT, keys,
            [prefix, ttl_ms, repr(ctx.now()), free, f"{store.PREFIX}sub:", int(time.time() * 1000), int(share)])
        last_id, flat, more = store._text(answer[0]), answer[1], answer[2]
        report.busy += int(answer[3])
        runs = [d.run_from(store._text(sid), prefix + store._text(sid), dict(zip(store.DELIVERY_FIELDS, fields)))
                for sid, fields in zip(flat[::2], flat[1::2])]
        for _ in range(free - len(runs)):
            d.slots.release()
        if runs and not topic_log.is_primed:
            await topic_log.prime(min((r.cursor for r in runs), key=store.parse_entry_id))
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
        last = await ctx.batch.execute("XREVRANGE", store.topic_log_key(tid), "+", "-", "COUNT", 1)
        last_id = store._text(last[0][0]) if last else "0-0"
    keys = [store.fanout_followers_key(tid), store.fanout_queued_key(tid)]
    token, lease_ms = d.new_token(), int(FOLLOW_LEASE * 1000)
    d.following.add(tid)
    try:
        quiet_until = time.monotonic() + d.follow_seconds
        while not d.stopping:
            now_ms = int(time.time() * 1000)
            await ctx.batch.script(store.FOLLOW_SCRIPT, keys, [token, now_ms + lease_ms, lease_ms, now_ms])
            wait = quiet_until - time.monotonic()
            if wait <= 0:
                break
            block_ms = max(1, int(min(wait, FOLLOW_LEASE / 3) * 1000))
            answer: Any = await ctx.redis.xread({store.topic_log_key(tid): last_id}, count=WINDOW, block=block_ms)
            if answer:
                entries = [store.LogEntry.from_stream(i, dict(_pairs(f))) for i, f in answer[0][1]]
                topic_log.feed(last_id, entries)
                last_id = entries[-1].notification_id
                quiet_until = time.monotonic() + d.follow_seconds
                await _dispatch(ctx, topic_log, FanOutReport(tid), share=True)
    except RedisError as exc:
        log.error("stopped following topic %s: Redis failed: %s", tid, exc)
    finally:
        d.following.discard(tid)
        await _unfollow(ctx, tid, keys, token, last_id)


async def _unfollow(ctx: WorkerContext, tid: str, keys: list[str], token: str, last_id: str) -> None:
    # The last follower clears the flag, then looks once more: an entry that came after its
    # last read but before the flag went queued no job, so it queues one now.
    try:
        left = await ctx.batch.script(store.UNFOLLOW_SCRIPT, keys, [token, int(time.time() * 1000)])
        last = await ctx.batch.execute("XREVRANGE", store.topic_log_key(tid), "+", "-", "COUNT", 1)
        if not left and last and store.parse_entry_id(store._text(last[0][0])) > store.parse_entry_id(last_id) \
                and ctx.queue is not None:
            from . import jobs
            await jobs.ensure_fan_out(ctx.queue, tid, redis=ctx.redis)
    except RedisError as exc:
        log.error("could not hand topic %s back: %s (the reconciler will)", tid, exc)


async def deliver_subscription(ctx: WorkerContext, sid: str) -> FanOutReport:
    """Serve one subscription (a due retry, a re-send, a resume, or a reconciled lag)."""
    d = ctx.deliveries
    ctx.batch.execute("DEL", store.sub_queued_key(sid))
    tid = store._text(await ctx.batch.execute("HGET", store.sub_key(sid), "tid"))
    report = FanOutReport(tid)
    if not tid:
        return report
    report.subscriptions = 1
    topic_log = TopicLog(ctx, tid, await d.topic_url(tid))
    await d.slots.acquire()
    try:
        run = await d.claim(sid)
    except BaseException:
        d.slots.release()
        raise
    if run is None:
        d.slots.release()
        report.busy = 1
        return report
    report.served = 1
    await d.spawn(_serve(ctx, run, topic_log, report))
    return report


async def _serve(ctx: WorkerContext, run: SubRun, topic_log: TopicLog, report: FanOutReport) -> None:
    """Send the subscription everything past its cursor, in order, then let go of it — and if the
    log grew meanwhile, take it again (the fan-out queued for that publish may have skipped it)."""
    d = ctx.deliveries
    d.runs[run.sid] = run
    d.claimed += 1
    try:
        while True:
            verdict = await _work(ctx, run, topic_log)
            if verdict == "idle" and await _linger(ctx, run, topic_log):
                continue
            if d.runs.get(run.sid) is run:
                del d.runs[run.sid]
            if verdict == "gone":
                return
            now = ctx.now()
            due_at = None
            if verdict == "yield":
                due_at = now                # let others have the slot; a worker takes it up again at once
            elif run.next_attempt > now and not run.stop and run.state == "active":
                due_at = run.next_attempt   # a retry (also one claimed before its time): wake it then
            answer = await d.checkpoint(run, release=True, due_at=due_at)
            if verdict != "idle" or answer[0] != 1 or run.stop or d.stopping:
                return
            # released; anything appended (or queued for re-send) since our last read?
            last_key = store.parse_entry_id(store._text(answer[3]) or "0-0")
            run.resend, run.next_attempt = store._int(answer[4]), float(store._text(answer[5]) or 0)
            if not (run.lags(last_key) and run.may_send(ctx.now())):
                return
            again = await d.claim(run.sid)
            if again is None:
                return                      # someone else owns it now, and delivers
            again.delivered_total, again.failed_total = run.delivered_total, run.failed_total
            d.claimed += 1
            run = again
            d.runs[run.sid] = run
    except asyncio.CancelledError:
        # the worker is stopping: hand the subscription back now rather than when the claim expires
        if d.runs.get(run.sid) is run:
            del d.runs[run.sid]
        try:
            await asyncio.wait_for(d.checkpoint(run, release=True), 2.0)
        except (TimeoutError, RedisError):
            pass
        raise
    except RedisError as exc:
        # our claim expires by itself; the reconciler hands the subscription to a worker again
        log.error("delivery to %s (subscription %s) stopped: Redis failed: %s", run.callback, run.sid, exc)
    finally:
        if d.runs.get(run.sid) is run:
            del d.runs[run.sid]
        d.slots.release()
        report.add(run)


async def _linger(ctx: WorkerContext, run: SubRun, topic_log: TopicLog) -> bool:
    """On a topic this worker follows, keep the subscription a moment after its last entry: the
    next publish then goes out at once, without a new claim and a release (most of the cost of
    a delivery at a steady rate). Only while slots are free, so nobody waits for them."""
    d = ctx.deliveries
    if topic_log.tid not in d.following or d.slots.locked() or run.stop or d.stopping or run.resend:
        return False
    return await topic_log.wait_beyond(run.cursor_key, LINGER)


async def _work(ctx: WorkerContext, run: SubRun, topic_log: TopicLog) -> str:
    """Deliver until there is nothing more: 'idle'; or 'retry', 'gone', 'stopped', 'yield'."""
    d = ctx.deliveries
    slice_end = time.monotonic() + RUN_SLICE
    must_reach: tuple[int, int] | None = None
    while True:
        if run.resend:
            items = await _resend_items(ctx, run)
        else:
            items = await topic_log.after(run.cursor, run.cursor_key, must_reach)
        if not items:
            return "idle"
        for item in items:
            if run.stop or d.stopping or not run.may_send(ctx.now()):
                return "stopped"
            verdict = await apply_outcome(ctx, run, item, await send(ctx, run, item))
            if verdict != "next":
                return verdict
            if time.monotonic() > slice_end:
                return "yield"
        must_reach = items[-1].key if not run.resend else None


@dataclass(frozen=True, slots=True)
class Response:
    """What one POST to a callback came to."""

    status: int | None            # None: no HTTP answer (timeout, connection refused, reset...)
    error: str
    seconds: float


async def send(ctx: WorkerContext, run: SubRun, item: Item) -> Response:
    """POST one notification to the subscription's exact callback: the exact body, its headers,
    the signature when there is a secret. Never follows redirects; bounded in time and size."""
    headers = item.headers
    if run.secret is not None:
        headers = {**headers, SIGNATURE_HEADER: sign(item.entry.body, run.secret, ctx.settings.signature_algorithm)}
    started = time.perf_counter()
    status: int | None = None
    error = ""
    try:
        async with ctx.session.post(run.url, data=item.entry.body, headers=headers, allow_redirects=False,
                                    timeout=ctx.deliveries.timeout) as response:
            status = response.status
            remaining = ctx.settings.max_response_bytes
            while remaining > 0:            # read a little of the answer, then ignore it
                chunk = await response.content.read(remaining)
                if not chunk:
                    break
                remaining -= len(chunk)
    except TimeoutError:
        if status is None:
            error = f"no answer within {ctx.settings.delivery_timeout:g} s"
    except aiohttp.ClientError as exc:
        if status is None:
            error = describe_refusal(exc) or f"{type(exc).__name__}: {exc}"
    return Response(status, error, time.perf_counter() - started)


async def apply_outcome(ctx: WorkerContext, run: SubRun, item: Item, response: Response) -> str:
    """The one place an attempt's outcome is decided: 2xx advances the cursor, 410 ends the
    subscription, anything else retries this subscription alone with backoff, and after the
    last attempt the notification becomes a dead letter and the cursor moves on.

    Returns 'next' (go on with the next entry), 'retry' or 'gone'.
    """
    settings, d = ctx.settings, ctx.deliveries
    entry, now = item.entry, ctx.now()
    attempt = run.attempts + 1
    status = response.status
    ms = response.seconds * 1000
    if not item.is_resend and run.cursor_seq is not None and entry.sequence > run.cursor_seq + 1 \
            and run.attempts == 0:
        missed = entry.sequence - run.cursor_seq - 1
        run.gaps += missed
        run.fields["last_gap"] = f"{run.cursor_seq + 1}-{entry.sequence - 1}"
        log.warning("subscription %s (%s) missed notifications %s: they left the log before delivery",
                    run.sid, run.callback, run.fields["last_gap"])
    match status:
        case int() if 200 <= status < 300:
            outcome, verdict = "delivered", "next"
            run.attempts, run.next_attempt = 0, 0.0
            run.delivered += 1
            run.delivered_total += 1
            if item.is_resend:
                await _dead_letter_resent(ctx, run, entry)
            else:
                run.cursor, run.cursor_key, run.cursor_seq = entry.notification_id, item.key, entry.sequence
            log.info("delivered %s (seq %d) to %s: %d in %.1f ms", entry.notification_id, entry.sequence,
                     run.callback, status, ms)
        case 410:
            outcome, verdict = "gone", "gone"
            run.gone = 1
            log.info("subscription %s ended: %s answered 410 Gone to %s", run.sid, run.callback,
                     entry.notification_id)
            await _end_subscription(ctx, run)
        case _:
            run.failed_total += 1
            reason = response.error or f"HTTP {status}"
            if attempt >= settings.max_attempts:
                outcome, verdict = "dead", "next"
                log.warning("dead letter %s (seq %d) for %s after %d attempts: %s", entry.notification_id,
                            entry.sequence, run.callback, attempt, reason)
                await _dead_letter(ctx, run, item, attempt, response)
            else:
                outcome, verdict = "retry", "retry"
                run.attempts = attempt
                run.next_attempt = now + retry_delay(attempt, settings.retry_base, settings.retry_cap)
                log.warning("delivery of %s (seq %d) to %s failed (attempt %d): %s; retry in %.1f s",
                            entry.notification_id, entry.sequence, run.callback, attempt, reason,
                            run.next_attempt - now)
    d.count(outcome, status, response.seconds, entry)
    if outcome != "gone":
        run.fields.update(attempts=run.attempts, next_attempt=math.ceil(run.next_attempt),
                          retry_at=repr(run.next_attempt),
                          last_status="" if status is None else status, last_error=response.error,
                          last_attempt_at=int(now), last_latency_ms=round(ms, 2), last_outcome=outcome)
        if outcome != "delivered":      # successes show in the last_* fields; a list of them costs ~6 kB each
            run.records.append(store.Attempt(now, entry.notification_id, entry.sequence, status, response.error,
                                             ms, outcome, attempt).to_json())
    return verdict


async def _end_subscription(ctx: WorkerContext, run: SubRun) -> None:
    run.stop = True
    await store.remove_subscription(ctx.redis, run.sid)
    await ctx.redis.delete(*store.delivery_keys(run.sid))


async def _dead_letter(ctx: WorkerContext, run: SubRun, item: Item, attempts: int, response: Response) -> None:
    entry = item.entry
    letter = store.DeadLetter(entry.notification_id, entry.sequence, entry.published_ms, entry.content_type,
                              entry.resourcesync, attempts, response.status, response.error or
                              f"HTTP {response.status}", ctx.now())
    cursor = "" if item.is_resend else entry.notification_id
    keys = [store.sub_lock_key(run.sid), store.sub_key(run.sid), store.sub_dead_key(run.sid),
            store.sub_dead_body_key(run.sid), store.sub_resend_key(run.sid)]
    done = await ctx.batch.script(store.DEAD_LETTER_SCRIPT, keys,
                                  [run.token, entry.notification_id, letter.to_json(), entry.body, cursor,
                                   entry.sequence])
    run.attempts, run.next_attempt = 0, 0.0
    if done != 1:
        run.stop = True
    elif item.is_resend:
        run.resend = max(0, run.resend - 1)
    else:
        run.cursor, run.cursor_key, run.cursor_seq = entry.notification_id, item.key, entry.sequence


async def _dead_letter_resent(ctx: WorkerContext, run: SubRun, entry: store.LogEntry) -> None:
    keys = [store.sub_lock_key(run.sid), store.sub_key(run.sid), store.sub_dead_key(run.sid),
            store.sub_dead_body_key(run.sid), store.sub_resend_key(run.sid)]
    await ctx.batch.script(store.RESENT_SCRIPT, keys, [run.token, entry.notification_id])
    run.resend = max(0, run.resend - 1)
    log.info("dead letter %s re-sent to %s", entry.notification_id, run.callback)


async def _resend_items(ctx: WorkerContext, run: SubRun) -> list[Item]:
    """The dead letters queued for re-sending, in queue order, with their stored bodies."""
    nids = [store._text(n) for n in await ctx.batch.execute("LRANGE", store.sub_resend_key(run.sid), 0, 99)]
    if not nids:
        run.resend = 0
        return []
    metas = await ctx.batch.execute("HMGET", store.sub_dead_key(run.sid), *nids)
    bodies = await ctx.batch.execute("HMGET", store.sub_dead_body_key(run.sid), *nids)
    items = []
    for nid, meta, body in zip(nids, metas, bodies):
        if meta is None or body is None:    # re-sent meanwhile, or its subscription was renewed anew
            entry = store.LogEntry(nid, b"", "", "", 0, 0)
            await _dead_letter_resent(ctx, run, entry)
            continue
        letter = store.DeadLetter.from_json(meta)
        entry = store.LogEntry(letter.notification_id, body, letter.content_type, letter.resourcesync,
                               letter.sequence, letter.published_ms)
        items.append(Item(entry, notification_headers(entry, run.topic, ctx.settings.hub_url),
                          store.parse_entry_id(entry.notification_id), is_resend=True))
    if not items:
        run.resend = 0
    return items

"""The one place an attempt's outcome is decided (`apply_outcome`), and what follows from it:
the cursor moves, the subscription ends, a retry is scheduled, or a dead letter is kept."""
from __future__ import annotations

import logging

from rsnotify.backoff import backoff_delay

from .. import store
from ..logs import delivery_fields, escape, redact_callback, redact_in
from ..records import Attempt, DeadLetter, LogEntry
from . import batched, claims
from .context import WorkerContext
from .runs import Item, SubRun, make_item
from .sending import Response

log = logging.getLogger(__name__)


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
                    run.sid, redact_callback(run.callback), run.fields["last_gap"],
                    extra=delivery_fields(run.sid, entry.notification_id, entry.sequence))
    match status:
        case int() if 200 <= status < 300:
            outcome, verdict = "delivered", "next"
            run.last_delivered_at = now
            run.attempts, run.next_attempt = 0, 0.0
            run.delivered += 1
            run.delivered_total += 1
            if item.is_resend:
                await _dead_letter_resent(ctx, run, entry)
            else:
                run.cursor, run.cursor_key, run.cursor_seq = entry.notification_id, item.key, entry.sequence
            # DEBUG: thousands a second at full fan-out; the worker's summary line counts them. The
            # arguments (escape, delivery_fields) are built only when the line is written.
            if log.isEnabledFor(logging.DEBUG):
                log.debug("delivered %s (seq %d) to %s: %d in %.1f ms", entry.notification_id, entry.sequence,
                          escape(run.callback), status, ms,
                          extra=delivery_fields(run.sid, entry.notification_id, entry.sequence, status, ms,
                                                attempt))
        case 410:
            outcome, verdict = "gone", "gone"
            run.gone = 1
            log.info("subscription %s ended: %s answered 410 Gone to %s", run.sid, redact_callback(run.callback),
                     entry.notification_id,
                     extra=delivery_fields(run.sid, entry.notification_id, entry.sequence, status, ms, attempt))
            await _end_subscription(ctx, run)
        case _:
            run.failed_total += 1
            reason = response.error or f"HTTP {status}"
            if attempt >= settings.max_attempts:
                outcome, verdict = "dead", "next"
                log.warning("dead letter %s (seq %d) for %s after %d attempts: %s", entry.notification_id,
                            entry.sequence, redact_callback(run.callback), attempt, redact_in(reason, run.callback),
                            extra=delivery_fields(run.sid, entry.notification_id, entry.sequence, status, ms,
                                                  attempt))
                await _dead_letter(ctx, run, item, attempt, response)
            else:
                outcome, verdict = "retry", "retry"
                run.attempts = attempt
                run.next_attempt = now + backoff_delay(attempt, settings.retry_base, settings.retry_cap)
                log.warning("delivery of %s (seq %d) to %s failed (attempt %d): %s; retry in %.1f s",
                            entry.notification_id, entry.sequence, redact_callback(run.callback), attempt,
                            redact_in(reason, run.callback),
                            run.next_attempt - now,
                            extra=delivery_fields(run.sid, entry.notification_id, entry.sequence, status, ms,
                                                  attempt))
    d.count(outcome, status, response.seconds, entry)
    if outcome != "gone":
        # attempts, next_attempt and the last_* fields: built from this at the next checkpoint
        run.last_attempt = (status, response.error, now, ms, outcome)
        if outcome != "delivered":      # successes show in the last_* fields; a list of them costs ~6 kB each
            run.records.append(Attempt(now, entry.notification_id, entry.sequence, status, response.error,
                                             ms, outcome, attempt).to_json())
    return verdict


async def _end_subscription(ctx: WorkerContext, run: SubRun) -> None:
    run.stop = True
    await store.remove_subscription(ctx.redis, run.sid)
    await store.delete_delivery_state(ctx.redis, run.sid)


async def _dead_letter(ctx: WorkerContext, run: SubRun, item: Item, attempts: int, response: Response) -> None:
    entry = item.entry
    letter = DeadLetter(entry.notification_id, entry.sequence, entry.published_ms, entry.content_type,
                              entry.resourcesync, attempts, response.status, response.error or
                              f"HTTP {response.status}", ctx.now())
    cursor = "" if item.is_resend else entry.notification_id
    done = await claims.dead_letter(ctx.batch, run.sid, run.token, entry.notification_id, letter.to_json(),
                                    entry.body, cursor, entry.sequence)
    run.attempts, run.next_attempt = 0, 0.0
    if done != 1:
        run.stop = True
    elif item.is_resend:
        run.resend = max(0, run.resend - 1)
    else:
        run.cursor, run.cursor_key, run.cursor_seq = entry.notification_id, item.key, entry.sequence


async def _dead_letter_resent(ctx: WorkerContext, run: SubRun, entry: LogEntry) -> None:
    await claims.resent(ctx.batch, run.sid, run.token, entry.notification_id)
    run.resend = max(0, run.resend - 1)
    log.info("dead letter %s re-sent to %s", entry.notification_id, redact_callback(run.callback),
             extra=delivery_fields(run.sid, entry.notification_id, entry.sequence))


async def resend_items(ctx: WorkerContext, run: SubRun) -> list[Item]:
    """The dead letters queued for re-sending, in queue order, with their stored bodies."""
    queued = await batched.resend_queue(ctx.batch, run.sid)
    if not queued:
        run.resend = 0
        return []
    items = []
    for nid, meta, body in queued:
        if meta is None or body is None:    # re-sent meanwhile, or its subscription was renewed anew
            entry = LogEntry(nid, b"", "", "", 0, 0)
            await _dead_letter_resent(ctx, run, entry)
            continue
        letter = DeadLetter.from_json(meta)
        entry = LogEntry(letter.notification_id, body, letter.content_type, letter.resourcesync,
                         letter.sequence, letter.published_ms)
        items.append(make_item(entry, run.topic, ctx.settings.hub_url, is_resend=True))
    if not items:
        run.resend = 0
    return items

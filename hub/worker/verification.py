"""Async core of intent verification, denials and the lease sweep (run by worker jobs).

`verify_intent(ctx, challenge)` GETs the callback with the challenge; only a 2xx whose body
is exactly the challenge changes state. `ctx` has settings, redis (asyncio), outbound (the
guarded keep-alive client, rsnotify/outbound.py), fernet and now() (epoch seconds). No RQ here.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.fernet import Fernet
from redis.asyncio import Redis
from yarl import URL

from rsnotify.outbound import Answer, Limits, OutboundClient

from .. import keys, store
from ..batch import RedisBatcher
from ..callbacks import callback_url
from ..logs import delivery_fields, escape, redact_callback, redact_in
from ..records import Intent
from ..settings import HubSettings

log = logging.getLogger(__name__)

# The echo is compared byte for byte, so it must come uncompressed: without this header any
# coding is acceptable (RFC 9110, 12.5.3), and the client decodes none.
IDENTITY = {"Accept-Encoding": "identity"}
DENIAL_MAX_BODY = 1024      # bytes of a denial's answer read: only its status is logged
VERIFY_BATCH = 500          # challenges taken from the line at a time
VERIFY_CONCURRENCY = 100    # verification GETs in flight at once in one job
VERIFY_MAX_BATCHES = 100    # a job verifies at most 50,000 requests; the next job goes on
SWEEP_BATCH = 500
SWEEP_MAX_BATCHES = 200  # one sweep removes at most 100,000 subscriptions; the next one goes on


class OutboundContext(Protocol):
    """What the async cores need from a worker context."""

    settings: HubSettings
    redis: Redis
    outbound: OutboundClient
    fernet: Fernet

    def now(self) -> float: ...


@dataclass(frozen=True, slots=True)
class VerificationOutcome:
    """What became of one intent: `result` is activated, renewed, unsubscribed, refused,
    denial-sent, denial-failed or unknown-challenge; `reason` says why when refused."""

    mode: str
    topic: str
    callback: str
    result: str
    status: int | None = None
    reason: str = ""
    subscription_id: str = ""


async def verify_intent(ctx: OutboundContext, challenge: str) -> VerificationOutcome:
    """Verify the pending intent stored under `challenge` (single use) and apply it if verified."""
    intent = await store.take_intent(ctx.redis, challenge)
    if intent is None:
        log.info("verification %s…: no pending intent (already used or expired)", challenge[:8])
        return VerificationOutcome("", "", "", "unknown-challenge")
    return await verify(ctx, challenge, intent)


async def verify(ctx: OutboundContext, challenge: str, intent: Intent, *, taken_by: str = "",
                 batch: RedisBatcher | None = None) -> VerificationOutcome:
    """Verify (or deny) `intent`, stored under `challenge`, and apply it if verified.

    `taken_by` is the id of the worker whose verification lane took the challenge: the challenge
    is then finished and its outcome counted as well (store.finish_challenge), in the same script
    call as an activation. With `batch` the Redis calls ride in the pipelines of the verifications
    running meanwhile (the lane's hundreds at once cost a few round trips, not hundreds).
    """
    taken = (taken_by, challenge) if taken_by else None
    if intent.mode == "denied":
        return await _finished(ctx, taken, batch, await send_denial(ctx, intent))
    params = {"hub.mode": intent.mode, "hub.topic": intent.topic, "hub.challenge": challenge}
    start = None
    if intent.mode == "subscribe":
        params["hub.lease_seconds"] = str(intent.lease_seconds)
        # Taken before the GET: a notification published while the subscriber answers is
        # after its "yes", so a new subscription must get it.
        start = await store.log_end(ctx.redis, intent.topic, batch=batch)
    began = time.monotonic()
    status, refusal = await _get_echo(ctx, intent, callback_url(intent.callback, params), challenge)
    ms = (time.monotonic() - began) * 1000
    if refusal:
        log.warning("%s of %s for %s not verified: %s", intent.mode, redact_callback(intent.callback),
                    escape(intent.topic), redact_in(refusal, intent.callback),
                    extra=delivery_fields(keys.subscription_id(intent.topic, intent.callback), status=status, ms=ms))
        outcome = VerificationOutcome(intent.mode, intent.topic, intent.callback, "refused", status, refusal)
        return await _finished(ctx, taken, batch, outcome)
    return await _apply(ctx, intent, status, start, ms, taken=taken, batch=batch)


async def _finished(ctx: OutboundContext, taken: tuple[str, str] | None, batch: RedisBatcher | None,
                    outcome: VerificationOutcome) -> VerificationOutcome:
    """`outcome`, once the lane's taken challenge (if any) is finished and the outcome counted."""
    if taken is not None:
        await store.finish_challenge(ctx.redis, *taken, outcome.result, batch=batch)
    return outcome


async def bounded_replay(ctx: OutboundContext, intent: Intent,
                         start: tuple[str, str] | None) -> tuple[tuple[str, str] | None, bool, int]:
    """(start, is a replay, entries it re-sends) for a subscribe asking for rsnotify.replay_from.

    Any client may ask, so what a replay re-sends (entries before where the subscription would
    start anyway: the log's end for a new one, its cursor for a renewal) is held within
    --replay-max over the subscription's life: past it the replay starts later, or not at all.
    Asking for a sequence past that point only moves the start forward, which re-sends nothing;
    one past the log's end is no replay at all: the subscription goes on from where it would
    anyway (the end, read before the activation lands, could be behind a delivery made meanwhile,
    which would then be sent twice, and ahead of what a renewal has not had yet).
    """
    limit = ctx.settings.replay_max
    if limit == 0:  # the extension is off
        return start, False, 0
    replayed, cursor_seq = await store.replay_state(ctx.redis, keys.subscription_id(intent.topic, intent.callback))
    baseline = cursor_seq if cursor_seq is not None else int(start[1]) if start else 0
    first = intent.replay_from
    if limit > 0:
        first = max(first, baseline - max(0, limit - replayed) + 1)
        if first > baseline and first > intent.replay_from:  # the bound leaves nothing to re-send
            log.info("replay of %s for %s not granted: --replay-max %d reached (%d re-sent)",
                     escape(intent.topic), redact_callback(intent.callback), limit, replayed)
            return start, False, 0
    moved = await store.replay_start(ctx.redis, intent.topic, first)
    if moved is None:                     # past the log's end: nothing to re-send
        return start, False, 0
    return moved, True, max(0, baseline - int(moved[1]))


async def _get_echo(ctx: OutboundContext, intent: Intent, url: URL, challenge: str) -> tuple[int | None, str]:
    """(status, refusal reason or "") of the verification GET; redirects are never followed."""
    expected = challenge.encode("ascii")
    # one byte past the challenge is enough to tell a longer body from the echo
    answer = await ctx.outbound.request("GET", url, IDENTITY, b"", _limits(ctx, len(expected) + 1))
    status, body = answer.status, answer.body
    if status is None:
        return None, _unreachable(answer)
    if not 200 <= status < 300:
        return status, f"callback answered {status}; expected 2xx with the challenge"
    if body != expected:
        return status, f"callback answered {status} with a body that is not the challenge ({len(body)} bytes)"
    return status, ""


async def _apply(ctx: OutboundContext, intent: Intent, status: int | None, start: tuple[str, str] | None,
                 ms: float | None = None, *, taken: tuple[str, str] | None = None,
                 batch: RedisBatcher | None = None) -> VerificationOutcome:
    if intent.mode == "subscribe":
        replay, replayed = False, 0
        if intent.replay_from > 0:      # rsnotify.replay_from: deliver from that sequence (also on renewal)
            start, replay, replayed = await bounded_replay(ctx, intent, start)
        sid, is_new = await store.activate_subscription(
            ctx.redis, intent.topic, intent.callback, secret=intent.secret,
            lease_seconds=intent.lease_seconds, now=ctx.now(), start=start, replay=replay, replayed=replayed,
            taken=taken, batch=batch)
        outcome = VerificationOutcome(intent.mode, intent.topic, intent.callback,
                                      "activated" if is_new else "renewed", status, subscription_id=sid)
    else:
        sid = keys.subscription_id(intent.topic, intent.callback)
        # on the same batch as the activations: an unsubscribe answered after a subscribe of the
        # same callback is applied after it, as the answers came
        await store.remove_subscription(ctx.redis, sid, batch=batch)
        outcome = await _finished(ctx, taken, batch, VerificationOutcome(
            intent.mode, intent.topic, intent.callback, "unsubscribed", status, subscription_id=sid))
    if log.isEnabledFor(logging.INFO):     # its arguments cost as much as the line: none below INFO
        log.info("subscription %s %s: %s for %s (lease %ss)", sid, outcome.result, redact_callback(intent.callback),
                 escape(intent.topic), intent.lease_seconds if intent.mode == "subscribe" else "-",
                 extra=delivery_fields(sid, status=status, ms=ms))
    return outcome


async def verify_pending(ctx: OutboundContext) -> list[VerificationOutcome]:
    """Verify every challenge lined up by the hub (store.queue_intent), VERIFY_CONCURRENCY at once.

    The "job queued" flag is cleared first, so a request lined up while this runs queues the
    next job and is never left waiting.
    """
    await store.clear_verify_queued(ctx.redis)
    outcomes: list[VerificationOutcome] = []
    gate = asyncio.Semaphore(VERIFY_CONCURRENCY)

    async def one(challenge: str) -> VerificationOutcome:
        async with gate:
            return await verify_intent(ctx, challenge)

    for _ in range(VERIFY_MAX_BATCHES):
        challenges = await store.take_pending_challenges(ctx.redis, VERIFY_BATCH)
        if not challenges:
            break
        outcomes.extend(await asyncio.gather(*(one(c) for c in challenges)))
    return outcomes


async def send_denial(ctx: OutboundContext, intent: Intent) -> VerificationOutcome:
    """Tell the callback its request was refused: hub.mode=denied, hub.topic, hub.reason.

    The callback's answer does not matter; a callback the guard refuses is not contacted.
    """
    url = callback_url(intent.callback, {"hub.mode": "denied", "hub.topic": intent.topic, "hub.reason": intent.reason})
    answer = await ctx.outbound.request("GET", url, IDENTITY, b"", _limits(ctx, DENIAL_MAX_BODY))
    status = answer.status
    if status is None:
        why = _unreachable(answer)
        log.warning("denial of %s for %s not delivered: %s", redact_callback(intent.callback),
                    escape(intent.topic), redact_in(why, intent.callback),
                    extra=delivery_fields(keys.subscription_id(intent.topic, intent.callback)))
        return VerificationOutcome("denied", intent.topic, intent.callback, "denial-failed", None, why)
    log.info("denied %s for %s (%s): callback answered %s", redact_callback(intent.callback), escape(intent.topic),
             escape(intent.reason), status,
             extra=delivery_fields(keys.subscription_id(intent.topic, intent.callback), status=status))
    return VerificationOutcome("denied", intent.topic, intent.callback, "denial-sent", status, intent.reason)


async def sweep_expired(ctx: Any) -> int:
    """Remove every subscription whose lease ended before ctx.now(); returns how many went."""
    now = ctx.now()
    removed = 0
    for _ in range(SWEEP_MAX_BATCHES):
        sids = await store.expired_subscriptions(ctx.redis, now, limit=SWEEP_BATCH)
        if not sids:
            break
        for sid in sids:
            if await store.remove_subscription(ctx.redis, sid, if_expired_at=now):
                removed += 1
                log.info("subscription %s expired and was removed", sid)
        if len(sids) < SWEEP_BATCH:
            break
    return removed


def _unreachable(answer: Answer) -> str:
    """Why a GET got no answer: the guard's message as it is, anything else as unreachable."""
    return answer.error if answer.is_refused else f"callback unreachable: {answer.error}"


def _limits(ctx: OutboundContext, max_body: int) -> Limits:
    return _bounds(ctx.settings.connect_timeout, ctx.settings.fetch_timeout, max_body)


@functools.lru_cache(maxsize=32)
def _bounds(connect: float, total: float, max_body: int) -> Limits:
    # one (frozen) object per setting and body size for the process, not one per verification
    return Limits(connect_timeout=connect, total_timeout=total, max_body=max_body)

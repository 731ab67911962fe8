"""Every Redis operation of the hub outside a delivery claim: topics and their logs,
subscriptions, leases, intents, dead letters, counters (worker/claims.py holds the claims).

Keys come from hub/keys.py. Functions take a `redis.asyncio.Redis` client (created with
decode_responses=False) and do few round trips: multi-key updates are Lua scripts or MULTI
pipelines. No HTTP here.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis as redis_sync
from redis.asyncio import Redis

from .keys import (
    PREFIX,
    activity_key,
    delivery_keys,
    diagnostics_sent_key,
    diagnostics_token_key,
    due_key,
    intent_key,
    key_check_key,
    leases_key,
    rq_keys,
    rq_workers_key,
    stats_key,
    sub_attempts_key,
    sub_dead_body_key,
    sub_dead_key,
    sub_key,
    sub_resend_key,
    subscription_id,
    topic_id,
    topic_key,
    topic_log_key,
    topic_seq_key,
    topic_subs_key,
    topics_key,
    verification_field,
    verify_pending_key,
    verify_queued_key,
)
from .lua import Script
from .records import (
    RECENT_ATTEMPTS,
    AppendedNotification,
    Attempt,
    DeadLetter,
    Intent,
    LogEntry,
    Subscription,
    text,
    to_int,
)

# --- intents ------------------------------------------------------------------------------


async def store_intent(redis: Redis, challenge: str, intent: Intent, ttl: int) -> None:
    """Keep a pending intent under its challenge for `ttl` seconds (one round trip)."""
    key = intent_key(challenge)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=intent.to_hash())
        pipe.expire(key, ttl)
        await pipe.execute()


VERIFY_QUEUED_TTL = 60  # s; a lost verify_pending job is replaced by the next request after this


async def queue_intent(redis: Redis, challenge: str, intent: Intent, ttl: int) -> bool:
    """Keep the intent and line its challenge up for verification, in one round trip.

    Returns True when no verify_pending job was queued: the caller must queue one. A burst
    of requests thus queues one job, which verifies the whole line concurrently.
    """
    key = intent_key(challenge)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=intent.to_hash())
        pipe.expire(key, ttl)
        pipe.rpush(verify_pending_key(), challenge)
        pipe.set(verify_queued_key(), 1, nx=True, ex=VERIFY_QUEUED_TTL)
        *_, must_queue = await pipe.execute()
    return bool(must_queue)


async def take_pending_challenges(redis: Redis, limit: int) -> list[str]:
    """Up to `limit` challenges from the head of the line (each is taken once)."""
    taken = await redis.lpop(verify_pending_key(), limit)
    return [text(c) for c in taken or []]


async def pending_verifications(redis: Redis) -> int:
    return int(await redis.llen(verify_pending_key()))


async def take_intent(redis: Redis, challenge: str) -> Intent | None:
    """The intent stored under `challenge`, deleted in the same transaction (single use)."""
    key = intent_key(challenge)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(key)
        pipe.delete(key)
        raw, _ = await pipe.execute()
    return Intent.from_hash(raw) if raw else None


# --- subscriptions ------------------------------------------------------------------------

# KEYS: sub, topic subs, leases, log, topics, topic, seq
# ARGV: sid, topic, callback, tid, secret, lease_seconds, expires, now[, start cursor, start seq]
# A new subscription's cursor is the log's end when its verification was sent (ARGV 9-10, see
# log_end), else its current end, so it gets everything published after the subscriber said
# yes; a renewal keeps its cursor and delivery state. Returns 1 when new.
_ACTIVATE = Script("""
local is_new = redis.call('EXISTS', KEYS[1]) == 0
if is_new then
  local cursor, cursor_seq = ARGV[9], ARGV[10]
  if not cursor then
    local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
    cursor = '0-0'
    if #last > 0 then cursor = last[1][1] end
    cursor_seq = redis.call('GET', KEYS[7]) or '0'
  end
  redis.call('HSET', KEYS[1], 'topic', ARGV[2], 'callback', ARGV[3], 'tid', ARGV[4],
             'created', ARGV[8], 'state', 'active', 'cursor', cursor, 'cursor_seq', cursor_seq)
end
redis.call('HSET', KEYS[1], 'secret', ARGV[5], 'lease_seconds', ARGV[6], 'expires', ARGV[7])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[1])
if redis.call('SADD', KEYS[5], ARGV[4]) == 1 then
  redis.call('HSET', KEYS[6], 'url', ARGV[2], 'created', ARGV[8])
end
if is_new then return 1 end
return 0
""")

# KEYS: sub, leases, due, then every per-subscription key to delete (delivery_keys)
# ARGV: sid, topic-subs key prefix, topic-subs key suffix[, now]
# With `now`, only a subscription still expired at that moment goes (a renewal may have raced).
_REMOVE = Script("""
if ARGV[4] then
  local expires = tonumber(redis.call('HGET', KEYS[1], 'expires') or '0')
  if expires >= tonumber(ARGV[4]) then return 0 end
end
local tid = redis.call('HGET', KEYS[1], 'tid')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
for i = 4, #KEYS do redis.call('DEL', KEYS[i]) end
if not tid then return 0 end
redis.call('SREM', ARGV[2] .. tid .. ARGV[3], ARGV[1])
redis.call('DEL', KEYS[1])
return 1
""")


async def activate_subscription(
    redis: Redis, topic: str, callback: str, *, secret: str, lease_seconds: int, now: float,
    start: tuple[str, str] | None = None,
) -> tuple[str, bool]:
    """Create or renew the verified subscription (topic, callback) in one script call.

    `secret` is the Fernet token of the new secret, or "" to drop it: a verified renewal
    replaces the secret. `start` is the (cursor, cursor_seq) a new subscription starts from
    (`log_end` taken before the verification GET); None means the log's end now.
    Returns (subscription id, is_new).
    """
    sid, tid = subscription_id(topic, callback), topic_id(topic)
    expires = int(now) + lease_seconds
    keys = [sub_key(sid), topic_subs_key(tid), leases_key(), topic_log_key(tid), topics_key(), topic_key(tid),
            topic_seq_key(tid)]
    args: list[Any] = [sid, topic, callback, tid, secret, lease_seconds, expires, int(now), *(start or ())]
    is_new = await _ACTIVATE(redis, keys, args)
    return sid, bool(is_new)


async def log_end(redis: Redis, topic: str) -> tuple[str, str]:
    """(last entry id or "0-0", its sequence number) of the topic's log, read atomically."""
    tid = topic_id(topic)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.xrevrange(topic_log_key(tid), "+", "-", count=1)
        pipe.get(topic_seq_key(tid))
        last, seq = await pipe.execute()
    return (text(last[0][0]) if last else "0-0"), text(seq, "0")


async def remove_subscription(redis: Redis, sid: str, *, if_expired_at: float | None = None) -> bool:
    """Remove a subscription (unsubscribe, expiry, 410, admin): hash, topic set, lease, delivery keys.

    With `if_expired_at`, remove it only if its lease ended before that time (the sweep).
    Returns False when nothing was removed. Safe to call twice.
    """
    keys = [sub_key(sid), leases_key(), due_key(), *delivery_keys(sid)]
    args: list[Any] = [sid, f"{PREFIX}topic:", ":subs"]
    if if_expired_at is not None:
        args.append(int(if_expired_at))
    return bool(await _REMOVE(redis, keys, args))


async def get_subscription(redis: Redis, sid: str) -> Subscription | None:
    raw = await redis.hgetall(sub_key(sid))
    return Subscription.from_hash(sid, raw) if raw else None


async def expired_subscriptions(redis: Redis, now: float, limit: int = 1000) -> list[str]:
    """Ids of subscriptions whose lease ended before `now`, oldest first (at most `limit`)."""
    sids = await redis.zrangebyscore(leases_key(), "-inf", f"({int(now)}", start=0, num=limit)
    return [text(s) for s in sids]


async def count_subscriptions(redis: Redis) -> int:
    return int(await redis.zcard(leases_key()))


# --- topic logs ---------------------------------------------------------------------------

# KEYS: log, seq, topics, topic, stats, activity ; ARGV: body, ctype, rs, at_ms, maxlen, tid, url, now_s
# seq and the stream id are assigned together, so both grow in the same order. The counters for
# /metrics and the status page ride in the same call (ops: hub/metrics.py reads them).
_APPEND = Script("""
local seq = redis.call('INCR', KEYS[2])
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*',
                      'body', ARGV[1], 'ctype', ARGV[2], 'rs', ARGV[3], 'seq', seq, 'at', ARGV[4])
if redis.call('SADD', KEYS[3], ARGV[6]) == 1 then
  redis.call('HSET', KEYS[4], 'url', ARGV[7], 'created', ARGV[8])
end
redis.call('HINCRBY', KEYS[5], 'publishes', 1)
redis.call('HINCRBY', KEYS[5], 'publish_bytes', string.len(ARGV[1]))
redis.call('ZINCRBY', KEYS[6], 1, ARGV[6]); redis.call('ZINCRBY', KEYS[6], 1, '*')
redis.call('EXPIRE', KEYS[6], 3720)
return {id, seq}
""")



async def append_notification(
    redis: Redis, topic: str, body: bytes, *, content_type: str, resourcesync: str = "",
    now: float, max_len: int,
) -> AppendedNotification:
    """Append the exact `body` and the headers to relay to the topic's log (one script call)."""
    tid = topic_id(topic)
    keys = [topic_log_key(tid), topic_seq_key(tid), topics_key(), topic_key(tid), stats_key(),
            activity_key(int(now) // 60)]
    args = [body, content_type, resourcesync, int(now * 1000), max_len, tid, topic, int(now)]
    entry_id, seq = await _APPEND(redis, keys, args)
    return AppendedNotification(text(entry_id), tid, int(seq))



# the subscription (no earlier than a pending retry). Returns how many were queued.
_RESEND = Script("""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local queued = 0
for i = 3, #ARGV do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 and not redis.call('LPOS', KEYS[3], ARGV[i]) then
    redis.call('RPUSH', KEYS[3], ARGV[i]); queued = queued + 1
  end
end
redis.call('HSET', KEYS[1], 'resend', redis.call('LLEN', KEYS[3]))
local due = math.max(tonumber(ARGV[2]), tonumber(redis.call('HGET', KEYS[1], 'retry_at') or '0'))
if queued > 0 then redis.call('ZADD', KEYS[4], due, ARGV[1]) end
return queued
""")

# KEYS: sub, due ; ARGV: sid, state (paused|active), now. Resuming clears any backoff and wakes it.
_SET_STATE = Script("""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
if ARGV[2] == 'active' then
  redis.call('HSET', KEYS[1], 'next_attempt', 0, 'retry_at', 0)
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
end
return 1
""")

# KEYS: due ; ARGV: now, limit. Take the subscriptions whose next attempt is due.
_POP_DUE = Script("""
local sids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #sids > 0 then redis.call('ZREM', KEYS[1], unpack(sids)) end
return sids
""")




async def list_dead_letters(redis: Redis, sid: str) -> list[DeadLetter]:
    """The subscription's dead letters, oldest notification first."""
    raw = await redis.hgetall(sub_dead_key(sid))
    return sorted((DeadLetter.from_json(v) for v in raw.values()), key=lambda d: d.sequence)


async def dead_letter_body(redis: Redis, sid: str, nid: str) -> bytes | None:
    """The exact body of one dead letter (None when there is no such dead letter)."""
    body: Any = await redis.hget(sub_dead_body_key(sid), nid)
    return body


async def resend_dead_letter(redis: Redis, sid: str, nid: str, *, now: float | None = None) -> bool:
    """Queue one dead letter for re-sending (before the subscription's next log entries).

    A worker picks it up within a fraction of a second (through due_key()); a 2xx removes the
    dead letter, a failure retries it like any delivery and, when attempts run out, it stays
    dead. False when the subscription or the dead letter does not exist (or it is queued already).
    """
    keys = [sub_key(sid), sub_dead_key(sid), sub_resend_key(sid), due_key()]
    return bool(await _RESEND(redis, keys, [sid, time.time() if now is None else now, nid]))


async def resend_all_dead_letters(redis: Redis, sid: str, *, now: float | None = None) -> int:
    """Queue every dead letter of the subscription for re-sending, oldest first; returns how many."""
    letters = await list_dead_letters(redis, sid)
    if not letters:
        return 0
    keys = [sub_key(sid), sub_dead_key(sid), sub_resend_key(sid), due_key()]
    args: list[object] = [sid, time.time() if now is None else now]
    return int(await _RESEND(redis, keys, args + [d.notification_id for d in letters]))


async def pause_subscription(redis: Redis, sid: str) -> bool:
    """Stop deliveries to the subscription (its cursor stays) until resumed. False when unknown."""
    return bool(await _SET_STATE(redis, [sub_key(sid), due_key()], [sid, "paused", 0]))


async def resume_subscription(redis: Redis, sid: str, *, now: float | None = None) -> bool:
    """Resume deliveries now (any retry backoff is cleared). False when the subscription is unknown."""
    now = time.time() if now is None else now
    return bool(await _SET_STATE(redis, [sub_key(sid), due_key()], [sid, "active", now]))


async def recent_attempts(redis: Redis, sid: str, limit: int = RECENT_ATTEMPTS) -> list[Attempt]:
    """The subscription's last failed delivery attempts (retry, gone, dead), newest first; the
    last attempt of any outcome is in the sub hash (last_status, last_latency_ms, last_outcome...)."""
    raw = await redis.lrange(sub_attempts_key(sid), 0, limit - 1)
    return [Attempt.from_json(r) for r in raw]


async def subscription_backlog(redis: Redis, sid: str) -> int:
    """How many notifications of its topic the subscription has not confirmed yet."""
    tid, cursor_seq, cursor = await redis.hmget(sub_key(sid), "tid", "cursor_seq", "cursor")
    if not tid:
        return 0
    log_key, cursor_text = topic_log_key(text(tid)), text(cursor, "0-0")
    async with redis.pipeline(transaction=False) as pipe:
        pipe.get(topic_seq_key(text(tid)))
        pipe.xrange(log_key, cursor_text, cursor_text, count=1)
        pipe.xrange(log_key, "-", "+", count=1)
        last_seq, at_cursor, first = await pipe.execute()
    if cursor_seq is not None:
        done = to_int(cursor_seq)
    elif at_cursor:            # nothing delivered yet: the seq of the entry it started after
        done = to_int(at_cursor[0][1].get(b"seq"))
    elif first:                # that entry was trimmed: everything still in the log is due
        done = to_int(first[0][1].get(b"seq")) - 1
    else:
        done = to_int(last_seq)
    return max(0, to_int(last_seq) - done)


async def pop_due(redis: Redis, now: float, limit: int = 500) -> list[str]:
    """Take (remove and return) the subscriptions whose next attempt is due at `now`."""
    return [text(s) for s in await _POP_DUE(redis, [due_key()], [now, limit])]


def pop_due_sync(connection: redis_sync.Redis, now: float, limit: int = 500) -> list[str]:
    """pop_due on a synchronous client (the workers' maintenance runs in a thread)."""
    return [text(s) for s in _POP_DUE.run_sync(connection, [due_key()], [repr(now), limit])]


async def delivery_stats(redis: Redis) -> dict[str, float]:
    """Hub-wide delivery counters and latency histograms, as written by the workers.

    Fields: `outcome:<delivered|retry|gone|dead>`, `status:<2xx|3xx|4xx|5xx|error>` (counts);
    for each histogram `delivery_seconds` (one POST) and `publish_to_delivery_seconds` (publish
    to confirmed delivery): `<name>:le:<bound>` per bucket of LATENCY_BUCKETS plus `<name>:le:+Inf`
    (non-cumulative counts), `<name>:sum` and `<name>:count`.
    """
    raw = await redis.hgetall(stats_key())
    return {text(k): float(v) for k, v in raw.items()}


async def delete_delivery_state(redis: Redis, sid: str) -> None:
    """Delete the subscription's per-subscription delivery keys (after it ended with a 410)."""
    await redis.delete(*delivery_keys(sid))


# --- counters ---------------------------------------------------------------------------------


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


# --- what /health, /metrics and the status page read about the queue ------------------------


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


# --- what operators browse (admin API, status page, diagnostics) -----------------------------


async def topic_ids(redis: Redis) -> list[str]:
    """Every topic id, sorted."""
    return sorted(text(t) for t in await redis.smembers(topics_key()))


async def topic_subscription_ids(redis: Redis, tid: str) -> list[str]:
    """The ids of the topic's active subscriptions, sorted."""
    return sorted(text(s) for s in await redis.smembers(topic_subs_key(tid)))


async def subscription_ids_by_lease(redis: Redis, offset: int, limit: int) -> list[str]:
    """Subscription ids in lease-end order (soonest first), `limit` of them from `offset`."""
    return [text(s) for s in await redis.zrange(leases_key(), offset, offset + limit - 1)]


async def get_notification(redis: Redis, tid: str, nid: str) -> LogEntry | None:
    """One entry of the topic's log (None when it was never there, or was trimmed)."""
    found: list[Any] = await redis.xrange(topic_log_key(tid), nid, nid, count=1) or []
    return LogEntry.from_stream(*found[0]) if found else None


async def get_dead_letter(redis: Redis, sid: str, nid: str) -> DeadLetter | None:
    """One dead letter's record (None when there is no such dead letter)."""
    meta = await redis.hget(sub_dead_key(sid), nid)
    return None if meta is None else DeadLetter.from_json(meta)


async def count_topics(redis: Redis) -> int:
    return int(await redis.scard(topics_key()))


async def subscription_secret(redis: Redis, sid: str) -> bytes | None:
    """The stored (encrypted) secret of the subscription; None or b"" when it has none."""
    secret: Any = await redis.hget(sub_key(sid), "secret")
    return secret


async def diagnostics_token_digest(redis: Redis, sid: str) -> str | None:
    """The sha256 hex of the subscription's current diagnostics token (None: none, or expired)."""
    stored = await redis.get(diagnostics_token_key(sid))
    return None if stored is None else text(stored)


async def mark_diagnostics_link_sent(redis: Redis, sid: str, interval: int) -> bool:
    """True when no diagnostics link went to the callback within `interval` s (and now one may)."""
    return bool(await redis.set(diagnostics_sent_key(sid), 1, nx=True, ex=interval))


async def keep_diagnostics_token(redis: Redis, sid: str, digest: str, ttl: int) -> None:
    """Keep the digest of a new diagnostics token for `ttl` s (the previous token stops working)."""
    await redis.set(diagnostics_token_key(sid), digest, ex=ttl)


async def clear_verify_queued(redis: Redis) -> None:
    """A verify_pending job started: requests lined up from now on queue the next one."""
    await redis.delete(verify_queued_key())


async def key_check_token(redis: Redis, proposed: bytes) -> bytes | None:
    """The token recording which secret key this Redis's secrets use (`proposed` on first use)."""
    await redis.set(key_check_key(), proposed, nx=True)
    token: Any = await redis.get(key_check_key())
    return token

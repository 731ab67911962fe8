"""Verified subscriptions: activation (create or renew), removal, lookups, pause and resume, backlog."""
from __future__ import annotations

import time
from typing import Any

from redis.asyncio import Redis

from ..batch import RedisBatcher
from ..keys import (
    delivery_keys,
    due_key,
    intent_key,
    leases_key,
    renewals_key,
    stats_key,
    sub_key,
    sub_lock_key,
    subscription_id,
    topic_id,
    topic_key,
    topic_log_key,
    topic_seq_key,
    topic_subs_changes_key,
    topic_subs_key,
    topics_key,
    verification_field,
    verify_taken_key,
)
from ..lua import Script
from ..records import (
    Subscription,
    parse_entry_id,
    text,
    to_int,
)

# KEYS: sub, topic subs, leases, log, topics, topic, seq, due, lock, topic subs changes, renewals[, taken, intent,
#       stats]
# ARGV: sid, topic, callback, tid, secret, lease_seconds, expires, now, start cursor, start seq, replay,
# replayed[, challenge, counter field if new, counter field if renewed]: `replayed`, the entries a replay
# re-sends, is added to the subscription's count of them ("" for none).
# A new subscription's cursor is the log's end when its verification was sent (ARGV 9-10, see
# log_end; "" for none), else its current end, so it gets everything published after the subscriber
# said yes (due at once when that leaves it behind the log); a renewal keeps its cursor and delivery state, but a retry it was backing off from is
# due now: the subscriber just answered, so waiting out the backoff helps nobody.
# With the taken-challenge keys (a worker's verification lane) the same step also ends the challenge
# (out of the worker's taken list, its intent deleted: single use) and counts the outcome, so an
# activation and its challenge's end can never be seen apart. A renewal that sets, changes or drops
# the secret bumps the renewals counter: a worker holding the subscription between publishes (a
# busy topic) signs with the secret it read when it took it, and re-reads it when the counter moves
# (worker/deliveries.py). Returns 1 when new.
_ACTIVATE = Script("""
local is_new = redis.call('EXISTS', KEYS[1]) == 0
if is_new then
  local cursor, cursor_seq = ARGV[9], ARGV[10]
  if cursor == '' then
    local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
    cursor = '0-0'
    if #last > 0 then cursor = last[1][1] end
    cursor_seq = redis.call('GET', KEYS[7]) or '0'
  end
  redis.call('HSET', KEYS[1], 'topic', ARGV[2], 'callback', ARGV[3], 'tid', ARGV[4],
             'created', ARGV[8], 'state', 'active', 'cursor', cursor, 'cursor_seq', cursor_seq)
  -- a new subscription behind the log (a replay, or publishes while it was being verified) is
  -- due now: no fan-out is queued for entries stored before it existed, and the reconciler
  -- would leave it waiting reconcile_interval or more
  local newest = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
  if #newest > 0 and newest[1][1] ~= cursor then redis.call('ZADD', KEYS[8], ARGV[8], ARGV[1]) end
elseif ARGV[11] == '1' then
  -- a replay asked for on renewal: the cursor moves to it, a run holding the subscription loses
  -- its claim (so it cannot write its own cursor back), and a worker takes it up now
  redis.call('HSET', KEYS[1], 'cursor', ARGV[9], 'cursor_seq', ARGV[10], 'retry_at', ARGV[8], 'next_attempt', 0)
  redis.call('DEL', KEYS[9])
  redis.call('ZADD', KEYS[8], ARGV[8], ARGV[1])
else
  local state = redis.call('HGET', KEYS[1], 'state') or 'active'
  if state == 'active' and tonumber(redis.call('HGET', KEYS[1], 'retry_at') or '0') > tonumber(ARGV[8]) then
    redis.call('HSET', KEYS[1], 'retry_at', ARGV[8], 'next_attempt', 0)
    redis.call('ZADD', KEYS[8], ARGV[8], ARGV[1])
  end
end
if not is_new and ((redis.call('HGET', KEYS[1], 'secret') or '') ~= '' or ARGV[5] ~= '') then
  redis.call('INCR', KEYS[11])
end
redis.call('HSET', KEYS[1], 'secret', ARGV[5], 'lease_seconds', ARGV[6], 'expires', ARGV[7])
if ARGV[12] ~= '' then redis.call('HINCRBY', KEYS[1], 'replayed', ARGV[12]) end
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then redis.call('INCR', KEYS[10]) end
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[1])
if redis.call('SADD', KEYS[5], ARGV[4]) == 1 then
  redis.call('HSET', KEYS[6], 'url', ARGV[2], 'created', ARGV[8])
end
if KEYS[12] then
  redis.call('LREM', KEYS[12], 1, ARGV[13])
  redis.call('DEL', KEYS[13])
  redis.call('HINCRBY', KEYS[14], is_new and ARGV[14] or ARGV[15], 1)
end
if is_new then return 1 end
return 0
""")


# KEYS: sub, leases, due, then every per-subscription key to delete (delivery_keys)
# ARGV: sid, topic-subs key prefix and suffix, topic-subs-changes key prefix and suffix[, now]
# With `now`, only a subscription still expired at that moment goes (a renewal may have raced).
_REMOVE = Script("""
if ARGV[6] then
  local expires = tonumber(redis.call('HGET', KEYS[1], 'expires') or '0')
  if expires >= tonumber(ARGV[6]) then return 0 end
end
local tid = redis.call('HGET', KEYS[1], 'tid')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
for i = 4, #KEYS do redis.call('DEL', KEYS[i]) end
if not tid then return 0 end
if redis.call('SREM', ARGV[2] .. tid .. ARGV[3], ARGV[1]) == 1 then
  redis.call('INCR', ARGV[4] .. tid .. ARGV[5])
end
redis.call('DEL', KEYS[1])
return 1
""")


async def activate_subscription(
    redis: Redis, topic: str, callback: str, *, secret: str, lease_seconds: int, now: float,
    start: tuple[str, str] | None = None, replay: bool = False, replayed: int = 0,
    taken: tuple[str, str] | None = None, batch: RedisBatcher | None = None,
) -> tuple[str, bool]:
    """Create or renew the verified subscription (topic, callback) in one script call.

    `secret` is the Fernet token of the new secret, or "" to drop it: a verified renewal
    replaces the secret. `start` is the (cursor, cursor_seq) a new subscription starts from
    (`log_end` taken before the verification GET); None means the log's end now. With
    `replay` (and a `start` from replay_start) a renewal starts from there too, and `replayed`
    (the entries that re-sends) is added to the subscription's count (see replay_state).

    `taken` is (worker id, challenge) when a worker's verification lane took the challenge: it is
    finished (store.finish_challenge) and the outcome counted in the same script. With `batch` the
    call rides in the pipeline of the calls issued meanwhile. Returns (subscription id, is_new).
    """
    sid, tid = subscription_id(topic, callback), topic_id(topic)
    expires = int(now) + lease_seconds
    keys = [sub_key(sid), topic_subs_key(tid), leases_key(), topic_log_key(tid), topics_key(), topic_key(tid),
            topic_seq_key(tid), due_key(), sub_lock_key(sid), topic_subs_changes_key(tid), renewals_key()]
    args: list[Any] = [sid, topic, callback, tid, secret, lease_seconds, expires, int(now), *(start or ("", ""))]
    args += ["1", max(0, replayed)] if replay and start is not None else ["0", ""]
    if taken is not None:
        wid, challenge = taken
        keys += [verify_taken_key(wid), intent_key(challenge), stats_key()]
        args += [challenge, verification_field("activated"), verification_field("renewed")]
    is_new = await (batch.script(_ACTIVATE, keys, args) if batch is not None else _ACTIVATE(redis, keys, args))
    return sid, bool(is_new)


# KEYS: log, seq. The log's last entry id ("0-0" when empty) and the topic's sequence, read in one
# step (no append can fall between them).
_LOG_END = Script("""
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local id = '0-0'
if #last > 0 then id = last[1][1] end
return {id, redis.call('GET', KEYS[2]) or '0'}
""")


async def log_end(redis: Redis, topic: str, *, batch: RedisBatcher | None = None) -> tuple[str, str]:
    """(last entry id or "0-0", its sequence number) of the topic's log, read atomically (with
    `batch`, in the pipeline of the calls issued meanwhile)."""
    tid = topic_id(topic)
    keys = [topic_log_key(tid), topic_seq_key(tid)]
    last, seq = await (batch.script(_LOG_END, keys, []) if batch is not None else _LOG_END(redis, keys, []))
    return text(last), text(seq, "0")


async def replay_state(redis: Redis, sid: str) -> tuple[int, int | None]:
    """(entries re-sent so far for rsnotify.replay_from, cursor sequence) of a subscription;
    (0, None) when there is none yet."""
    replayed, cursor_seq, topic = await redis.hmget(sub_key(sid), "replayed", "cursor_seq", "topic")
    if topic is None:
        return 0, None
    return to_int(replayed), to_int(cursor_seq)


async def replay_start(redis: Redis, topic: str, first: int) -> tuple[str, str] | None:
    """(cursor, cursor_seq) from which sequence `first` of the topic's log is delivered next: just
    before it while the log holds it; the log's oldest entry when it was trimmed (the subscriber
    sees the jump); None when `first` is past the log's end (nothing to re-send). Sequence numbers
    have no holes, so the entry before `first` is found by a binary search over the entry ids (a
    replay is rare)."""
    log = topic_log_key(topic_id(topic))
    async with redis.pipeline(transaction=True) as pipe:
        pipe.xrange(log, "-", "+", count=1)
        pipe.xrevrange(log, "+", "-", count=1)
        oldest, newest = await pipe.execute()
    if not oldest:
        return None
    low_id, low_seq = _entry(oldest[0])
    high_id, high_seq = _entry(newest[0])
    if first > high_seq:
        return None
    if first <= low_seq:
        return "0-0", str(low_seq - 1)
    # the last entry with a sequence below `first`: its millisecond first, then its place in it
    lo, hi = parse_entry_id(low_id)[0], parse_entry_id(high_id)[0]
    best_id, best_seq = low_id, low_seq
    while lo <= hi:
        middle = (lo + hi) // 2
        found: Any = await redis.xrange(log, f"{middle}-0", "+", count=1)
        entry_id, seq = _entry(found[0])
        if seq < first:
            best_id, best_seq = entry_id, seq
            lo = parse_entry_id(entry_id)[0] + 1
        else:
            hi = middle - 1
    if best_seq < first - 1:
        after: Any = await redis.xrange(log, f"({best_id}", "+", count=first - 1 - best_seq)
        best_id, best_seq = _entry(after[-1])
    return best_id, str(best_seq)


def _entry(raw: Any) -> tuple[str, int]:
    entry_id, fields = raw
    return text(entry_id), to_int(fields.get(b"seq"))


# a topic's subscription set and its change counter around the topic id, for the script that
# learns the topic id only from the subscription's hash
_TOPIC_SUBS = tuple(topic_subs_key("|").split("|"))
_TOPIC_SUBS_CHANGES = tuple(topic_subs_changes_key("|").split("|"))


async def remove_subscription(redis: Redis, sid: str, *, if_expired_at: float | None = None,
                              batch: RedisBatcher | None = None) -> bool:
    """Remove a subscription (unsubscribe, expiry, 410, admin): hash, topic set, lease, delivery keys.

    With `if_expired_at`, remove it only if its lease ended before that time (the sweep). With
    `batch`, in the pipeline of the calls issued meanwhile: after any activation issued before it
    on the same batch, so a verification lane applies its answers in the order they came.
    Returns False when nothing was removed. Safe to call twice.
    """
    keys = [sub_key(sid), leases_key(), due_key(), *delivery_keys(sid)]
    args: list[Any] = [sid, *_TOPIC_SUBS, *_TOPIC_SUBS_CHANGES]
    if if_expired_at is not None:
        args.append(int(if_expired_at))
    return bool(await (batch.script(_REMOVE, keys, args) if batch is not None else _REMOVE(redis, keys, args)))


async def delete_delivery_state(redis: Redis, sid: str) -> None:
    """Delete the subscription's per-subscription delivery keys (after it ended with a 410)."""
    await redis.delete(*delivery_keys(sid))


async def get_subscription(redis: Redis, sid: str) -> Subscription | None:
    raw = await redis.hgetall(sub_key(sid))
    return Subscription.from_hash(sid, raw) if raw else None


async def subscription_secret(redis: Redis, sid: str) -> bytes | None:
    """The stored (encrypted) secret of the subscription; None or b"" when it has none."""
    secret: Any = await redis.hget(sub_key(sid), "secret")
    return secret


async def expired_subscriptions(redis: Redis, now: float, limit: int = 1000) -> list[str]:
    """Ids of subscriptions whose lease ended before `now`, oldest first (at most `limit`)."""
    sids = await redis.zrangebyscore(leases_key(), "-inf", f"({int(now)}", start=0, num=limit)
    return [text(s) for s in sids]


async def count_subscriptions(redis: Redis) -> int:
    return int(await redis.zcard(leases_key()))


async def subscription_ids_by_lease(redis: Redis, offset: int, limit: int) -> list[str]:
    """Subscription ids in lease-end order (soonest first), `limit` of them from `offset`."""
    return [text(s) for s in await redis.zrange(leases_key(), offset, offset + limit - 1)]


async def topic_subscription_ids(redis: Redis, tid: str) -> list[str]:
    """The ids of the topic's active subscriptions, sorted."""
    return sorted(text(s) for s in await redis.smembers(topic_subs_key(tid)))


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


async def pause_subscription(redis: Redis, sid: str) -> bool:
    """Stop deliveries to the subscription (its cursor stays) until resumed. False when unknown."""
    return bool(await _SET_STATE(redis, [sub_key(sid), due_key()], [sid, "paused", 0]))


# KEYS: sub, due ; ARGV: sid, now. An operator's "retry now": the subscription's pending retry is due
# at once (its attempts count on; a paused subscription stays paused). 0 when it is unknown.
_RETRY_NOW = Script("""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'retry_at', ARGV[2], 'next_attempt', 0)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
""")


async def retry_now(redis: Redis, sid: str, *, now: float | None = None) -> bool:
    """Make the subscription's pending retry (if any) due now; False when the subscription is unknown."""
    now = time.time() if now is None else now
    return bool(await _RETRY_NOW(redis, [sub_key(sid), due_key()], [sid, repr(now)]))


async def resume_subscription(redis: Redis, sid: str, *, now: float | None = None) -> bool:
    """Resume deliveries now (any retry backoff is cleared). False when the subscription is unknown."""
    now = time.time() if now is None else now
    return bool(await _SET_STATE(redis, [sub_key(sid), due_key()], [sid, "active", now]))


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

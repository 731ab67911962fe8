"""The delivery claims: each Lua script of fan-out behind one named function.

A worker owns a subscription's deliveries while it holds the subscription's lock (a token
with a TTL, renewed by the keeper); every write of delivery state checks that token in
Redis, so a worker that lost its claim can never move a cursor another worker owns now.
The functions run through the worker's RedisBatcher, so hundreds of concurrent runs share
a few round trips.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..batch import RedisBatcher
from ..keys import (
    PREFIX,
    due_key,
    fanout_followers_key,
    fanout_queued_key,
    renewals_key,
    sub_attempts_key,
    sub_dead_body_key,
    sub_dead_key,
    sub_key,
    sub_lock_key,
    sub_resend_key,
    topic_log_key,
    topic_subs_changes_key,
    topic_subs_key,
    worker_alive_key,
)
from ..lua import Script
from ..records import DELIVERY_FIELDS, RECENT_ATTEMPTS

# Taking a lock (Lua, shared by the claim scripts): free, or held by a worker whose heartbeat ran
# out (a token is "<worker id>:<n>[:<sid>]"; heartbeat.py), so a dead worker's claims move on
# within heartbeat_ttl instead of lock_ttl, while a live but slow worker keeps its own.
_TAKE = """
local function take(lock, token, ttl_ms, alive_prefix, alive_suffix)
  if redis.call('SET', lock, token, 'NX', 'PX', ttl_ms) then return true end
  local holder = redis.call('GET', lock)
  local wid = holder and string.match(holder, '^([^:]+):')
  if wid and redis.call('EXISTS', alive_prefix .. wid .. alive_suffix) == 0 then
    redis.call('SET', lock, token, 'PX', ttl_ms)
    return true
  end
  return false
end
"""

# KEYS: lock, sub, renewals ; ARGV: token, ttl_ms, alive key prefix, alive key suffix.
# The sub's DELIVERY_FIELDS, then the renewals counter as they were read (a renewal that changes
# the secret later moves it: Deliveries re-reads the secret then), once this worker owns it, else false.
CLAIM_SCRIPT = Script(_TAKE + """
if take(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then
  local f = redis.call('HMGET', KEYS[2], 'topic', 'callback', 'tid', 'secret', 'state', 'expires',
                       'cursor', 'cursor_seq', 'attempts', 'retry_at', 'resend')
  f[#f + 1] = redis.call('GET', KEYS[3]) or '0'
  return f
end
return false
""")

# KEYS: locks... ; ARGV: ttl_ms, then each lock's token. 1 per lock still ours (extended), 0 per lost one.
RENEW_SCRIPT = Script("""
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1]); out[i] = 1
  else out[i] = 0 end
end
return out
""")

# KEYS: lock, sub, attempts, due, log
# ARGV: token, release (1/0), sid, recent max, delivered +n, gaps +n, due at ("" = none),
#       n = number of HSET args, the n HSET args (field, value...), then attempt records (JSON).
# The delivery state is written only while the lock is ours: a worker that lost its claim
# must not move a cursor another worker owns now. Attempts are facts and are kept anyway.
# Returns {1, state, expires, log's last id, resend count, retry_at} ; {0} lock lost ; {-1} sub gone.
CHECKPOINT_SCRIPT = Script("""
local owned = redis.call('GET', KEYS[1]) == ARGV[1]
if redis.call('EXISTS', KEYS[2]) == 0 then
  if owned then redis.call('DEL', KEYS[1]) end
  return {-1}
end
local nf = tonumber(ARGV[8])
if #ARGV >= 9 + nf then
  redis.call('LPUSH', KEYS[3], unpack(ARGV, 9 + nf, #ARGV))
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
end
if not owned then return {0} end
if nf > 0 then redis.call('HSET', KEYS[2], unpack(ARGV, 9, 8 + nf)) end
if ARGV[5] ~= '0' then redis.call('HINCRBY', KEYS[2], 'delivered', ARGV[5]) end
if ARGV[6] ~= '0' then redis.call('HINCRBY', KEYS[2], 'gaps', ARGV[6]) end
if ARGV[7] ~= '' then redis.call('ZADD', KEYS[4], ARGV[7], ARGV[3]) end
if ARGV[2] == '1' then redis.call('DEL', KEYS[1]) end
local last = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', 1)
local last_id = ''
if #last > 0 then last_id = last[1][1] end
local info = redis.call('HMGET', KEYS[2], 'state', 'expires', 'resend', 'retry_at')
return {1, info[1] or 'active', info[2] or '0', last_id, info[3] or '0', info[4] or '0'}
""")

# KEYS: lock, sub, dead, dead body, resend ; ARGV: token, nid, dead letter JSON, body, cursor, cursor_seq
# (cursor "" for a re-sent dead letter, which stays dead and leaves the re-send queue).
# The cursor moves past it so later notifications still flow. 1 ok, 0 lock lost, -1 sub gone.
DEAD_LETTER_SCRIPT = Script("""
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[4])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[2], 'cursor', ARGV[5], 'cursor_seq', ARGV[6])
end
redis.call('LREM', KEYS[5], 0, ARGV[2])
redis.call('HSET', KEYS[2], 'attempts', 0, 'next_attempt', 0, 'retry_at', 0,
           'resend', redis.call('LLEN', KEYS[5]))
return 1
""")

# KEYS: lock, sub, dead, dead body, resend ; ARGV: token, nid. A re-sent dead letter got its 2xx.
RESENT_SCRIPT = Script("""
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[4], ARGV[2])
redis.call('LREM', KEYS[5], 0, ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
redis.call('HSET', KEYS[2], 'resend', redis.call('LLEN', KEYS[5]))
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('HSET', KEYS[2], 'attempts', 0, 'next_attempt', 0, 'retry_at', 0)
end
return 1
""")

# KEYS: topic subs, log, followers, topic subs changes, renewals ; ARGV: token prefix, ttl_ms, now, limit,
#       sub key prefix, now_ms, share, alive key prefix, alive key suffix
# One pass over a topic's subscriptions, in Redis: claim every active one that lags the log and
# is not backing off, and return its DELIVERY_FIELDS; each claim's token is the prefix + sid.
# At most `limit` (free slots; more = 1 when that cut it short). With share = 1, a follower
# takes only its part: the lagging subscriptions (those live runs hold included) divided by the
# live followers of the topic, and the others take the rest. Returns {log's last id, {sid,
# fields...}, more, busy (held by live runs, or taken meanwhile), subscriptions, changes, renewals}:
# the topic's subscriptions and its change counter as the pass saw them, and the renewals counter
# as the secrets were read (see CLAIM_SCRIPT).
CLAIM_LAGGING_SCRIPT = Script(_TAKE + """
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last == 0 then return {'', {}, 0, 0, 0, '', '0'} end
local last_id = last[1][1]
local lms, lseq = string.match(last_id, '(%d+)-(%d+)')
lms, lseq = tonumber(lms), tonumber(lseq)
local now, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local lagging, held, alive = {}, 0, {}
local members = redis.call('SMEMBERS', KEYS[1])
for _, sid in ipairs(members) do
  local key = ARGV[5] .. sid
  -- a subscription a live run holds is that run's to deliver: counted (it lags, or will at the
  -- next entry), not read, so a followed topic's pass costs one GET for each of them
  local holder = redis.call('GET', key .. ':lock')
  local wid = holder and string.match(holder, '^([^:]+):')
  if wid and alive[wid] == nil then
    alive[wid] = redis.call('EXISTS', ARGV[8] .. wid .. ARGV[9]) == 1
  end
  if wid and alive[wid] then
    held = held + 1
  else
    local f = redis.call('HMGET', key, 'topic', 'callback', 'tid', 'secret', 'state', 'expires', 'cursor',
                         'cursor_seq', 'attempts', 'retry_at', 'resend')
    if f[2] and (f[5] or 'active') == 'active' and tonumber(f[6] or '0') >= now
       and tonumber(f[10] or '0') <= now then
      local cms, cseq = string.match(f[7] or '0-0', '(%d+)-(%d+)')
      cms, cseq = tonumber(cms), tonumber(cseq)
      if cms < lms or (cms == lms and cseq < lseq) or tonumber(f[11] or '0') > 0 then
        lagging[#lagging + 1] = {sid, key, f}
      end
    end
  end
end
local part = #lagging
if ARGV[7] == '1' then
  local followers = redis.call('ZCOUNT', KEYS[3], ARGV[6], '+inf')
  if followers > 1 then part = math.ceil((#lagging + held) / followers) end
end
local out, claimed, more, busy = {}, 0, 0, held
for _, item in ipairs(lagging) do
  if claimed >= part then break end
  if claimed >= limit then more = 1; break end
  if take(item[2] .. ':lock', ARGV[1] .. item[1], ARGV[2], ARGV[8], ARGV[9]) then
    claimed = claimed + 1
    out[#out + 1] = item[1]
    out[#out + 1] = item[3]
  else
    busy = busy + 1
  end
end
return {last_id, out, more, busy, #members, redis.call('GET', KEYS[4]) or '', redis.call('GET', KEYS[5]) or '0'}
""")

# KEYS: followers, flag ; ARGV: token, until_ms, lease_ms, now_ms. A worker follows the topic (or
# renews that) until `until_ms`, and keeps the "queued" flag set meanwhile. Returns the live
# followers.
FOLLOW_SCRIPT = Script("""
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], 'following', 'PX', ARGV[3])
return redis.call('ZCOUNT', KEYS[1], ARGV[4], '+inf')
""")

# KEYS: followers, flag ; ARGV: token, now_ms. A follower stops; the last one clears the flag
# (then publishes queue jobs again). Returns the followers left.
UNFOLLOW_SCRIPT = Script("""
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])
local left = redis.call('ZCARD', KEYS[1])
if left == 0 then redis.call('DEL', KEYS[2]) end
return left
""")



_ALIVE = tuple(worker_alive_key("|").split("|"))   # a worker's heartbeat key around its id


def lock_holder(token: str) -> str:
    """The worker id in a claim's token."""
    return token.split(":", 1)[0]


async def claim(batch: RedisBatcher, sid: str, token: str, ttl_ms: int) -> dict[str, Any] | None:
    """Own the subscription (lock with TTL) and read its DELIVERY_FIELDS; None when another run
    owns it, or when it was removed meanwhile (then the lock just taken is dropped again)."""
    raw = await batch.script(CLAIM_SCRIPT, [sub_lock_key(sid), sub_key(sid), renewals_key()], [token, ttl_ms, *_ALIVE])
    if not raw:
        return None
    values = dict(zip(DELIVERY_FIELDS, raw))
    values["renewals"] = raw[len(DELIVERY_FIELDS)]
    if values["callback"] is None:
        await batch.execute("DEL", sub_lock_key(sid))
        return None
    return values


async def renew(batch: RedisBatcher, claims: Sequence[tuple[str, str]], ttl_ms: int) -> list[int]:
    """Extend the locks of (sid, token) pairs; 1 per lock still ours, 0 per lost one."""
    keys = [sub_lock_key(sid) for sid, _ in claims]
    return list(await batch.script(RENEW_SCRIPT, keys, [ttl_ms, *(token for _, token in claims)]))


async def checkpoint(batch: RedisBatcher, sid: str, tid: str, token: str, *, release: bool,
                     fields: dict[str, Any], records: list[str], delivered: int, gaps: int,
                     due_at: float | None) -> list[Any]:
    """Write a run's pending delivery state (see CHECKPOINT_SCRIPT); with `release` give up the claim."""
    pairs = [x for kv in fields.items() for x in kv]
    args = [token, 1 if release else 0, sid, RECENT_ATTEMPTS, delivered, gaps,
            "" if due_at is None else repr(due_at), len(pairs), *pairs, *records]
    keys = [sub_lock_key(sid), sub_key(sid), sub_attempts_key(sid), due_key(), topic_log_key(tid)]
    return list(await batch.script(CHECKPOINT_SCRIPT, keys, args))


def _dead_keys(sid: str) -> list[str]:
    return [sub_lock_key(sid), sub_key(sid), sub_dead_key(sid), sub_dead_body_key(sid), sub_resend_key(sid)]


async def dead_letter(batch: RedisBatcher, sid: str, token: str, nid: str, letter: str, body: bytes,
                      cursor: str, sequence: int) -> int:
    """Keep a notification as a dead letter and move the cursor past it ("" cursor: a re-send)."""
    return int(await batch.script(DEAD_LETTER_SCRIPT, _dead_keys(sid), [token, nid, letter, body, cursor, sequence]))


async def resent(batch: RedisBatcher, sid: str, token: str, nid: str) -> None:
    """A re-sent dead letter got its 2xx: it is no dead letter any more."""
    await batch.script(RESENT_SCRIPT, _dead_keys(sid), [token, nid])


async def claim_lagging(batch: RedisBatcher, tid: str, prefix: str, ttl_ms: int, now: float, limit: int,
                        share: bool) -> list[Any]:
    """Claim up to `limit` of the topic's lagging subscriptions (see CLAIM_LAGGING_SCRIPT)."""
    keys = [topic_subs_key(tid), topic_log_key(tid), fanout_followers_key(tid), topic_subs_changes_key(tid),
            renewals_key()]
    return list(await batch.script(CLAIM_LAGGING_SCRIPT, keys, [prefix, ttl_ms, repr(now), limit, f"{PREFIX}sub:",
                                                                int(time.time() * 1000), int(share), *_ALIVE]))


async def follow(batch: RedisBatcher, tid: str, token: str, lease_ms: int) -> int:
    """Follow the topic (or renew that) for `lease_ms`; returns the live followers."""
    now_ms = int(time.time() * 1000)
    return int(await batch.script(FOLLOW_SCRIPT, [fanout_followers_key(tid), fanout_queued_key(tid)],
                                  [token, now_ms + lease_ms, lease_ms, now_ms]))


async def unfollow(batch: RedisBatcher, tid: str, token: str) -> int:
    """Stop following the topic; returns the followers left (the last one cleared the flag)."""
    return int(await batch.script(UNFOLLOW_SCRIPT, [fanout_followers_key(tid), fanout_queued_key(tid)],
                                  [token, int(time.time() * 1000)]))

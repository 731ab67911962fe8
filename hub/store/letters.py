"""Dead letters and delivery attempts as operators see them, re-sending, and the due set of retries."""
from __future__ import annotations

import time
from typing import Any

import redis as redis_sync
from redis.asyncio import Redis

from ..keys import (
    due_key,
    sub_attempts_key,
    sub_dead_body_key,
    sub_dead_key,
    sub_key,
    sub_resend_key,
)
from ..lua import Script
from ..records import (
    RECENT_ATTEMPTS,
    Attempt,
    DeadLetter,
    text,
)

# KEYS: sub, dead, resend, due ; ARGV: sid, now, nids... Queue dead letters for re-sending and wake
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


async def get_dead_letter(redis: Redis, sid: str, nid: str) -> DeadLetter | None:
    """One dead letter's record (None when there is no such dead letter)."""
    meta = await redis.hget(sub_dead_key(sid), nid)
    return None if meta is None else DeadLetter.from_json(meta)


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


async def recent_attempts(redis: Redis, sid: str, limit: int = RECENT_ATTEMPTS) -> list[Attempt]:
    """The subscription's last failed delivery attempts (retry, gone, dead), newest first; the
    last attempt of any outcome is in the sub hash (last_status, last_latency_ms, last_outcome...)."""
    raw = await redis.lrange(sub_attempts_key(sid), 0, limit - 1)
    return [Attempt.from_json(r) for r in raw]


async def pop_due(redis: Redis, now: float, limit: int = 500) -> list[str]:
    """Take (remove and return) the subscriptions whose next attempt is due at `now`."""
    return [text(s) for s in await _POP_DUE(redis, [due_key()], [now, limit])]


def pop_due_sync(connection: redis_sync.Redis, now: float, limit: int = 500) -> list[str]:
    """pop_due on a synchronous client (the workers' maintenance runs in a thread)."""
    return [text(s) for s in _POP_DUE.run_sync(connection, [due_key()], [repr(now), limit])]

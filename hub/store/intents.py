"""Subscription intents waiting for verification: kept under their challenge (single use), lined up for the verify_pending job."""
from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from ..batch import RedisBatcher
from ..keys import (
    intent_key,
    intents_prefix,
    stats_key,
    verification_field,
    verify_pending_key,
    verify_queued_key,
    verify_taken_key,
)
from ..lua import Script
from ..records import (
    Intent,
    text,
)


async def store_intent(redis: Redis, challenge: str, intent: Intent, ttl: int) -> None:
    """Keep a pending intent under its challenge for `ttl` seconds (one round trip)."""
    key = intent_key(challenge)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=intent.to_hash())
        pipe.expire(key, ttl)
        await pipe.execute()


VERIFY_QUEUED_TTL = 60  # s; a lost verify_pending job is replaced by the next request after this


# KEYS: intent, line, queued flag ; ARGV: challenge, ttl, flag ttl, then the intent's field/value pairs.
# The intent is kept and lined up, and the flag set, in one step (as the MULTI it replaces): a worker
# never sees the challenge without its intent. Returns 1 when the flag was not set (queue a job).
_QUEUE_INTENT = Script("""
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('RPUSH', KEYS[2], ARGV[1])
if redis.call('SET', KEYS[3], 1, 'NX', 'EX', ARGV[3]) then return 1 end
return 0
""")


async def queue_intent(redis: Redis, challenge: str, intent: Intent, ttl: int, *,
                       batch: RedisBatcher | None = None) -> bool:
    """Keep the intent and line its challenge up for verification, in one script call (with
    `batch`, in the pipeline of the requests issued meanwhile).

    Returns True when no verify_pending job was queued: the caller must queue one. A burst
    of requests thus queues one job, which verifies the whole line concurrently.
    """
    keys = [intent_key(challenge), verify_pending_key(), verify_queued_key()]
    args: list[Any] = [challenge, ttl, VERIFY_QUEUED_TTL]
    for name, value in intent.to_hash().items():
        args += [name, value]
    must_queue = await (batch.script(_QUEUE_INTENT, keys, args) if batch is not None
                        else _QUEUE_INTENT(redis, keys, args))
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


async def clear_verify_queued(redis: Redis) -> None:
    """A verify_pending job started: requests lined up from now on queue the next one."""
    await redis.delete(verify_queued_key())


# KEYS: line, taken, queued flag ; ARGV: limit, intent key prefix. Up to `limit` challenges move
# from the head of the line to a worker's taken list, where they stay until verified, so a worker
# that dies meanwhile loses none (store.liveness.bury_dead_workers puts them back in line). Each
# comes with its intent's fields (an empty list when it expired), read in the same call: a
# verification then costs no round trip of its own to read what to verify.
# With ARGV[3] = 1 (a lane about to wait for its bell) an empty line also clears the
# "verify_pending job queued" flag in the same step, so the next request queues a job that wakes a
# lane, and one that came before was taken already. A busy lane leaves the flag set: while it keeps
# looking, requests need no job (and none of RQ's round trips) to be seen. Returns {challenge, fields, ...}.
_TAKE_CHALLENGES = Script("""
local taken = redis.call('LPOP', KEYS[1], ARGV[1])
if not taken then
  if ARGV[3] == '1' then redis.call('DEL', KEYS[3]) end
  return {}
end
redis.call('RPUSH', KEYS[2], unpack(taken))
local answer = {}
for i, challenge in ipairs(taken) do
  answer[2 * i - 1] = challenge
  answer[2 * i] = redis.call('HGETALL', ARGV[2] .. challenge)
end
return answer
""")


async def take_challenges(redis: Redis, wid: str, limit: int, *,
                          is_idle: bool = True) -> list[tuple[str, Intent | None]]:
    """Up to `limit` challenges from the head of the line, kept in worker `wid`'s taken list, each
    with the intent stored under it (None when it expired, or a worker thought dead verified it).
    With `is_idle` (the lane waits for a job's bell next) an empty line clears the verify_pending flag."""
    answer = await _TAKE_CHALLENGES(redis, [verify_pending_key(), verify_taken_key(wid), verify_queued_key()],
                                    [limit, intents_prefix(), 1 if is_idle else 0])
    return [(text(challenge), _intent_of(fields)) for challenge, fields in zip(answer[0::2], answer[1::2])]


def _intent_of(fields: Any) -> Intent | None:
    # a hash read inside a script comes back as a flat list (RESP2) or a map (RESP3)
    if not fields:
        return None
    return Intent.from_hash(fields if isinstance(fields, dict) else dict(zip(fields[0::2], fields[1::2])))


# KEYS: taken, intent, stats ; ARGV: challenge[, the counter field of its outcome]
_FINISH_CHALLENGE = Script("""
redis.call('LREM', KEYS[1], 1, ARGV[1])
redis.call('DEL', KEYS[2])
if ARGV[2] then redis.call('HINCRBY', KEYS[3], ARGV[2], 1) end
return 1
""")


async def finish_challenge(redis: Redis, wid: str, challenge: str, result: str = "", *,
                           batch: RedisBatcher | None = None) -> None:
    """A taken challenge was verified (or refused): it and its intent are gone (single use), and
    `result` (a VerificationOutcome.result, "" for none) is counted for /metrics, in one script call
    (with `batch`, pipelined with the other verifications' calls)."""
    keys = [verify_taken_key(wid), intent_key(challenge), stats_key()]
    args = [challenge, verification_field(result)] if result else [challenge]
    await (batch.script(_FINISH_CHALLENGE, keys, args) if batch is not None
           else _FINISH_CHALLENGE(redis, keys, args))


async def return_challenge(redis: Redis, wid: str, challenge: str) -> None:
    """Put a taken challenge back at the end of the line (its host has too many waiting here)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.lrem(verify_taken_key(wid), 1, challenge)
        pipe.rpush(verify_pending_key(), challenge)
        await pipe.execute()


async def return_taken_challenges(redis: Redis, wid: str) -> int:
    """Put every challenge worker `wid` still holds back at the head of the line (it stops)."""
    moved = 0
    while await redis.rpoplpush(verify_taken_key(wid), verify_pending_key()):
        moved += 1
    return moved

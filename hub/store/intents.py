"""Subscription intents waiting for verification: kept under their challenge (single use), lined up for the verify_pending job."""
from __future__ import annotations

from redis.asyncio import Redis

from ..keys import (
    intent_key,
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


async def clear_verify_queued(redis: Redis) -> None:
    """A verify_pending job started: requests lined up from now on queue the next one."""
    await redis.delete(verify_queued_key())


# KEYS: line, taken ; ARGV: limit. Up to `limit` challenges move from the head of the line to a
# worker's taken list, where they stay until verified, so a worker that dies meanwhile loses none
# (store.liveness.bury_dead_workers puts them back in line).
_TAKE_CHALLENGES = Script("""
local taken = redis.call('LPOP', KEYS[1], ARGV[1])
if not taken then return {} end
redis.call('RPUSH', KEYS[2], unpack(taken))
return taken
""")


async def take_challenges(redis: Redis, wid: str, limit: int) -> list[str]:
    """Up to `limit` challenges from the head of the line, kept in worker `wid`'s taken list."""
    return [text(c) for c in await _TAKE_CHALLENGES(redis, [verify_pending_key(), verify_taken_key(wid)], [limit])]


async def read_intent(redis: Redis, challenge: str) -> Intent | None:
    """The intent stored under `challenge` (left in place: `finish_challenge` removes it)."""
    raw = await redis.hgetall(intent_key(challenge))
    return Intent.from_hash(raw) if raw else None


async def finish_challenge(redis: Redis, wid: str, challenge: str) -> None:
    """A taken challenge was verified (or refused): it and its intent are gone (single use)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.lrem(verify_taken_key(wid), 1, challenge)
        pipe.delete(intent_key(challenge))
        await pipe.execute()


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

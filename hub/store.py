"""Every Redis key and operation of the hub: topics and their logs, subscriptions, leases, intents.

Key builders come first, so the whole key space reads in one screen. Functions take a
`redis.asyncio.Redis` client (created with decode_responses=False) and do few round trips:
multi-key updates are Lua scripts or MULTI pipelines. No HTTP here.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

PREFIX = "rsnotify:"

# --- keys ---------------------------------------------------------------------------------


def topics_key() -> str:                    # set of topic ids
    return f"{PREFIX}topics"


def topic_key(tid: str) -> str:             # hash: url, created (epoch s)
    return f"{PREFIX}topic:{tid}"


def topic_log_key(tid: str) -> str:         # stream: body, ctype, rs, seq, at (ms); entry id = notification id
    return f"{PREFIX}topic:{tid}:log"


def topic_seq_key(tid: str) -> str:         # INCR counter: the entries' seq 1, 2, 3...
    return f"{PREFIX}topic:{tid}:seq"


def topic_subs_key(tid: str) -> str:        # set of active subscription ids of the topic
    return f"{PREFIX}topic:{tid}:subs"


def sub_key(sid: str) -> str:               # hash: see Subscription below
    return f"{PREFIX}sub:{sid}"


def leases_key() -> str:                    # zset: subscription id -> expires (epoch s)
    return f"{PREFIX}leases"


def intent_key(challenge: str) -> str:      # hash: pending intent (see Intent); TTL; single use
    return f"{PREFIX}intent:{challenge}"


def sub_lock_key(sid: str) -> str:          # owner lock of a subscription's deliveries (SET NX PX)
    return f"{PREFIX}sub:{sid}:lock"


def sub_dead_key(sid: str) -> str:          # dead letters of a subscription (fan-out's)
    return f"{PREFIX}sub:{sid}:dead"


def fanout_queued_key(tid: str) -> str:     # "a fan-out job for this topic is queued" flag (fan-out's)
    return f"{PREFIX}fanout:{tid}:queued"


def key_check_key() -> str:                 # a Fernet token proving which secret key this Redis uses
    return f"{PREFIX}keycheck"


# --- ids ----------------------------------------------------------------------------------


def topic_id(topic: str) -> str:
    """Id of a topic: sha256 of the exact topic URL (topics are compared exactly), 32 hex."""
    return hashlib.sha256(topic.encode("utf-8")).hexdigest()[:32]


def subscription_id(topic: str, callback: str) -> str:
    """Id of the subscription (topic, callback): its identity, so a renewal never duplicates it."""
    return hashlib.sha256(f"{topic}\n{callback}".encode("utf-8")).hexdigest()[:32]


# --- values -------------------------------------------------------------------------------


def _text(value: bytes | str | None, default: str = "") -> str:
    if value is None:
        return default
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _int(value: bytes | str | None, default: int = 0) -> int:
    text = _text(value)
    return int(text) if text else default


@dataclass(frozen=True, slots=True)
class Intent:
    """A subscribe / unsubscribe / denial waiting for its verification job.

    `secret` is the Fernet token of the requested secret ("" for none), never the plain text.
    `mode` is subscribe, unsubscribe or denied (then `reason` says why).
    """

    mode: str
    topic: str
    callback: str
    lease_seconds: int = 0
    secret: str = field(default="", repr=False)
    reason: str = ""

    def to_hash(self) -> dict[str, str]:
        return {"mode": self.mode, "topic": self.topic, "callback": self.callback,
                "lease": str(self.lease_seconds), "secret": self.secret, "reason": self.reason}

    @classmethod
    def from_hash(cls, raw: Mapping[bytes, bytes]) -> Intent:
        return cls(mode=_text(raw.get(b"mode")), topic=_text(raw.get(b"topic")),
                   callback=_text(raw.get(b"callback")), lease_seconds=_int(raw.get(b"lease")),
                   secret=_text(raw.get(b"secret")), reason=_text(raw.get(b"reason")))


@dataclass(frozen=True, slots=True)
class Subscription:
    """An active (verified) subscription as stored in `sub_key(sid)`.

    `secret` is the Fernet token ("" for none). Delivery fields (attempts, next_attempt,
    last_status, last_error, last_attempt_at) are written by fan-out and absent until then.
    """

    sid: str
    topic: str
    callback: str
    tid: str
    secret: str = field(default="", repr=False)
    lease_seconds: int = 0
    expires: int = 0          # epoch seconds
    created: int = 0          # epoch seconds
    state: str = "active"     # active | paused
    cursor: str = "0-0"       # last confirmed log entry id
    attempts: int = 0
    next_attempt: int = 0
    last_status: str = ""
    last_error: str = ""
    last_attempt_at: int = 0

    @property
    def has_secret(self) -> bool:
        return bool(self.secret)

    def is_expired(self, now: float) -> bool:
        return self.expires < now

    @classmethod
    def from_hash(cls, sid: str, raw: Mapping[bytes, bytes]) -> Subscription:
        return cls(
            sid=sid, topic=_text(raw.get(b"topic")), callback=_text(raw.get(b"callback")),
            tid=_text(raw.get(b"tid")), secret=_text(raw.get(b"secret")),
            lease_seconds=_int(raw.get(b"lease_seconds")), expires=_int(raw.get(b"expires")),
            created=_int(raw.get(b"created")), state=_text(raw.get(b"state"), "active"),
            cursor=_text(raw.get(b"cursor"), "0-0"), attempts=_int(raw.get(b"attempts")),
            next_attempt=_int(raw.get(b"next_attempt")), last_status=_text(raw.get(b"last_status")),
            last_error=_text(raw.get(b"last_error")), last_attempt_at=_int(raw.get(b"last_attempt_at")),
        )


class _Script:
    """A Lua script run by EVALSHA (one round trip), loaded on first use on each server."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()

    async def __call__(self, redis: Redis, keys: list[str], args: list[object]) -> object:
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await redis.eval(self.source, len(keys), *keys, *args)


# --- intents ------------------------------------------------------------------------------


async def store_intent(redis: Redis, challenge: str, intent: Intent, ttl: int) -> None:
    """Keep a pending intent under its challenge for `ttl` seconds (one round trip)."""
    key = intent_key(challenge)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=intent.to_hash())
        pipe.expire(key, ttl)
        await pipe.execute()


async def take_intent(redis: Redis, challenge: str) -> Intent | None:
    """The intent stored under `challenge`, deleted in the same transaction (single use)."""
    key = intent_key(challenge)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(key)
        pipe.delete(key)
        raw, _ = await pipe.execute()
    return Intent.from_hash(raw) if raw else None


# --- subscriptions ------------------------------------------------------------------------

# KEYS: sub, topic subs, leases, log, topics, topic
# ARGV: sid, topic, callback, tid, secret, lease_seconds, expires, now
# A new subscription's cursor is the log's current end, so it gets only what comes next;
# a renewal keeps its cursor (and its delivery state). Returns 1 when new, 0 when renewed.
_ACTIVATE = _Script("""
local is_new = redis.call('EXISTS', KEYS[1]) == 0
if is_new then
  local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)
  local cursor = '0-0'
  if #last > 0 then cursor = last[1][1] end
  redis.call('HSET', KEYS[1], 'topic', ARGV[2], 'callback', ARGV[3], 'tid', ARGV[4],
             'created', ARGV[8], 'state', 'active', 'cursor', cursor)
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

# KEYS: sub, leases, dead ; ARGV: sid, topic-subs key prefix, topic-subs key suffix[, now]
# With `now`, only a subscription still expired at that moment goes (a renewal may have raced).
_REMOVE = _Script("""
if ARGV[4] then
  local expires = tonumber(redis.call('HGET', KEYS[1], 'expires') or '0')
  if expires >= tonumber(ARGV[4]) then return 0 end
end
local tid = redis.call('HGET', KEYS[1], 'tid')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
if not tid then return 0 end
redis.call('SREM', ARGV[2] .. tid .. ARGV[3], ARGV[1])
redis.call('DEL', KEYS[1])
return 1
""")


async def activate_subscription(
    redis: Redis, topic: str, callback: str, *, secret: str, lease_seconds: int, now: float,
) -> tuple[str, bool]:
    """Create or renew the verified subscription (topic, callback) in one script call.

    `secret` is the Fernet token of the new secret, or "" to drop it: a verified renewal
    replaces the secret. Returns (subscription id, is_new).
    """
    sid, tid = subscription_id(topic, callback), topic_id(topic)
    expires = int(now) + lease_seconds
    keys = [sub_key(sid), topic_subs_key(tid), leases_key(), topic_log_key(tid), topics_key(), topic_key(tid)]
    args = [sid, topic, callback, tid, secret, lease_seconds, expires, int(now)]
    is_new = await _ACTIVATE(redis, keys, args)
    return sid, bool(is_new)


async def remove_subscription(redis: Redis, sid: str, *, if_expired_at: float | None = None) -> bool:
    """Remove a subscription (unsubscribe, expiry, 410, admin): hash, topic set, lease, dead letters.

    With `if_expired_at`, remove it only if its lease ended before that time (the sweep).
    Returns False when nothing was removed. Safe to call twice.
    """
    keys = [sub_key(sid), leases_key(), sub_dead_key(sid)]
    args: list[object] = [sid, f"{PREFIX}topic:", ":subs"]
    if if_expired_at is not None:
        args.append(int(if_expired_at))
    return bool(await _REMOVE(redis, keys, args))


async def get_subscription(redis: Redis, sid: str) -> Subscription | None:
    raw = await redis.hgetall(sub_key(sid))
    return Subscription.from_hash(sid, raw) if raw else None


async def expired_subscriptions(redis: Redis, now: float, limit: int = 1000) -> list[str]:
    """Ids of subscriptions whose lease ended before `now`, oldest first (at most `limit`)."""
    sids = await redis.zrangebyscore(leases_key(), "-inf", f"({int(now)}", start=0, num=limit)
    return [_text(s) for s in sids]


async def count_subscriptions(redis: Redis) -> int:
    return int(await redis.zcard(leases_key()))


# --- topic logs ---------------------------------------------------------------------------

# KEYS: log, seq, topics, topic ; ARGV: body, ctype, rs, at_ms, maxlen, tid, url, now_s
# seq and the stream id are assigned together, so both grow in the same order.
_APPEND = _Script("""
local seq = redis.call('INCR', KEYS[2])
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*',
                      'body', ARGV[1], 'ctype', ARGV[2], 'rs', ARGV[3], 'seq', seq, 'at', ARGV[4])
if redis.call('SADD', KEYS[3], ARGV[6]) == 1 then
  redis.call('HSET', KEYS[4], 'url', ARGV[7], 'created', ARGV[8])
end
return {id, seq}
""")


@dataclass(frozen=True, slots=True)
class AppendedNotification:
    """Where a notification landed: its id (the stream entry id), its topic and position."""

    notification_id: str
    topic_id: str
    sequence: int


async def append_notification(
    redis: Redis, topic: str, body: bytes, *, content_type: str, resourcesync: str = "",
    now: float, max_len: int,
) -> AppendedNotification:
    """Append the exact `body` and the headers to relay to the topic's log (one script call)."""
    tid = topic_id(topic)
    keys = [topic_log_key(tid), topic_seq_key(tid), topics_key(), topic_key(tid)]
    args = [body, content_type, resourcesync, int(now * 1000), max_len, tid, topic, int(now)]
    entry_id, seq = await _APPEND(redis, keys, args)
    return AppendedNotification(_text(entry_id), tid, int(seq))

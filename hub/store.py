"""Every Redis key and operation of the hub: topics and their logs, subscriptions, leases, intents.

Key builders come first, so the whole key space reads in one screen. Functions take a
`redis.asyncio.Redis` client (created with decode_responses=False) and do few round trips:
multi-key updates are Lua scripts or MULTI pipelines. No HTTP here.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


def fanout_followers_key(tid: str) -> str:  # zset: workers following the topic's log -> until (ms) (fan-out's)
    return f"{PREFIX}fanout:{tid}:followers"


def verify_pending_key() -> str:            # list: challenges waiting for a verify_pending job, oldest first
    return f"{PREFIX}verify:pending"


def verify_queued_key() -> str:             # flag: "a verify_pending job is queued" (TTL)
    return f"{PREFIX}verify:queued"


def key_check_key() -> str:                 # a Fernet token proving which secret key this Redis uses
    return f"{PREFIX}keycheck"


# operations (hub/status.py, hub/metrics.py, hub/diagnostics.py); counters live in stats_key() below


def activity_key(minute: int) -> str:       # zset per minute (epoch s // 60): tid -> publishes, "*" -> all; 1 h TTL
    return f"{PREFIX}activity:{minute}"


def diagnostics_token_key(sid: str) -> str:  # sha256 hex of a subscriber's diagnostics token, with TTL
    return f"{PREFIX}sub:{sid}:diag"


def diagnostics_sent_key(sid: str) -> str:  # "a diagnostics link went to the callback lately" (rate limit)
    return f"{PREFIX}sub:{sid}:diag:sent"


# --- ids ----------------------------------------------------------------------------------


def topic_id(topic: str) -> str:
    """Id of a topic: sha256 of the exact topic URL (topics are compared exactly), 32 hex."""
    return hashlib.sha256(topic.encode("utf-8")).hexdigest()[:32]


def subscription_id(topic: str, callback: str) -> str:
    """Id of the subscription (topic, callback): its identity, so a renewal never duplicates it."""
    return hashlib.sha256(f"{topic}\n{callback}".encode("utf-8")).hexdigest()[:32]


# --- values -------------------------------------------------------------------------------


def _text(value: Any, default: str = "") -> str:
    if value is None:
        return default
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _int(value: Any, default: int = 0) -> int:
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

    def to_hash(self) -> dict[Any, Any]:  # redis-py types its mapping invariantly
        return {"mode": self.mode, "topic": self.topic, "callback": self.callback,
                "lease": str(self.lease_seconds), "secret": self.secret, "reason": self.reason}

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> Intent:
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
    def from_hash(cls, sid: str, raw: Mapping[Any, Any]) -> Subscription:
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

    async def __call__(self, redis: Redis, keys: list[str], args: list[Any]) -> Any:
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
    return [_text(c) for c in taken or []]


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
_ACTIVATE = _Script("""
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
_REMOVE = _Script("""
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
    return (_text(last[0][0]) if last else "0-0"), _text(seq, "0")


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
    return [_text(s) for s in sids]


async def count_subscriptions(redis: Redis) -> int:
    return int(await redis.zcard(leases_key()))


# --- topic logs ---------------------------------------------------------------------------

# KEYS: log, seq, topics, topic, stats, activity ; ARGV: body, ctype, rs, at_ms, maxlen, tid, url, now_s
# seq and the stream id are assigned together, so both grow in the same order. The counters for
# /metrics and the status page ride in the same call (ops: hub/metrics.py reads them).
_APPEND = _Script("""
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
    keys = [topic_log_key(tid), topic_seq_key(tid), topics_key(), topic_key(tid), stats_key(),
            activity_key(int(now) // 60)]
    args = [body, content_type, resourcesync, int(now * 1000), max_len, tid, topic, int(now)]
    entry_id, seq = await _APPEND(redis, keys, args)
    return AppendedNotification(_text(entry_id), tid, int(seq))


# --- delivery: cursors, locks, dead letters ---------------------------------------------
# Fan-out's part (hub/delivery.py, hub/reconciler.py). Its extra keys, beside sub_lock_key,
# sub_dead_key and fanout_queued_key above:


def sub_attempts_key(sid: str) -> str:      # list: recent failed delivery attempts, newest first (JSON each)
    return f"{PREFIX}sub:{sid}:attempts"


def sub_dead_body_key(sid: str) -> str:     # hash: notification id -> a dead letter's exact body
    return f"{PREFIX}sub:{sid}:dead:body"


def sub_resend_key(sid: str) -> str:        # list: dead letters queued for re-sending, oldest first
    return f"{PREFIX}sub:{sid}:resend"


def sub_queued_key(sid: str) -> str:        # flag: "a deliver_subscription job is queued"
    return f"{PREFIX}sub:{sid}:queued"


def due_key() -> str:                       # zset: sid -> epoch s its next attempt is due (retry, re-send, resume)
    return f"{PREFIX}due"


def stats_key() -> str:                     # hash: delivery counters and latency histograms (delivery_stats)
    return f"{PREFIX}stats"


def maintenance_key(task: str) -> str:      # one worker's claim on a periodic task (reconcile, retention, sweep)
    return f"{PREFIX}maintenance:{task}"


def delivery_keys(sid: str) -> list[str]:
    """Every per-subscription key of the delivery part (remove_subscription deletes them)."""
    return [sub_lock_key(sid), sub_dead_key(sid), sub_dead_body_key(sid), sub_attempts_key(sid),
            sub_resend_key(sid), sub_queued_key(sid)]


# Fields of the sub hash a delivery run needs, in this order (claim returns them).
DELIVERY_FIELDS = ("topic", "callback", "tid", "secret", "state", "expires", "cursor", "cursor_seq",
                   "attempts", "retry_at", "resend")
# Upper bounds (seconds) of the latency histograms in stats_key(); the last bucket is "+Inf".
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
RECENT_ATTEMPTS = 20   # failed attempts (retry, gone, dead) kept per subscription in sub_attempts_key


def parse_entry_id(entry_id: str) -> tuple[int, int]:
    """A stream entry id "ms-seq" as a tuple that compares in log order."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One notification of a topic log: the exact body and what to relay with it."""

    notification_id: str      # the stream entry id
    body: bytes
    content_type: str
    resourcesync: str         # the publisher's rel="resourcesync" href, or ""
    sequence: int             # 1, 2, 3... per topic
    published_ms: int         # publish time, epoch milliseconds

    @classmethod
    def from_stream(cls, entry_id: bytes | str, raw: Mapping[bytes, bytes]) -> LogEntry:
        return cls(notification_id=_text(entry_id), body=raw.get(b"body", b""),
                   content_type=_text(raw.get(b"ctype"), "application/xml"),
                   resourcesync=_text(raw.get(b"rs")), sequence=_int(raw.get(b"seq")),
                   published_ms=_int(raw.get(b"at")))


@dataclass(frozen=True, slots=True)
class Attempt:
    """One delivery attempt, as listed for operators (newest first in sub_attempts_key)."""

    at: float                 # when the attempt ended, epoch seconds
    notification_id: str
    sequence: int
    status: int | None        # HTTP status; None when no response (timeout, connection error)
    error: str                # "" on a 2xx
    latency_ms: float
    outcome: str              # delivered | retry | gone | dead
    attempt: int              # 1 for the first try of this notification

    def to_json(self) -> str:
        return json.dumps({"at": round(self.at, 3), "id": self.notification_id, "seq": self.sequence,
                           "status": self.status, "error": self.error,
                           "ms": round(self.latency_ms, 2), "outcome": self.outcome, "attempt": self.attempt},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: bytes | str) -> Attempt:
        d = json.loads(text)
        return cls(at=d["at"], notification_id=d["id"], sequence=d["seq"], status=d["status"],
                   error=d["error"], latency_ms=d["ms"], outcome=d["outcome"], attempt=d["attempt"])


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A notification a subscription never confirmed within max_attempts; kept until re-sent."""

    notification_id: str
    sequence: int
    published_ms: int
    content_type: str
    resourcesync: str
    attempts: int
    status: int | None        # the last attempt's status (None: no response)
    error: str                # the last attempt's error
    dead_at: float            # epoch seconds
    resend: bool = False      # queued for re-sending

    def to_json(self) -> str:
        return json.dumps({"id": self.notification_id, "seq": self.sequence, "at": self.published_ms,
                           "ctype": self.content_type, "rs": self.resourcesync, "attempts": self.attempts,
                           "status": self.status, "error": self.error, "dead_at": round(self.dead_at, 3),
                           "resend": self.resend}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: bytes | str) -> DeadLetter:
        d = json.loads(text)
        return cls(notification_id=d["id"], sequence=d["seq"], published_ms=d["at"], content_type=d["ctype"],
                   resourcesync=d["rs"], attempts=d["attempts"], status=d["status"], error=d["error"],
                   dead_at=d["dead_at"], resend=d.get("resend", False))


# KEYS: lock, sub ; ARGV: token, ttl_ms. The sub's DELIVERY_FIELDS once this worker owns it, else false.
CLAIM_SCRIPT = _Script("""
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('HMGET', KEYS[2], 'topic', 'callback', 'tid', 'secret', 'state', 'expires',
                    'cursor', 'cursor_seq', 'attempts', 'retry_at', 'resend')
end
return false
""")

# KEYS: locks... ; ARGV: ttl_ms, then each lock's token. 1 per lock still ours (extended), 0 per lost one.
RENEW_SCRIPT = _Script("""
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
CHECKPOINT_SCRIPT = _Script("""
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
DEAD_LETTER_SCRIPT = _Script("""
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
RESENT_SCRIPT = _Script("""
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

# KEYS: sub, dead, resend, due ; ARGV: sid, now, nids... Queue dead letters for re-sending and wake
# the subscription (no earlier than a pending retry). Returns how many were queued.
_RESEND = _Script("""
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
_SET_STATE = _Script("""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[2])
if ARGV[2] == 'active' then
  redis.call('HSET', KEYS[1], 'next_attempt', 0, 'retry_at', 0)
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
end
return 1
""")

# KEYS: topic subs, log, followers ; ARGV: token prefix, ttl_ms, now, limit, sub key prefix, now_ms, share
# One pass over a topic's subscriptions, in Redis: claim every active one that lags the log and
# is not backing off, and return its DELIVERY_FIELDS; each claim's token is the prefix + sid.
# At most `limit` (free slots; more = 1 when that cut it short). With share = 1, a follower
# takes only its part: the lagging subscriptions divided by the live followers of the topic,
# and the others take the rest. Returns {log's last id, {sid, fields...}, more, busy}.
CLAIM_LAGGING_SCRIPT = _Script("""
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last == 0 then return {'', {}, 0, 0} end
local last_id = last[1][1]
local lms, lseq = string.match(last_id, '(%d+)-(%d+)')
lms, lseq = tonumber(lms), tonumber(lseq)
local now, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local lagging = {}
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = ARGV[5] .. sid
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
local part = #lagging
if ARGV[7] == '1' then
  local followers = redis.call('ZCOUNT', KEYS[3], ARGV[6], '+inf')
  if followers > 1 then part = math.ceil(#lagging / followers) end
end
local out, claimed, more, busy = {}, 0, 0, 0
for _, item in ipairs(lagging) do
  if claimed >= part then break end
  if claimed >= limit then more = 1; break end
  if redis.call('SET', item[2] .. ':lock', ARGV[1] .. item[1], 'NX', 'PX', ARGV[2]) then
    claimed = claimed + 1
    out[#out + 1] = item[1]
    out[#out + 1] = item[3]
  else
    busy = busy + 1
  end
end
return {last_id, out, more, busy}
""")

# KEYS: followers, flag ; ARGV: token, until_ms, lease_ms, now_ms. A worker follows the topic (or
# renews that) until `until_ms`, and keeps the "queued" flag set meanwhile. Returns the live
# followers.
FOLLOW_SCRIPT = _Script("""
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], 'following', 'PX', ARGV[3])
return redis.call('ZCOUNT', KEYS[1], ARGV[4], '+inf')
""")

# KEYS: followers, flag ; ARGV: token, now_ms. A follower stops; the last one clears the flag
# (then publishes queue jobs again). Returns the followers left.
UNFOLLOW_SCRIPT = _Script("""
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2])
local left = redis.call('ZCARD', KEYS[1])
if left == 0 then redis.call('DEL', KEYS[2]) end
return left
""")

# KEYS: key ; ARGV: token. Delete the key only while it still holds our token.
RELEASE_SCRIPT = _Script("""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
""")

# KEYS: due ; ARGV: now, limit. Take the subscriptions whose next attempt is due.
_POP_DUE = _Script("""
local sids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #sids > 0 then redis.call('ZREM', KEYS[1], unpack(sids)) end
return sids
""")


async def read_log(redis: Redis, tid: str, after: str, count: int) -> list[LogEntry]:
    """Up to `count` entries of the topic's log after entry id `after` (exclusive), oldest first."""
    raw: Any = await redis.xrange(topic_log_key(tid), f"({after}", "+", count=count)
    return [LogEntry.from_stream(entry_id, fields) for entry_id, fields in raw]


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
    log_key, cursor_text = topic_log_key(_text(tid)), _text(cursor, "0-0")
    async with redis.pipeline(transaction=False) as pipe:
        pipe.get(topic_seq_key(_text(tid)))
        pipe.xrange(log_key, cursor_text, cursor_text, count=1)
        pipe.xrange(log_key, "-", "+", count=1)
        last_seq, at_cursor, first = await pipe.execute()
    if cursor_seq is not None:
        done = _int(cursor_seq)
    elif at_cursor:            # nothing delivered yet: the seq of the entry it started after
        done = _int(at_cursor[0][1].get(b"seq"))
    elif first:                # that entry was trimmed: everything still in the log is due
        done = _int(first[0][1].get(b"seq")) - 1
    else:
        done = _int(last_seq)
    return max(0, _int(last_seq) - done)


async def pop_due(redis: Redis, now: float, limit: int = 500) -> list[str]:
    """Take (remove and return) the subscriptions whose next attempt is due at `now`."""
    return [_text(s) for s in await _POP_DUE(redis, [due_key()], [now, limit])]


async def delivery_stats(redis: Redis) -> dict[str, float]:
    """Hub-wide delivery counters and latency histograms, as written by the workers.

    Fields: `outcome:<delivered|retry|gone|dead>`, `status:<2xx|3xx|4xx|5xx|error>` (counts);
    for each histogram `delivery_seconds` (one POST) and `publish_to_delivery_seconds` (publish
    to confirmed delivery): `<name>:le:<bound>` per bucket of LATENCY_BUCKETS plus `<name>:le:+Inf`
    (non-cumulative counts), `<name>:sum` and `<name>:count`.
    """
    raw = await redis.hgetall(stats_key())
    return {_text(k): float(v) for k, v in raw.items()}

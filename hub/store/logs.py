"""Topic logs: appending a notification (with its counters), reading entries, the topics themselves."""
from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import os
import secrets
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from ..batch import RedisBatcher, exchange
from ..errors import AppendUnknownError, IdempotencyConflictError
from ..keys import (
    activity_key,
    fanout_queued_key,
    stats_key,
    topic_id,
    topic_key,
    topic_log_key,
    topic_publish_key,
    topic_seq_key,
    topic_subs_changes_key,
    topics_key,
)
from ..lua import Script
from ..records import (
    AppendedNotification,
    LogEntry,
    text,
)

# KEYS: log, seq, topics, topic, stats, activity, fan-out flag[, publish key] ; ARGV: body, ctype, rs, at_ms,
# maxlen, tid, url, now_s, flag ttl, flag token[, publish key ttl, body digest, look]. seq and the stream id
# are assigned together, so both grow in the same order. With a publish key (an Idempotency-Key) a repeat
# with the same body digest stores nothing and returns the first id and seq (repeat 1); one with another body
# stores nothing either and returns repeat 2, a conflict (a key kept by an older hub, "id seq" without a
# digest, counts as a repeat). look is "new" for the first attempt of a publish under the hub's own key,
# which no earlier call can have stored: the key is set without being read first. The counters for
# /metrics and the status page ride in the same call.
# With a flag ttl > 0, a stored notification or a repeat also sets the topic's "fan-out queued" flag
# (hub/store/queued.py) in the same round trip, to the caller's token; flagged is 1 when the caller must
# queue the fan-out job: it set the flag now, or an earlier attempt of the same publish (same token, its
# answer lost) did. Returns {id, seq, repeat, flagged}.
# Each redis.call costs a script ~1 µs beyond the command itself, as much as most of these
# commands: a steady publish makes as few as it can (the flag is read before it is set, because a
# followed topic's flag is set already; the topic is registered by its first entry; the minute's
# activity gets its expiry when it is created).
_APPEND = Script("""
local function flag()
  if ARGV[9] == '0' then return 0 end
  local holder = redis.call('GET', KEYS[7])
  if holder then return holder == ARGV[10] and 1 or 0 end
  redis.call('SET', KEYS[7], ARGV[10], 'EX', ARGV[9])
  return 1
end
if KEYS[8] and ARGV[13] ~= 'new' then
  local first = redis.call('GET', KEYS[8])
  if first then
    local space = string.find(first, ' ')
    local second = string.find(first, ' ', space + 1)
    local seq = tonumber(string.sub(first, space + 1, second and second - 1 or -1))
    if second and string.sub(first, second + 1) ~= ARGV[12] then
      return {string.sub(first, 1, space - 1), seq, 2, 0}
    end
    return {string.sub(first, 1, space - 1), seq, 1, flag()}
  end
end
local seq = redis.call('INCR', KEYS[2])
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*',
                      'body', ARGV[1], 'ctype', ARGV[2], 'rs', ARGV[3], 'seq', seq, 'at', ARGV[4])
if seq == 1 and redis.call('SADD', KEYS[3], ARGV[6]) == 1 then
  redis.call('HSET', KEYS[4], 'url', ARGV[7], 'created', ARGV[8])
end
redis.call('HINCRBY', KEYS[5], 'publishes', 1)
redis.call('HINCRBY', KEYS[5], 'publish_bytes', string.len(ARGV[1]))
redis.call('ZINCRBY', KEYS[6], 1, ARGV[6])
if redis.call('ZINCRBY', KEYS[6], 1, '*') == '1' then redis.call('EXPIRE', KEYS[6], 3720) end
if KEYS[8] then redis.call('SET', KEYS[8], id .. ' ' .. seq .. ' ' .. ARGV[12], 'EX', ARGV[11]) end
return {id, seq, 0, flag()}
""")

APPEND_RETRY_FOR = 20.0    # s a publish's append is retried (same key) while Redis fails

_serials = itertools.count()
_nonce = ""                # this process's random prefix, drawn on first use


def unique_token() -> str:
    """A token no other call in any hub process returns: a random prefix drawn once per process,
    then a counter. Tokens name one publish (its own Idempotency-Key, its fan-out flag); they need
    to be unique, not secret, so a publish costs no call to the system's random source."""
    global _nonce
    if not _nonce:
        _nonce = secrets.token_hex(8)
        os.register_at_fork(after_in_child=_forget_nonce)   # a forked child draws its own
    return f"{_nonce}.{next(_serials)}"


def _forget_nonce() -> None:
    global _nonce
    _nonce = ""


@functools.lru_cache(maxsize=1024)
def _append_keys(topic: str) -> tuple[str, tuple[str, ...], str]:
    """(topic id, the keys the append script takes before the minute's, the fan-out flag's key):
    the same for every publish of a topic, and a digest and six names to make each time."""
    tid = topic_id(topic)
    return tid, (topic_log_key(tid), topic_seq_key(tid), topics_key(), topic_key(tid), stats_key()), fanout_queued_key(tid)


async def append_notification(
    redis: Redis, topic: str, body: bytes, *, content_type: str, resourcesync: str = "",
    now: float, max_len: int, publish_key: str | None = None, key_ttl: int = 0,
    fan_out_flag_ttl: int = 0, fan_out_token: str = "", batch: RedisBatcher | None = None,
    own_key: str = "", is_first_attempt: bool = False,
) -> AppendedNotification:
    """Append the exact `body` and the headers to relay to the topic's log (one script call; with
    `batch`, in the pipeline of the appends issued meanwhile, on `batch`'s client).

    With `publish_key` (an Idempotency-Key, already scoped by the caller to its credential and
    topic) a repeat of the same body within `key_ttl` seconds stores nothing and returns the first
    append's id and sequence (is_repeat=True); the same key with another body stores nothing and
    raises IdempotencyConflictError (422).

    With `fan_out_flag_ttl` > 0 the same call also sets the topic's "fan-out queued" flag to
    `fan_out_token`, as enqueue.ensure_fan_out would in a round trip of its own; is_fan_out_flagged
    then says the caller must queue the job (enqueue.queue_flagged_fan_out).

    Instead of a `publish_key`, `own_key` is a unique token the hub drew for one publish, so that
    its own retries store it once: kept as it is (no digest of a key nobody else chose) with
    none of the body (each attempt sends the same), and not looked up on the first attempt.
    """
    tid, topic_keys, flag_key = _append_keys(topic)
    keys = [*topic_keys, activity_key(int(now) // 60), flag_key]
    args: list[Any] = [body, content_type, resourcesync, int(now * 1000), max_len, tid, topic, int(now),
                       max(0, fan_out_flag_ttl), fan_out_token or "-"]
    if publish_key is not None:
        keys.append(topic_publish_key(tid, hashlib.sha256(publish_key.encode()).hexdigest()[:32]))
        args += [max(1, key_ttl), hashlib.sha256(body).hexdigest(), "look"]
    elif own_key:
        keys.append(topic_publish_key(tid, f"hub.{own_key}"))
        args += [max(1, key_ttl), "-", "new" if is_first_attempt else "look"]
    entry_id, seq, repeat, flagged = await (batch.script(_APPEND, keys, args) if batch is not None
                                            else _APPEND(redis, keys, args))
    if int(repeat) == 2:
        raise IdempotencyConflictError(
            f"this Idempotency-Key was used for notification {text(entry_id)} (seq {int(seq)}) of this topic with "
            "another body; nothing was stored: send a new notification with a new key")
    return AppendedNotification(text(entry_id), tid, int(seq), bool(repeat), is_fan_out_flagged=bool(flagged))


async def append_notification_once(
    redis: Redis, topic: str, body: bytes, *, content_type: str, resourcesync: str = "",
    now: float, max_len: int, publish_key: str | None, key_ttl: int, fan_out_flag_ttl: int = 0,
    retry_for: float = APPEND_RETRY_FOR, batch: RedisBatcher | None = None,
) -> AppendedNotification:
    """append_notification for a publish, tried again (with the same key, so at most once) while
    Redis fails, for up to `retry_for` seconds. Without a `publish_key` (the publisher gave no
    Idempotency-Key) the key is the hub's own for this publish, kept `key_ttl` seconds.

    With `fan_out_flag_ttl` > 0 every attempt flags the topic's fan-out with one token of this
    publish, so an attempt whose answer was lost still leaves is_fan_out_flagged right on the next.

    Raises the last RedisError when no attempt can have reached Redis (nothing was stored: a
    503 is right), AppendUnknownError when one may have (then only a repeat with the same key
    can tell).
    """
    deadline = time.monotonic() + retry_for
    delay, reached = 0.1, False
    token = unique_token()
    is_first_attempt = True
    while True:
        try:
            return await append_notification(redis, topic, body, content_type=content_type,
                                             resourcesync=resourcesync, now=now, max_len=max_len,
                                             publish_key=publish_key, key_ttl=key_ttl,
                                             fan_out_flag_ttl=fan_out_flag_ttl, fan_out_token=token, batch=batch,
                                             own_key="" if publish_key is not None else token,
                                             is_first_attempt=is_first_attempt)
        except (RedisError, OSError) as exc:
            is_first_attempt = False
            reached = reached or not _never_sent(exc)
            if time.monotonic() + delay > deadline:
                if reached:
                    raise AppendUnknownError(
                        f"the hub could not confirm that it stored the notification (Redis: {exc}); send it again "
                        "with the same Idempotency-Key to learn its id without storing it twice") from exc
                raise
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)


def _never_sent(exc: BaseException) -> bool:
    """True for the errors redis-py raises before a command leaves: no connection could be made,
    or none was free in the pool. Anything else may have reached Redis."""
    message = str(exc)
    return any(part in message for part in ("connecting to", "Timeout connecting", "No connection available",
                                            "Connection refused"))


async def get_notification(redis: Redis, tid: str, nid: str) -> LogEntry | None:
    """One entry of the topic's log (None when it was never there, or was trimmed)."""
    found: list[Any] = await redis.xrange(topic_log_key(tid), nid, nid, count=1) or []
    return LogEntry.from_stream(*found[0]) if found else None


async def topic_ids(redis: Redis) -> list[str]:
    """Every topic id, sorted."""
    return sorted(text(t) for t in await redis.smembers(topics_key()))


async def count_topics(redis: Redis) -> int:
    return int(await redis.scard(topics_key()))


class LogFollower:
    """A follower's blocking reads of one topic's log (XREAD BLOCK), on a connection it keeps from
    one read to the next, each read with the topic's subscription change counter in the same
    round trip.

    A busy topic's follower reads hundreds of times a second: through the client, each read took
    a connection from the pool and gave it back, and its reply went through redis-py's parsing
    into dicts (~30 µs a read); here it is one pipelined exchange parsed straight into LogEntry.
    The connection goes back to the pool at `release` (the follower does so every lease renewal,
    so a Sentinel pool's check for a new primary still runs about once a second), and after any
    failure (disconnected first: a reply cut short must not reach the next user)."""

    def __init__(self, redis: Redis, tid: str) -> None:
        self._pool = redis.connection_pool
        self._conn: Any = None
        self._log_key, self._changes_key = topic_log_key(tid), topic_subs_changes_key(tid)

    async def wait(self, after: str, count: int, block_ms: int) -> tuple[list[LogEntry], bytes | None]:
        """(entries after `after`, oldest first, at most `count`; waiting up to `block_ms` for one,
        the topic's subscription change counter read just after them)."""
        if self._conn is None:
            self._conn = await self._pool.get_connection()
        conn = self._conn
        commands = (("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", self._log_key, after),
                    ("GET", self._changes_key))
        # one deadline past the block: a Redis that stopped answering fails the read as a command
        # through the client would
        timeout = None if conn.socket_timeout is None else conn.socket_timeout + block_ms / 1000
        try:
            # the client's own retry policy, as a command through the client has it
            answer, changes = await conn.retry.call_with_retry(
                lambda: exchange(conn, commands, timeout, "a read of the log"), lambda _: conn.disconnect())
            for reply in (answer, changes):
                if isinstance(reply, ResponseError):
                    raise reply
        except BaseException:
            await conn.disconnect()
            await self.release()
            raise
        return _stream_entries(answer), changes

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._pool.release(conn)


_FIELDS = [b"body", b"ctype", b"rs", b"seq", b"at"]    # as _APPEND's XADD writes them


def _stream_entries(answer: Any) -> list[LogEntry]:
    """The entries of an XREAD reply on one stream (RESP2: [[key, entries]], RESP3: {key: entries})."""
    if not answer:
        return []
    entries = next(iter(answer.values())) if isinstance(answer, dict) else answer[0][1]
    out = []
    for entry_id, flat in entries:
        if flat[::2] == _FIELDS:
            # the fields in the order every append writes them: taken by position (a follower
            # reads every entry of a busy topic, and the mapping cost as much as the rest)
            _, body, _, ctype, _, rs, _, seq, _, at = flat
            out.append(LogEntry(text(entry_id), body, text(ctype), text(rs), int(seq or 0), int(at or 0)))
        else:
            out.append(LogEntry.from_stream(entry_id, dict(zip(flat[::2], flat[1::2]))))
    return out

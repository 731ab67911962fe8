"""Topic logs: appending a notification (with its counters), reading entries, the topics themselves."""
from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from ..keys import (
    activity_key,
    stats_key,
    topic_id,
    topic_key,
    topic_log_key,
    topic_seq_key,
    topics_key,
)
from ..lua import Script
from ..records import (
    AppendedNotification,
    LogEntry,
    stream_pairs,
    text,
)

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


async def get_notification(redis: Redis, tid: str, nid: str) -> LogEntry | None:
    """One entry of the topic's log (None when it was never there, or was trimmed)."""
    found: list[Any] = await redis.xrange(topic_log_key(tid), nid, nid, count=1) or []
    return LogEntry.from_stream(*found[0]) if found else None


async def topic_ids(redis: Redis) -> list[str]:
    """Every topic id, sorted."""
    return sorted(text(t) for t in await redis.smembers(topics_key()))


async def count_topics(redis: Redis) -> int:
    return int(await redis.scard(topics_key()))


async def wait_for_entries(redis: Redis, tid: str, after: str, count: int, block_ms: int) -> list[LogEntry]:
    """Entries of the topic's log after `after`, waiting up to `block_ms` for one (XREAD BLOCK)."""
    answer: Any = await redis.xread({topic_log_key(tid): after}, count=count, block=block_ms)
    if not answer:
        return []
    return [LogEntry.from_stream(entry_id, dict(stream_pairs(fields))) for entry_id, fields in answer[0][1]]

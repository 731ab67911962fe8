"""The hub's recent past, minute by minute (deliveries, failures, publish→delivery latency), so
the status page's charts show the last hours as soon as it opens; and what each worker reports
about itself for the workers table. Both expire on their own: Redis holds at most
HISTORY_MINUTES small hashes and one hash per live worker."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis

from ..keys import history_key, rq_workers_key, worker_status_key
from ..records import text

HISTORY_MINUTES = 6 * 60            # what the status page draws
HISTORY_TTL = HISTORY_MINUTES * 60 + 120
WORKER_STATUS_TTL = 30              # s a worker's row outlives its last report (it reports every few s)

# history field <- the workers' counter fields (store.delivery_stats) it adds up
_FROM_COUNTERS = {
    "delivered": ("outcome:delivered",),
    "failed": ("outcome:retry", "outcome:dead"),
    "gone": ("outcome:gone",),
    "latency_sum": ("publish_to_delivery_seconds:sum",),
    "latency_count": ("publish_to_delivery_seconds:count",),
}


def minute_commands(counters: Mapping[str, float], now: float) -> list[tuple[Any, ...]]:
    """The Redis commands that add a worker's freshly counted deliveries to the current minute
    (run through the worker's batcher, beside the counters themselves)."""
    key = history_key(int(now) // 60)
    commands: list[tuple[Any, ...]] = []
    for name, sources in _FROM_COUNTERS.items():
        value = sum(counters.get(source, 0.0) for source in sources)
        if value:
            command = "HINCRBYFLOAT" if name == "latency_sum" else "HINCRBY"
            commands.append((command, key, name, repr(value) if command == "HINCRBYFLOAT" else int(value)))
    if commands:
        commands.append(("EXPIRE", key, HISTORY_TTL))
    return commands


async def delivery_history(redis: Redis, now: float, minutes: int = HISTORY_MINUTES) -> list[dict[str, Any]]:
    """One row per minute, oldest first, ending with the current one: {minute (epoch s of its
    start), delivered, failed, gone, latency_ms (average publish→delivery, None without any)}."""
    last = int(now) // 60
    span: Sequence[int] = range(last - minutes + 1, last + 1)
    async with redis.pipeline(transaction=False) as pipe:
        for minute in span:
            pipe.hgetall(history_key(minute))
        replies = await pipe.execute()
    rows = []
    for minute, raw in zip(span, replies):
        values = {text(k): float(v) for k, v in raw.items()}
        count = values.get("latency_count", 0.0)
        rows.append({"minute": minute * 60, "delivered": int(values.get("delivered", 0)),
                     "failed": int(values.get("failed", 0)), "gone": int(values.get("gone", 0)),
                     "latency_ms": round(values.get("latency_sum", 0.0) / count * 1000, 1) if count else None})
    return rows


def worker_status_commands(name: str, status: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The commands that record what a worker says about itself (host, pid, claims, lanes, seen)."""
    key = worker_status_key(name)
    flat: list[Any] = []
    for field, value in status.items():
        flat += [field, str(value)]
    return [("HSET", key, *flat), ("EXPIRE", key, WORKER_STATUS_TTL)]


RQ_WORKER_PREFIX = "rq:worker:"     # RQ names each registered worker's hash so (rq_workers_key() lists them)


async def worker_rows(redis: Redis) -> list[dict[str, Any]]:
    """The registered workers, by name: what RQ keeps (host, pid, state, heartbeat) and what each
    reports about its deliveries (claims, topics followed, slots). A worker whose RQ hash is gone
    (it stopped) is left out."""
    members = sorted(text(m) for m in await redis.smembers(rq_workers_key()))
    async with redis.pipeline(transaction=False) as pipe:
        for member in members:
            pipe.hmget(member, "hostname", "pid", "state", "last_heartbeat", "birth")
            pipe.hgetall(worker_status_key(member.removeprefix(RQ_WORKER_PREFIX)))
        replies = await pipe.execute()
    rows = []
    for index, member in enumerate(members):
        (host, pid, state, heartbeat, birth), raw = replies[2 * index], replies[2 * index + 1]
        if host is None and pid is None:
            continue
        own = {text(k): text(v) for k, v in raw.items()}
        seen = max(_epoch(text(heartbeat)), float(own.get("seen") or 0))
        rows.append({"name": member.removeprefix(RQ_WORKER_PREFIX), "host": own.get("host") or text(host),
                     "pid": int(own.get("pid") or text(pid) or 0), "state": text(state), "started": _epoch(text(birth)),
                     "last_seen": seen or None, "claims": _int_or_none(own.get("claims")),
                     "following": _int_or_none(own.get("following")), "slots": _int_or_none(own.get("slots"))})
    return rows


def _epoch(value: str) -> float:
    """RQ's UTC timestamps ('2026-11-23T15:40:00.123456Z') as epoch seconds; 0.0 when absent."""
    if not value:
        return 0.0
    try:
        return datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp()   # RQ writes UTC
    except ValueError:
        return 0.0


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None

"""What the workers' periodic maintenance reads and writes, on a synchronous client: it runs
in a thread beside the worker's event loop (see worker/reconciler.py)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis as redis_sync

from ..keys import (
    maintenance_key,
    sub_key,
    sub_lock_key,
    topic_log_key,
    topic_subs_key,
    topics_key,
    verify_pending_key,
    worker_alive_key,
)
from ..records import text


def take_turn(connection: redis_sync.Redis, task: str, seconds: float) -> bool:
    """True for the one worker (hub-wide) that runs `task` in this period of `seconds`."""
    return bool(connection.set(maintenance_key(task), 1, nx=True, px=max(1, int(seconds * 1000))))


def scan_topic_ids(connection: redis_sync.Redis, cursor: int, count: int) -> tuple[int, list[str]]:
    """One SSCAN step over the topic ids: (next cursor, 0 when done; some ids)."""
    cursor, raw = connection.sscan(topics_key(), cursor, count=count)
    return cursor, [text(t) for t in raw]


def topic_ends(connection: redis_sync.Redis, tids: Sequence[str]) -> list[tuple[str | None, list[str]]]:
    """Per topic: (its log's last entry id, None for an empty log; its active subscription ids)."""
    with connection.pipeline(transaction=False) as pipe:
        for tid in tids:
            pipe.xrevrange(topic_log_key(tid), "+", "-", count=1)
            pipe.smembers(topic_subs_key(tid))
        answers = pipe.execute()
    return [(text(last[0][0]) if last else None, [text(s) for s in sids])
            for last, sids in zip(answers[::2], answers[1::2])]


def delivery_states(connection: redis_sync.Redis, sids: Sequence[str]) -> list[tuple[Any, ...]]:
    """Per subscription: (state, expires, cursor, retry_at, resend, is claimed) as Redis answers them.
    A claim counts only while the worker holding it lives (its heartbeat key exists)."""
    with connection.pipeline(transaction=False) as pipe:
        for sid in sids:
            pipe.hmget(sub_key(sid), "state", "expires", "cursor", "retry_at", "resend")
            pipe.get(sub_lock_key(sid))
        answers = pipe.execute()
    holders = [text(token).split(":", 1)[0] if token else "" for token in answers[1::2]]
    alive = _alive(connection, {h for h in holders if h})
    return [(*fields, holder in alive) for fields, holder in zip(answers[::2], holders)]


def _alive(connection: redis_sync.Redis, wids: set[str]) -> set[str]:
    """Which of the worker ids still beat their heartbeat."""
    if not wids:
        return set()
    ordered = sorted(wids)
    with connection.pipeline(transaction=False) as pipe:
        for wid in ordered:
            pipe.exists(worker_alive_key(wid))
        return {wid for wid, exists in zip(ordered, pipe.execute()) if exists}


def has_pending_verifications(connection: redis_sync.Redis) -> bool:
    """Do subscription requests wait in line for a verify_pending job?"""
    return bool(connection.llen(verify_pending_key()))


def trim_logs(connection: redis_sync.Redis, tids: Sequence[str], min_id: str) -> None:
    """Drop the entries older than `min_id` from the topics' logs (approximately, cheaply)."""
    with connection.pipeline(transaction=False) as pipe:
        for tid in tids:
            pipe.xtrim(topic_log_key(tid), minid=min_id, approximate=True)
        pipe.execute()

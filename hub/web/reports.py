"""Read-only views of the hub's Redis state for operators: totals, topics, subscriptions, and why a
subscription is in trouble. The admin API, the status page, /metrics and subscriber diagnostics
all read through here. Reads only, in a few pipelined round trips; no HTTP.
"""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis

from rsnotify.datetimes import format_datetime
from rsnotify.errors import RsnotifyError
from rsnotify.xml import parse_notification

from .. import store
from ..records import LATENCY_BUCKETS, text, to_float, to_int
from ..settings import HubSettings
from ..store import history

SCAN_LIMIT = 20_000         # subscriptions looked at for totals and trouble (the lease zset's first ones)
SCAN_CACHE_SECONDS = 2.0    # a scan is shared by the requests of this process for this long
STALLED_AFTER = 300         # s without an attempt while notifications wait: "stalled"
LEASE_WARN_MAX = 86_400     # "lease ends soon": within a tenth of the lease, at most a day
ACTIVITY_MINUTES = 60
TROUBLE_SHOWN = 100
BUSIEST_SHOWN = 10
RECENT_NOTIFICATIONS = 20

SUMMARY_FIELDS = ("topic", "callback", "tid", "state", "expires", "lease_seconds", "created", "cursor",
                  "cursor_seq", "attempts", "next_attempt", "last_status", "last_error", "last_attempt_at",
                  "last_latency_ms", "last_outcome", "delivered", "gaps", "last_gap", "resend", "last_delivered_at")

@dataclass(frozen=True, slots=True)
class SubscriptionSummary:
    """What an operator (or the subscriber itself) needs to know about one subscription."""

    sid: str
    topic: str
    callback: str
    tid: str
    state: str                # active | paused
    expires: int              # epoch s
    lease_seconds: int
    created: int
    attempts: int             # failed attempts of the notification now being retried (0: none)
    next_attempt: float       # epoch s of the next retry (0: none)
    last_status: str          # HTTP status of the last attempt; "" for no answer (or no attempt yet)
    last_error: str
    last_attempt_at: int
    last_latency_ms: float
    last_outcome: str         # delivered | retry | gone | dead | "" (no attempt yet)
    delivered: int            # notifications confirmed with a 2xx
    gaps: int                 # notifications that left the log before they could be delivered
    last_gap: str
    resend: int               # dead letters queued for re-sending
    backlog: int              # notifications published but not confirmed yet
    dead_letters: int
    last_delivered_at: int = 0  # epoch s of the last 2xx (0: none since the hub began keeping it)

    def refusing_since(self) -> int | None:
        """Since when the callback has refused every delivery (epoch s), or None: its last attempt
        succeeded, it has had none, or a success before the hub kept their times hides when."""
        if self.last_outcome not in ("retry", "dead") or not (self.attempts or self.dead_letters):
            return None
        if self.last_delivered_at:
            return self.last_delivered_at
        return self.created if self.delivered == 0 else None

    def is_dormant(self, now: float, dormant_after: float) -> bool:
        """Has the callback refused everything for longer than `dormant_after` seconds? (An
        active subscription: a paused or ended one is the operator's or the lease's business.)"""
        since = self.refusing_since()
        return since is not None and self.state == "active" and self.expires >= now and now - since > dormant_after

    def trouble(self, now: float) -> list[str]:
        """Why this subscription needs a look, one reason each (empty: it is fine)."""
        reasons = []
        if self.expires < now:
            reasons.append("lease ended; it receives nothing until the subscriber renews")
        elif self.expires - now < min(LEASE_WARN_MAX, max(self.lease_seconds, 1) / 10):
            reasons.append(f"lease ends in {_duration(self.expires - now)}")
        if self.state == "paused":
            reasons.append("paused by an operator")
        if self.attempts > 0:
            reasons.append(f"retrying: {self.attempts} failed attempt(s), last "
                           f"{short_error(self.last_status, self.last_error)}")
        if self.dead_letters:
            reasons.append(f"{self.dead_letters} dead letter(s)")
        if (self.state == "active" and self.attempts == 0 and self.backlog > 0
                and now - max(self.last_attempt_at, self.created) > STALLED_AFTER):
            reasons.append(f"stalled: {self.backlog} notification(s) waiting and no attempt for "
                           f"{_duration(now - max(self.last_attempt_at, self.created))} (are workers running?)")
        return reasons

    def problem(self, now: float) -> str:
        """The trouble in one short line a person reads at a glance ("" when there is none):
        `connection refused · next try 13:31:56 UTC`, `3 dead letters · last HTTP 500`."""
        if self.state == "paused":
            return "paused by an operator"
        if self.expires < now:
            return "lease ended: nothing is delivered until the subscriber renews"
        last = short_error(self.last_status, self.last_error)
        if self.attempts > 0:
            when = f"next try {clock_time(self.next_attempt, now)}" if self.next_attempt else "retry pending"
            return f"{last} · {when} · attempt {self.attempts + 1}"
        if self.dead_letters:
            return f"{self.dead_letters} dead letter{'s' if self.dead_letters != 1 else ''} · last {last}"
        reasons = self.trouble(now)
        return reasons[0] if reasons else ""

    def dormant_problem(self, now: float) -> str:
        """`dormant: refused every delivery for 3 d · last connection refused`."""
        since = self.refusing_since() or self.created
        return (f"dormant: refused every delivery for {_duration(now - since)} · last "
                f"{short_error(self.last_status, self.last_error)}")

    def to_json(self, now: float, dormant_after: float | None = None) -> dict[str, Any]:
        data = asdict(self)
        data["expires_in"] = int(self.expires - now)
        data["trouble"] = self.trouble(now)
        data["problem"] = self.problem(now)
        data["last_error_short"] = short_error(self.last_status, self.last_error) if self.last_outcome else ""
        data["refusing_since"] = self.refusing_since()
        if dormant_after is not None:
            data["dormant"] = self.is_dormant(now, dormant_after)
            if data["dormant"]:
                data["problem"] = self.dormant_problem(now)
        return data

    def matches(self, search: str) -> bool:
        """Whether `search` (lower case) occurs in the topic, the callback or the id."""
        return search in self.topic.lower() or search in self.callback.lower() or self.sid.startswith(search)


# what a raw client error says, in the words an operator uses (first match wins)
_ERROR_WORDS = (
    (("connection refused", "connect call failed"), "connection refused"),
    (("timeout", "timed out"), "no answer in time"),
    (("name or service not known", "nodename nor servname", "temporary failure in name resolution",
      "no address associated"), "host name not found"),
    (("ssl", "certificate", "tls"), "TLS failed"),
    (("server disconnected", "connection reset", "connection closed"), "connection closed without an answer"),
    (("refused by the hub", "not allowed", "private", "reserved"), "address not allowed"),
)


def short_error(status: str | int | None, error: str) -> str:
    """One short phrase for an attempt's result: `HTTP 503`, `connection refused`, ..."""
    if status not in (None, ""):
        return f"HTTP {status}"
    lowered = error.lower()
    for needles, words in _ERROR_WORDS:
        if any(needle in lowered for needle in needles):
            return words
    first = error.strip().split(";")[0].split(":")[0].strip()
    return (first[:60] + "…" if len(first) > 60 else first) or "no answer"


def clock_time(epoch: float, now: float) -> str:
    """HH:MM:SS UTC (with the date when it is not today's)."""
    moment, today = datetime.fromtimestamp(epoch, UTC), datetime.fromtimestamp(now, UTC)
    pattern = "%H:%M:%S UTC" if moment.date() == today.date() else "%Y-%m-%d %H:%M:%S UTC"
    return moment.strftime(pattern)


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


# --- subscriptions ------------------------------------------------------------------------


async def summarize(redis: Redis, sids: Iterable[str]) -> list[SubscriptionSummary]:
    """Summaries of the given subscriptions (unknown ones are left out), in the order given."""
    rows = await store.subscription_rows(redis, list(sids), SUMMARY_FIELDS)   # fields[1], the callback: it exists
    seqs = await store.topic_sequences(redis, sorted({text(values[2]) for _, values, _ in rows}))
    summaries = []
    for sid, values, dead in rows:
        v = dict(zip(SUMMARY_FIELDS, values))
        tid = text(v["tid"])
        if v["cursor_seq"] is not None:
            backlog = max(0, to_int(seqs.get(tid)) - to_int(v["cursor_seq"]))
        else:   # a subscription from before cursor_seq existed: count from its cursor
            backlog = await store.subscription_backlog(redis, sid)
        summaries.append(SubscriptionSummary(
            sid=sid, topic=text(v["topic"]), callback=text(v["callback"]), tid=tid,
            state=text(v["state"], "active"), expires=to_int(v["expires"]), lease_seconds=to_int(v["lease_seconds"]),
            created=to_int(v["created"]), attempts=to_int(v["attempts"]), next_attempt=to_float(v["next_attempt"]),
            last_status=text(v["last_status"]), last_error=text(v["last_error"]),
            last_attempt_at=to_int(v["last_attempt_at"]), last_latency_ms=to_float(v["last_latency_ms"]),
            last_outcome=text(v["last_outcome"]), delivered=to_int(v["delivered"]), gaps=to_int(v["gaps"]),
            last_gap=text(v["last_gap"]), resend=to_int(v["resend"]), backlog=backlog, dead_letters=dead,
            last_delivered_at=to_int(v["last_delivered_at"])))
    return summaries


class NotificationFacts:
    """Change count and from/until of the notifications a topic page showed, by notification id:
    a stored notification never changes, so each is parsed once per web process (the last
    `size` are kept)."""

    def __init__(self, size: int = 1_000) -> None:
        self.size = size
        self._facts: OrderedDict[str, dict[str, Any]] = OrderedDict()

    async def of(self, entries: list[tuple[str, bytes]]) -> list[dict[str, Any]]:
        """The facts of each (notification id, body), in the order given."""
        new = [(nid, body) for nid, body in entries if nid not in self._facts]
        if new:
            for nid, facts in zip([nid for nid, _ in new], await asyncio.to_thread(_read_facts, [b for _, b in new])):
                self._facts[nid] = facts
            while len(self._facts) > self.size:
                self._facts.popitem(last=False)
        return [self._facts.get(nid, _NO_FACTS) for nid, _ in entries]


_NO_FACTS: dict[str, Any] = {"changes": None, "from": None, "until": None}


def _read_facts(bodies: list[bytes]) -> list[dict[str, Any]]:
    facts = []
    for body in bodies:
        try:
            notification = parse_notification(body)
        except RsnotifyError:   # stored by an older hub, or not a notification: no facts to show
            facts.append(_NO_FACTS)
            continue
        facts.append({"changes": len(notification.changes), "from": format_datetime(notification.from_time),
                      "until": format_datetime(notification.until_time)})
    return facts


class ScanCache:
    """The last scan of the hub's subscriptions, shared for SCAN_CACHE_SECONDS by the requests of
    one web process (the app holds one), so a busy status page costs Redis little."""

    def __init__(self, max_age: float = SCAN_CACHE_SECONDS) -> None:
        self.max_age = max_age
        self.facts = NotificationFacts()   # the topic pages' read cache, beside the scan they share
        self._at = 0.0
        self._summaries: list[SubscriptionSummary] | None = None
        self._lock = asyncio.Lock()

    async def get(self, redis: Redis, *, limit: int = SCAN_LIMIT) -> list[SubscriptionSummary]:
        async with self._lock:
            if self._summaries is None or time.monotonic() - self._at > self.max_age:
                self._summaries = await scan_subscriptions(redis, limit=limit)
                self._at = time.monotonic()
            return self._summaries

    def forget(self) -> None:
        """Drop the scan (after an admin action, so the next view shows its effect)."""
        self._summaries = None


async def scan_subscriptions(redis: Redis, *, limit: int = SCAN_LIMIT) -> list[SubscriptionSummary]:
    """Summaries of the hub's subscriptions: the first `limit` by lease end."""
    return await summarize(redis, await store.subscription_ids_by_lease(redis, 0, limit))


async def subscription_detail(redis: Redis, sid: str, now: float, dormant_after: float | None = None,
                              ) -> dict[str, Any] | None:
    """Everything about one subscription, for its page: summary, lease, cursor, attempts, dead letters.
    Each attempt and dead letter carries `error_short` beside the raw `error`."""
    found = await summarize(redis, [sid])
    if not found:
        return None
    summary = found[0]
    has_secret, cursor = await store.subscription_cursor(redis, sid)
    replayed = await store.subscription_replayed(redis, sid)
    attempts = await store.recent_attempts(redis, sid)
    letters = await store.list_dead_letters(redis, sid)
    data = summary.to_json(now, dormant_after)
    data.update(
        has_secret=has_secret, cursor=cursor, replayed=replayed,
        attempts_recent=[{"at": a.at, "notification_id": a.notification_id, "sequence": a.sequence,
                          "status": a.status, "error": a.error, "latency_ms": a.latency_ms,
                          "outcome": a.outcome, "attempt": a.attempt,
                          "error_short": "" if a.outcome == "delivered" else short_error(a.status, a.error)}
                         for a in attempts],
        dead_letters_list=[{"notification_id": d.notification_id, "sequence": d.sequence,
                            "published_ms": d.published_ms, "content_type": d.content_type,
                            "attempts": d.attempts, "status": d.status, "error": d.error,
                            "error_short": short_error(d.status, d.error),
                            "dead_at": d.dead_at, "resend": d.resend} for d in letters],
    )
    return data


# --- topics -------------------------------------------------------------------------------


async def topic_rows(redis: Redis, tids: list[str]) -> list[dict[str, Any]]:
    """One line per topic: url, published (its sequence), log length, subscriptions, last publish."""
    rows = []
    for tid, ((url, created), seq, length, subs, last) in zip(tids, await store.topic_row_replies(redis, tids)):
        if url is None:
            continue
        last_ms = to_int(last[0][1].get(b"at")) if last else 0
        rows.append({"tid": tid, "url": text(url), "created": to_int(created), "published": to_int(seq),
                     "log_length": int(length), "subscriptions": int(subs), "last_published_ms": last_ms})
    return rows


async def topic_detail(redis: Redis, tid: str, now: float, dormant_after: float | None = None,
                       facts: NotificationFacts | None = None) -> dict[str, Any] | None:
    """One topic: its line, its subscriptions, and its most recent notifications (no bodies; each
    with its change count and from/until)."""
    rows = await topic_rows(redis, [tid])
    if not rows:
        return None
    data = rows[0]
    sids = await store.topic_subscription_ids(redis, tid)
    data["subscriptions_list"] = [s.to_json(now, dormant_after) for s in await summarize(redis, sids[:1000])]
    recent = await store.recent_entries(redis, tid, RECENT_NOTIFICATIONS)
    read = await (facts or NotificationFacts()).of([(text(entry_id), f.get(b"body", b"")) for entry_id, f in recent])
    data["recent_notifications"] = [
        {"notification_id": text(entry_id), "sequence": to_int(f.get(b"seq")), "published_ms": to_int(f.get(b"at")),
         "content_type": text(f.get(b"ctype")), "resourcesync": text(f.get(b"rs")),
         "bytes": len(f.get(b"body", b"")), **facts_of}
        for (entry_id, f), facts_of in zip(recent, read)]
    return data


# --- the whole hub ------------------------------------------------------------------------


async def activity(redis: Redis, now: float) -> tuple[list[int], dict[str, int]]:
    """Publishes per minute over the last hour (oldest first) and per topic id over that hour
    (the busiest topics of each minute, so counts of quiet topics may be left out)."""
    minute = int(now) // 60
    minutes = list(range(minute - ACTIVITY_MINUTES + 1, minute + 1))
    answers = await store.activity_replies(redis, minutes, 4 * BUSIEST_SHOWN)
    per_minute = [int(everything or 0) for everything, _ in answers]
    per_topic: dict[str, int] = {}
    for _, busiest in answers:
        for member, score in busiest:
            tid = text(member)
            if tid != "*":
                per_topic[tid] = per_topic.get(tid, 0) + int(score)
    return per_minute, per_topic


async def queue_depths(redis: Redis, settings: HubSettings, now: float) -> dict[str, Any]:
    """RQ queue depths, retries waiting (due zset), and live workers."""
    return await store.queue_depths(redis, settings.queue_name, now)


def histogram(stats: dict[str, float], name: str) -> dict[str, Any]:
    """A latency histogram from the stats hash: cumulative buckets, sum, count, and estimates."""
    bounds = [*LATENCY_BUCKETS, float("inf")]
    counts, running = [], 0.0
    for bound in bounds:
        label = "+Inf" if bound == float("inf") else repr(bound)
        running += stats.get(f"{name}:le:{label}", 0.0)
        counts.append(running)
    total = stats.get(f"{name}:count", running)
    labels = ["+Inf" if b == float("inf") else repr(b) for b in bounds]   # JSON has no Infinity
    return {"buckets": list(zip(labels, counts)), "sum": stats.get(f"{name}:sum", 0.0), "count": total,
            "p50": _quantile(bounds, counts, 0.5), "p95": _quantile(bounds, counts, 0.95)}


def _quantile(bounds: list[float], cumulative: list[float], q: float) -> float | None:
    """The bucket bound under which a fraction `q` of observations fall (None without any)."""
    if not cumulative or cumulative[-1] == 0:
        return None
    target = q * cumulative[-1]
    for bound, count in zip(bounds, cumulative):
        if count >= target:
            return None if bound == float("inf") else bound
    return None


def prefixed(stats: dict[str, float], prefix: str) -> dict[str, int]:
    return {k[len(prefix):]: int(v) for k, v in stats.items() if k.startswith(prefix)}


async def overview(redis: Redis, settings: HubSettings, now: float, scan: ScanCache | None = None,
                   ) -> dict[str, Any]:
    """The status page's front: totals, activity, latency, queues, busiest topics, trouble, workers
    (the per-minute history is its own call, /admin/history: it changes once a minute)."""
    topics, subscriptions, stats = await store.totals(redis)
    per_minute, per_topic = await activity(redis, now)
    summaries = await (scan.get(redis) if scan is not None else scan_subscriptions(redis))
    dormant = [s for s in summaries if s.is_dormant(now, settings.dormant_after)]
    dormant.sort(key=lambda s: s.refusing_since() or 0)
    dormant_ids = {s.sid for s in dormant}
    troubled = [(s, s.trouble(now)) for s in summaries if s.sid not in dormant_ids]
    troubled = [(s, why) for s, why in troubled if why]
    troubled.sort(key=lambda t: (-t[0].dead_letters, -t[0].attempts, t[0].expires))
    busiest_tids = sorted(per_topic, key=lambda t: -per_topic[t])[:BUSIEST_SHOWN]
    busiest = await topic_rows(redis, busiest_tids)
    for row in busiest:
        row["last_hour"] = per_topic[row["tid"]]
    states = {"active": 0, "paused": 0, "expired": 0}
    for s in summaries:
        states["expired" if s.expires < now else s.state if s.state in states else "active"] += 1
    return {
        "hub_url": settings.hub_url,
        "now": now,
        "topics": topics,
        "subscriptions": subscriptions,
        "subscriptions_by_state": states,
        "subscriptions_scanned": len(summaries),
        "backlog": sum(s.backlog for s in summaries),
        "dead_letters": sum(s.dead_letters for s in summaries),
        "published": int(stats.get("publishes", 0)),
        "published_bytes": int(stats.get("publish_bytes", 0)),
        "published_last_hour": sum(per_minute),
        "published_per_minute": per_minute,
        "deliveries": prefixed(stats, "outcome:"),
        "status_classes": prefixed(stats, "status:"),
        "verifications": prefixed(stats, "verification:"),
        "delivery_seconds": histogram(stats, "delivery_seconds"),
        "publish_to_delivery_seconds": histogram(stats, "publish_to_delivery_seconds"),
        "queues": await queue_depths(redis, settings, now),
        "busiest_topics": busiest,
        "trouble": [dict(s.to_json(now), trouble=why) for s, why in troubled[:TROUBLE_SHOWN]],
        "trouble_count": len(troubled),
        # refused everything for longer than --dormant-after: apart from live trouble, oldest first
        "dormant": [s.to_json(now, settings.dormant_after) for s in dormant[:TROUBLE_SHOWN]],
        "dormant_count": len(dormant),
        "dormant_after": settings.dormant_after,
        "workers": await history.worker_rows(redis),
    }

"""The values the hub keeps in Redis, as Python records: intents, subscriptions, log entries,
delivery attempts, dead letters; and the decoding of Redis's byte replies that all of them share.

No Redis calls here (store and claims make them); these are plain data and their encodings.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Fields of the sub hash a delivery run needs, in this order (a claim returns them).
DELIVERY_FIELDS = ("topic", "callback", "tid", "secret", "state", "expires", "cursor", "cursor_seq",
                   "attempts", "retry_at", "resend")
# Upper bounds (seconds) of the latency histograms in keys.stats_key(); the last bucket is "+Inf".
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
RECENT_ATTEMPTS = 20   # failed attempts (retry, gone, dead) kept per subscription in keys.sub_attempts_key


# --- decoding Redis replies (clients are created with decode_responses=False) ----------------


def text(value: Any, default: str = "") -> str:
    """A reply as str (bytes decoded as UTF-8); `default` for None."""
    if value is None:
        return default
    return value.decode("utf-8") if isinstance(value, bytes) else value


def to_int(value: Any, default: int = 0) -> int:
    """A reply as int; `default` for None or ""."""
    found = text(value)
    return int(found) if found else default


def to_float(value: Any, default: float = 0.0) -> float:
    """A reply as float; `default` for None or ""."""
    found = text(value)
    return float(found) if found else default


def parse_entry_id(entry_id: str) -> tuple[int, int]:
    """A stream entry id "ms-seq" as a tuple that compares in log order."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def stream_pairs(flat: Any) -> Iterable[tuple[bytes, bytes]]:
    """A stream entry's fields as pairs, whether the client answered a dict or a flat list (EVAL)."""
    if isinstance(flat, dict):
        return flat.items()
    return zip(flat[::2], flat[1::2])


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
    replay_from: int = 0      # rsnotify.replay_from: the first sequence a subscriber wants (0: none)

    def to_hash(self) -> dict[Any, Any]:  # redis-py types its mapping invariantly
        return {"mode": self.mode, "topic": self.topic, "callback": self.callback,
                "lease": str(self.lease_seconds), "secret": self.secret, "reason": self.reason,
                "replay": str(self.replay_from)}

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> Intent:
        return cls(mode=text(raw.get(b"mode")), topic=text(raw.get(b"topic")),
                   callback=text(raw.get(b"callback")), lease_seconds=to_int(raw.get(b"lease")),
                   secret=text(raw.get(b"secret")), reason=text(raw.get(b"reason")),
                   replay_from=to_int(raw.get(b"replay")))


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
            sid=sid, topic=text(raw.get(b"topic")), callback=text(raw.get(b"callback")),
            tid=text(raw.get(b"tid")), secret=text(raw.get(b"secret")),
            lease_seconds=to_int(raw.get(b"lease_seconds")), expires=to_int(raw.get(b"expires")),
            created=to_int(raw.get(b"created")), state=text(raw.get(b"state"), "active"),
            cursor=text(raw.get(b"cursor"), "0-0"), attempts=to_int(raw.get(b"attempts")),
            next_attempt=to_int(raw.get(b"next_attempt")), last_status=text(raw.get(b"last_status")),
            last_error=text(raw.get(b"last_error")), last_attempt_at=to_int(raw.get(b"last_attempt_at")),
        )


@dataclass(frozen=True, slots=True)
class AppendedNotification:
    """Where a notification landed: its id (the stream entry id), its topic and position."""

    notification_id: str
    topic_id: str
    sequence: int
    is_repeat: bool = False       # an earlier publish with the same Idempotency-Key stored it
    is_fan_out_flagged: bool = False  # the append flagged the topic's fan-out: the caller queues the job


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
        return cls(notification_id=text(entry_id), body=raw.get(b"body", b""),
                   content_type=text(raw.get(b"ctype"), "application/xml"),
                   resourcesync=text(raw.get(b"rs")), sequence=to_int(raw.get(b"seq")),
                   published_ms=to_int(raw.get(b"at")))


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


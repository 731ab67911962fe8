"""What a delivery run works with: the claim on a subscription in memory (SubRun), the items
it sends, the headers every subscriber gets, and what a fan-out reports."""
from __future__ import annotations

import asyncio
import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from yarl import URL

from rsnotify.errors import WireError
from rsnotify.outbound import HeaderLines
from rsnotify.websub import NOTIFICATION_ID_HEADER, SEQUENCE_HEADER, build_link_header

from ..callbacks import as_uri
from ..records import LogEntry, parse_entry_id


class Item(NamedTuple):
    """One thing to send to a subscription: a log entry, or a dead letter being re-sent.

    A NamedTuple rather than a frozen dataclass: the follower makes one per log entry, and a
    frozen dataclass's __init__ (a setattr per field) cost three times a tuple's."""

    entry: LogEntry
    headers: HeaderLines          # everything but the signature, written once per notification
    key: tuple[int, int]          # the entry id, comparable
    is_resend: bool = False
    problem: str = ""             # why it cannot be sent at all ("" when it can): each attempt fails with it


_NO_HEADERS = HeaderLines({})


def make_item(entry: LogEntry, topic: str, hub_url: str, key: tuple[int, int] | None = None, *,
              is_resend: bool = False) -> Item:
    """The item of a log entry (or a dead letter), with the headers every subscriber gets with it
    (the signature is added per subscriber). What cannot be sent (a Link target or a
    Content-Type no header may carry, stored by an older hub) becomes an item whose attempts
    fail, so it ends as a dead letter instead of jamming the topic."""
    key = key or parse_entry_id(entry.notification_id)
    topic_lines, problem = _topic_lines(topic, hub_url, entry.resourcesync, entry.content_type)
    if not problem and _CONTROL.search(entry.notification_id):
        problem = _control_problem(entry.content_type)
    if problem or topic_lines is None:
        return Item(entry, _NO_HEADERS, key, is_resend, problem)
    return Item(entry, topic_lines.plus((NOTIFICATION_ID_HEADER, entry.notification_id),
                                        (SEQUENCE_HEADER, str(entry.sequence))), key, is_resend)


# A character no header value may carry (a C0 control or DEL): one regex scan per value, where a
# loop over the characters in Python cost a fifth of a worker's time with one busy subscriber.
_CONTROL = re.compile("[\x00-\x1f\x7f]")


@functools.lru_cache(maxsize=1024)
def _topic_lines(topic: str, hub_url: str, resourcesync: str, content_type: str) -> tuple[HeaderLines | None, str]:
    # (the Content-Type and Link lines, why these headers cannot be sent or ""): the same few
    # values for every notification of a topic, so built and checked once, not per entry (the
    # sequence is a number and the id is checked per entry)
    try:
        link = _link_header(topic, hub_url, resourcesync)
    except (WireError, ValueError) as exc:
        return None, f"cannot be sent: {exc}"
    if _CONTROL.search(content_type) or _CONTROL.search(link):
        return None, _control_problem(content_type)
    return HeaderLines({"Content-Type": content_type, "Link": link}), ""


def _control_problem(content_type: str) -> str:
    return f"cannot be sent: a header would carry a control character ({content_type!r})"


@functools.lru_cache(maxsize=1024)
def _link_header(topic: str, hub_url: str, resourcesync: str) -> str:
    # The same few values for every notification of a topic: built (and checked) once, not per
    # entry. A refused one raises each time (lru_cache keeps no exceptions).
    # a header carries URIs (RFC 8288): a topic in another script goes as percent-encoded UTF-8,
    # not raw bytes a WSGI app reads as Latin-1
    links = [(as_uri(topic), "self"), (as_uri(hub_url), "hub")]
    if resourcesync:
        links.append((as_uri(resourcesync), "resourcesync"))
    return build_link_header(links)


@dataclass(slots=True)
class FanOutReport:
    """What one fan-out (or one subscription's delivery job) did."""

    topic_id: str
    subscriptions: int = 0        # subscriptions of the topic looked at
    served: int = 0               # claimed and served by this call
    busy: int = 0                 # owned by another run at that moment (that run delivers)
    delivered: int = 0
    failed: int = 0               # attempts that will be retried, or ended as dead letters
    gone: int = 0

    def add(self, run: SubRun) -> None:
        self.delivered += run.delivered_total
        self.failed += run.failed_total
        self.gone += run.gone


@dataclass(slots=True)
class SubRun:
    """One claim on a subscription: its delivery state in memory while this worker owns it."""

    sid: str
    token: str
    topic: str
    callback: str
    tid: str
    url: URL
    secret: str | None = field(repr=False)
    state: str
    expires: int
    cursor: str
    cursor_key: tuple[int, int]
    cursor_seq: int | None
    attempts: int
    next_attempt: float
    resend: int
    renewals: int = 0             # the renewals counter when `secret` was read (Deliveries re-reads it past that)
    stop: bool = False            # lost its lock, removed, paused, or the worker is stopping
    gone: int = 0
    # written at the next checkpoint
    fields: dict[str, Any] = field(default_factory=dict)
    # the latest attempt (status, error, at, latency ms, outcome) and success: their last_* fields
    # are built at the checkpoint (a few a second), not at every delivery (thousands)
    last_attempt: tuple[int | None, str, float, float, str] | None = None
    last_delivered_at: float = 0.0
    records: list[str] = field(default_factory=list)
    delivered: int = 0
    gaps: int = 0
    delivered_total: int = 0
    failed_total: int = 0
    host: str = ""                # the callback host (hosts.host_of), whose cap its sends share
    lane: asyncio.Semaphore | None = field(default=None, repr=False)   # the lane whose slot it takes
    has_slot: bool = False        # holds one of the lane's slots right now
    slot_since: float = 0.0       # monotonic time it (re)took that slot: its slice counts from here

    @property
    def is_dirty(self) -> bool:
        return bool(self.fields or self.records or self.last_attempt)

    def take_fields(self) -> dict[str, Any]:
        """The subscription fields to write at a checkpoint (cursor included); none are pending after."""
        fields, self.fields = self.fields, {}
        if self.last_delivered_at:
            fields["last_delivered_at"] = int(self.last_delivered_at)   # the status page tells a dormant callback by it
            self.last_delivered_at = 0.0
        if self.last_attempt is not None:
            status, error, at, ms, outcome = self.last_attempt
            fields.update(attempts=self.attempts, next_attempt=math.ceil(self.next_attempt),
                          retry_at=repr(self.next_attempt), last_status="" if status is None else status,
                          last_error=error, last_attempt_at=int(at), last_latency_ms=round(ms, 2),
                          last_outcome=outcome)
            self.last_attempt = None
        fields["cursor"] = self.cursor
        if self.cursor_seq is not None:
            fields["cursor_seq"] = self.cursor_seq
        return fields

    def lags(self, last_key: tuple[int, int]) -> bool:
        return self.cursor_key < last_key or self.resend > 0

    def may_send(self, now: float) -> bool:
        return self.state == "active" and self.expires >= now and self.next_attempt <= now and not self.stop

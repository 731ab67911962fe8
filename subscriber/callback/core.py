"""The callback core: answers a hub, and hands each accepted delivery to one receiver.

Framework-neutral: adapters (aiohttp, ASGI, WSGI, Flask, Django) turn their request into a
`CallbackRequest`, read the body within `max_body_bytes`, and send back the `CallbackResponse`.

The core speaks WebSub with the hub and nothing else: a GET verifies or denies an intent (or
brings a diagnostics link), a POST is looked up, bounded and its signature checked. An accepted
POST becomes one `Delivery` value, and the `Receiver` the core was built with answers it: the
hook receiver (callback/receiver.py: de-duplication, gaps, per-subscription queues, the
application's hooks) or sync's inbox receiver (sync/push.py: the inbox write). What happened
to an intent is told to the `Lifecycle` listener (the subscription client's waiters and hooks).
"""
from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

from rsnotify.errors import (
    DocumentParseError,
    NotificationParseError,
    ValidationError,
    WireError,
)
from rsnotify.notification import ChangeNotification, future_problems
from rsnotify.safexml import parse_soon
from rsnotify.websub import (
    NOTIFICATION_ID_HEADER,
    SEQUENCE_HEADER,
    SIGNATURE_HEADER,
    HeaderLink,
    normalize_url,
    parse_link_header,
    parse_sequence,
    repeated_field_problem,
    verify_signature,
)
from rsnotify.xml import parse_notification

from ..errors import SubscriptionDeniedError
from ..settings import SubscriberSettings
from ..store import (
    ACTIVE,
    DENIED,
    EXPIRED,
    UNSUBSCRIBED,
    Subscription,
    SubscriptionStore,
)

log = logging.getLogger(__name__)

XML_TYPES = ("application/xml", "text/xml")
SUBSCRIPTION_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")
# A hub that verifies without hub.lease_seconds (it is mandatory) gets this lease assumed, so
# the subscription is renewed early rather than lost.
ASSUMED_LEASE_SECONDS = 3600
MAX_LEASE_SECONDS = 10 * 365 * 86_400  # longer granted leases are counted as this
# Subscriptions the client still wants: a hub may verify them again (a renewal it started, a
# restart that re-checks its subscribers), and is told yes.
WANTED = (ACTIVE, EXPIRED)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class CallbackRequest:
    """What the core needs of one request to a callback URL."""

    method: str
    subscription_id: str                       # the last path segment of the callback URL
    query: Mapping[str, str] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = ()  # every header, in order; names in any case
    body: bytes = field(default=b"", repr=False)
    # one line per hub.* field the query gives more than once with different values (query_fields)
    repeated: tuple[str, ...] = ()

    def header(self, name: str) -> str | None:
        """All values of header `name` joined with ', ' (as RFC 9110 allows), or None."""
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        return ", ".join(values) if values else None


@dataclass(frozen=True)
class CallbackResponse:
    """Status and text/plain body to send back to the hub."""

    status: int
    text: str = ""
    content_type: str = "text/plain; charset=utf-8"

    @property
    def body(self) -> bytes:
        return self.text.encode("utf-8")


@dataclass(frozen=True)
class Delivery:
    """One content distribution the core accepted: found, within size, signed when it must be."""

    subscription: Subscription                  # as stored when the delivery came in
    notification_id: str | None                 # X-RSNotify-Id, when the hub sends one
    sequence: int | None                        # X-RSNotify-Sequence: position in the topic log
    content_type: str
    body: bytes = field(repr=False)
    links: tuple[HeaderLink, ...] = ()          # the delivery's Link header (topic metadata)
    received_at: datetime | None = None
    # the body parsed, when it is a valid change notification (the core checks its dates)
    notification: ChangeNotification | None = field(default=None, repr=False)


class Receiver(Protocol):
    """Where accepted deliveries go; its answer is the hub's answer (a 2xx confirms the delivery)."""

    async def receive(self, delivery: Delivery) -> CallbackResponse: ...

    async def close(self) -> None: ...


class Lifecycle(Protocol):
    """Who hears what the hub did with an intent (the subscription client)."""

    def verified(self, subscription: Subscription, mode: str) -> None: ...

    def denied(self, subscription: Subscription, error: SubscriptionDeniedError) -> None: ...

    def diagnostics(self, subscription: Subscription, link: str) -> None: ...


def query_fields(pairs: Iterable[tuple[str, str]]) -> tuple[dict[str, str], tuple[str, ...]]:
    """Every adapter's query, read one way: one value per name (the first), and one problem line
    per hub.* field given more than once with different values. Which of those counts would
    depend on the framework (aiohttp reads the first, Django and parse_qsl's dict the last), so
    the verification refuses it, as the hub refuses such a form (rsnotify.websub)."""
    seen: dict[str, list[str]] = {}
    for name, value in pairs:
        seen.setdefault(name, []).append(value)
    repeated = tuple(problem for name, values in seen.items()
                     if name.startswith("hub.") and (problem := repeated_field_problem(name, values)))
    return {name: values[0] for name, values in seen.items()}, repeated


def too_large(limit: int) -> CallbackResponse:
    """The answer for a body past `limit` bytes (adapters stop reading there)."""
    return CallbackResponse(413, f"request body is larger than {limit} bytes; expected at most {limit}")


class CallbackCore:
    """Answers callback requests for the subscriptions in `store`; deliveries go to `receiver`."""

    def __init__(self, store: SubscriptionStore, receiver: Receiver, *, lifecycle: Lifecycle | None = None,
                 settings: SubscriberSettings | None = None, now: Callable[[], datetime] = utc_now,
                 rng: random.Random | None = None) -> None:
        self.store = store
        self.receiver = receiver
        self.lifecycle = lifecycle
        self.settings = settings or SubscriberSettings()
        self.now = now
        self.rng = rng or random.SystemRandom()

    @property
    def max_body_bytes(self) -> int:
        return self.settings.max_body_bytes

    async def handle(self, request: CallbackRequest) -> CallbackResponse:
        """The answer to one callback request. S-17: the method tells the cases apart."""
        if not SUBSCRIPTION_ID.fullmatch(request.subscription_id):
            return CallbackResponse(404, "no subscription at this callback URL")
        if request.method == "GET":
            return await self._verify(request)
        if request.method == "POST":
            return await self._accept(request)
        return CallbackResponse(405, f"method {request.method} not allowed; expected GET or POST")

    async def close(self) -> None:
        """Let the receiver finish what it was handed."""
        await self.receiver.close()

    # --- GET: verification of intent, denial, diagnostics link ----------------------------

    async def _verify(self, request: CallbackRequest) -> CallbackResponse:
        if request.repeated:
            return CallbackResponse(400, "\n".join(request.repeated))
        mode = request.query.get("hub.mode")
        topic = request.query.get("hub.topic") or ""
        subscription = await self.store.get(request.subscription_id)
        if subscription is None:
            return CallbackResponse(404, "no subscription at this callback URL")
        if mode == "denied":
            return await self._deny(subscription, topic, request.query.get("hub.reason"))
        if mode == "diagnostics":
            return self._note_diagnostics(subscription, topic, request.query.get("hub.diagnostics"))
        if mode not in ("subscribe", "unsubscribe"):
            got = repr(mode) if mode is not None else "no hub.mode field"
            return CallbackResponse(400, f"hub.mode must be subscribe, unsubscribe, denied or diagnostics, got {got}")
        challenge = request.query.get("hub.challenge")
        if not challenge:
            return CallbackResponse(400, "hub.challenge is required, got nothing")
        if not _wants(subscription, mode, topic):
            log.warning("refused %s verification for %s at callback %s: no such pending intent",
                        mode, topic, subscription.id)
            return CallbackResponse(404, f"no pending {mode} intent for topic {topic!r} at this callback URL")
        now = self.now()
        if mode == "subscribe":
            try:
                lease = _lease(request.query.get("hub.lease_seconds"))
            except WireError as exc:
                return CallbackResponse(400, str(exc))
            lease = lease or subscription.requested_lease_seconds or ASSUMED_LEASE_SECONDS
            verified = subscription.evolve(
                status=ACTIVE, pending_mode=None, intent_sent_at=None, lease_seconds=lease,
                verified_at=now, expires_at=now + timedelta(seconds=lease),
                renew_at=self.renew_time(now, lease), denial_reason=None,
            )
        else:  # S-14: hub.lease_seconds is ignored for unsubscribe
            verified = subscription.evolve(status=UNSUBSCRIBED, pending_mode=None, intent_sent_at=None,
                                           ended_at=now, renew_at=None)
        await self.store.put(verified)
        log.info("verified %s of %s at hub %s (callback %s, lease %s s)",
                 mode, verified.topic, verified.hub, verified.id, verified.lease_seconds)
        if self.lifecycle is not None:
            self.lifecycle.verified(verified, mode)
        # S-13: only the challenge, byte for byte, as text/plain.
        return CallbackResponse(200, challenge, "text/plain")

    def renew_time(self, verified_at: datetime, lease_seconds: int) -> datetime:
        """When to renew: a random point late in the lease, so many subscribers don't renew at once."""
        share = self.rng.uniform(self.settings.renew_after_min, self.settings.renew_after_max)
        return verified_at + timedelta(seconds=lease_seconds * share)

    async def _deny(self, subscription: Subscription, topic: str, reason: str | None) -> CallbackResponse:
        if not _same_url(topic, subscription.topic) or subscription.status == UNSUBSCRIBED:
            return CallbackResponse(404, f"no subscription to topic {topic!r} at this callback URL")
        denied = subscription.evolve(status=DENIED, pending_mode=None, renew_at=None,
                                     ended_at=self.now(), denial_reason=reason or "")
        await self.store.put(denied)
        log.warning("hub %s denied the subscription to %s (callback %s): %s",
                    denied.hub, denied.topic, denied.id, reason or "no reason given")
        if self.lifecycle is not None:
            self.lifecycle.denied(denied, SubscriptionDeniedError(
                f"hub {denied.hub} denied the subscription to {denied.topic}: {reason or 'no reason given'}",
                reason=reason))
        return CallbackResponse(200, "denial noted")  # S-15: 2xx is the safe answer

    def _note_diagnostics(self, subscription: Subscription, topic: str, link: str | None) -> CallbackResponse:
        """Pass on the hub's diagnostics link (rsnotify hubs send one after POST /diagnostics)."""
        if not _same_url(topic, subscription.topic) or subscription.is_ended:
            return CallbackResponse(404, f"no subscription to topic {topic!r} at this callback URL")
        if not link or not link.startswith(("http://", "https://")):
            got = repr(link) if link else "nothing"
            return CallbackResponse(400, f"hub.diagnostics must be an http(s) URL, got {got}")
        log.info("hub %s sent a diagnostics link for %s (callback %s)", subscription.hub, subscription.topic,
                 subscription.id)
        if self.lifecycle is not None:
            self.lifecycle.diagnostics(subscription, link)
        return CallbackResponse(200, "diagnostics link noted")

    # --- POST: content distribution --------------------------------------------------------

    async def _accept(self, request: CallbackRequest) -> CallbackResponse:
        subscription = await self.store.get(request.subscription_id)
        if subscription is None or subscription.is_ended:
            # S-18: 410 tells the hub this subscription is gone for good.
            return CallbackResponse(410, "no subscription at this callback URL")
        if len(request.body) > self.max_body_bytes:
            return too_large(self.max_body_bytes)
        if subscription.secret is not None:
            signature = request.header(SIGNATURE_HEADER)
            if not signature:
                log.warning("refused delivery to %s: no %s", subscription.id, SIGNATURE_HEADER)
                return CallbackResponse(403, f"{SIGNATURE_HEADER} is required: this subscription has a secret")
            if not verify_signature(request.body, subscription.secret, signature):
                log.warning("refused delivery to %s: bad %s", subscription.id, SIGNATURE_HEADER)
                return CallbackResponse(403, f"{SIGNATURE_HEADER} does not match the body")
        delivery = self._delivery(subscription, request)
        delivery, refusal = await self._check_dates(delivery)
        if refusal is not None:
            return refusal
        return await self.receiver.receive(delivery)

    async def _check_dates(self, delivery: Delivery) -> tuple[Delivery, CallbackResponse | None]:
        """The delivery with its body parsed, and a 400 when a datetime in it lies further ahead
        than settings.future_skew (the rule the hub applies at intake, rsnotify.notification).

        Such a date would become what this Destination remembers as the latest (the from/until
        chain, sync's checkpoint), and every real change after it would look old. Refused before
        the receiver sees it, so nothing is stored and the copy stays exact: the hub delivers it
        again later (a clock of ours that lags catches up) while the notifications after it
        wait, in order. A body that is not a valid change notification passes on as before:
        the receiver reports its problems."""
        if not is_xml(delivery.content_type):
            return delivery, None
        try:
            # a small body right here, a large one in a parser thread: most deliveries are small
            notification = await parse_soon(parse_notification, delivery.body, max_bytes=self.max_body_bytes,
                                            error=NotificationParseError)
        except (ValidationError, DocumentParseError):
            return delivery, None
        problems = future_problems(notification.changes, notification.until_time, self.now(), self.settings.future_skew)
        if not problems:
            return replace(delivery, notification=notification), None
        sid = delivery.subscription.id
        log.warning("refused delivery %s to %s: dated in the future: %s", delivery.notification_id, sid, problems[0])
        heading = (f"the notification is dated in the future (this Destination's future_skew is "
                   f"{self.settings.future_skew:g} s); nothing was stored, deliver it again later:")
        return delivery, CallbackResponse(400, "\n".join([heading, *problems]))

    def _delivery(self, subscription: Subscription, request: CallbackRequest) -> Delivery:
        sequence_text = request.header(SEQUENCE_HEADER)
        sequence = parse_sequence(sequence_text)
        if sequence_text is not None and sequence is None:
            log.warning("ignored %s %r: expected a positive integer", SEQUENCE_HEADER, sequence_text)
        try:
            links = tuple(parse_link_header(request.header("Link") or ""))
        except WireError:
            links = ()  # topic metadata only (S-19): a bad one must not lose the notification
        return Delivery(
            subscription=subscription, notification_id=request.header(NOTIFICATION_ID_HEADER), sequence=sequence,
            content_type=request.header("Content-Type") or "application/octet-stream", body=request.body,
            links=links, received_at=self.now(),
        )


def is_xml(content_type: str) -> bool:
    """Is `content_type` an XML media type (application/xml, text/xml, anything +xml)?"""
    media_type = content_type.split(";")[0].strip().lower()
    return media_type in XML_TYPES or media_type.endswith("+xml")


def _wants(subscription: Subscription, mode: str, topic: str) -> bool:
    """Whether this callback asked for `mode` of `topic`: a pending intent, or (subscribe) a
    subscription it keeps (the hub verifies again, e.g. a renewal it started): never one it ended."""
    if not _same_url(topic, subscription.topic):
        return False
    if subscription.pending_mode == mode:
        return True
    return mode == "subscribe" and subscription.pending_mode is None and subscription.status in WANTED


def _same_url(a: str, b: str) -> bool:
    try:
        return normalize_url(a) == normalize_url(b)
    except ValueError:
        return False


MAX_LEASE_DIGITS = 100


def _lease(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    text = value.strip()
    # ASCII and bounded first: int() refuses numbers past 4,300 digits with a ValueError (a 500);
    # anything up to MAX_LEASE_DIGITS is clamped below, as it always was
    if not (text.isascii() and text.isdigit() and len(text) <= MAX_LEASE_DIGITS) or int(text) <= 0:
        shown = value if len(value) <= 40 else f"{value[:40]}… ({len(value)} characters)"
        raise WireError(f"hub.lease_seconds must be a positive integer of at most {MAX_LEASE_DIGITS} digits, got {shown!r}")
    # A lease past datetime's range (e.g. 999999999999 s) would overflow the expiry: for us it
    # is as good as ten years, renewed well before then.
    return min(int(text), MAX_LEASE_SECONDS)


def header_pairs(items: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Header (name, value) pairs as the core wants them."""
    return tuple((str(k), str(v)) for k, v in items)

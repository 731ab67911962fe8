"""The callback core: answers a hub's GET (verification, denial) and POST (content distribution).

Framework-neutral: adapters (aiohttp, ASGI, WSGI) turn their request into a `CallbackRequest`,
read the body within `max_body_bytes`, and send back the `CallbackResponse`. By default
(`ack="after_response"`) the application's handler runs later, on a per-subscription queue, so a
slow application never makes a hub wait; with `ack="after_handler"` it runs before the answer and
an exception answers 503, so the hub delivers the notification again.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import random
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from rsnotify.datetimes import format_datetime
from rsnotify.errors import (
    DocumentParseError,
    NotificationParseError,
    ValidationError,
    WireError,
)
from rsnotify.notification import ChangeNotification
from rsnotify.safexml import parse_in_thread
from rsnotify.websub import (
    NOTIFICATION_ID_HEADER,
    SEQUENCE_HEADER,
    SIGNATURE_HEADER,
    HeaderLink,
    normalize_url,
    parse_link_header,
    parse_sequence,
    verify_signature,
)
from rsnotify.xml import parse_notification

from ..errors import SettingsError, SubscriptionDeniedError
from ..settings import SubscriberSettings
from ..store import ACTIVE, DENIED, UNSUBSCRIBED, Subscription, SubscriptionStore

log = logging.getLogger(__name__)

SUBSCRIPTION_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")
XML_TYPES = ("application/xml", "text/xml")
# A hub that verifies without hub.lease_seconds (it is mandatory) gets this lease assumed, so
# the subscription is renewed early rather than lost.
ASSUMED_LEASE_SECONDS = 3600
MAX_LEASE_SECONDS = 10 * 365 * 86_400  # longer granted leases are counted as this


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


def too_large(limit: int) -> CallbackResponse:
    """The answer for a body past `limit` bytes (adapters stop reading there)."""
    return CallbackResponse(413, f"request body is larger than {limit} bytes; expected at most {limit}")


@dataclass(frozen=True)
class Gap:
    """A sign that notifications were missed: a jump in the sequence or in the from/until chain."""

    kind: str         # "sequence" or "interval"
    message: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class ReceivedNotification:
    """One content distribution, as the application sees it."""

    subscription_id: str
    topic: str                                  # the topic subscribed to (not the Link header's)
    hub: str
    notification_id: str | None                 # X-RSNotify-Id, when the hub sends one
    sequence: int | None                        # X-RSNotify-Sequence: position in the topic log
    content_type: str
    body: bytes = field(repr=False)
    notification: ChangeNotification | None     # None for other content types or a bad document
    problems: tuple[str, ...] = ()              # why the body is not a valid change notification
    links: tuple[HeaderLink, ...] = ()          # the delivery's Link header (topic metadata)
    gaps: tuple[Gap, ...] = ()
    received_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object `rsnotify subscribe` prints for this notification."""
        n = self.notification
        data: dict[str, Any] = {
            "topic": self.topic,
            "hub": self.hub,
            "notification_id": self.notification_id,
            "sequence": self.sequence,
            "from": format_datetime(n.from_time) if n else None,
            "until": format_datetime(n.until_time) if n else None,
            "changes": [
                {
                    "loc": c.loc,
                    "change": c.change.value,
                    "datetime": format_datetime(c.changed_at) if c.changed_at else None,
                    "hash": c.hash,
                    "length": c.length,
                    "type": c.media_type,
                }
                for c in (n.changes if n else ())
            ],
        }
        if self.gaps:
            data["gaps"] = [gap.to_json() for gap in self.gaps]
        if n is None:
            data["content_type"] = self.content_type
            data["body_bytes"] = len(self.body)
        if self.problems:
            data["problems"] = list(self.problems)
        return data


NotificationHandler = Callable[[ReceivedNotification], Awaitable[None] | None]
DenialHandler = Callable[[Subscription], Awaitable[None] | None]
Hook = Callable[..., Awaitable[None] | None]

# When the hub gets its 2xx: right after the notification is checked and recorded (the handler
# runs afterwards), or only once the handler returned (an exception answers 503 and the hub retries).
ACK_AFTER_RESPONSE = "after_response"
ACK_AFTER_HANDLER = "after_handler"
ACK_MODES = (ACK_AFTER_RESPONSE, ACK_AFTER_HANDLER)
# The events a Subscriber's decorators register hooks for; "renewal_failed" is raised by the client.
HOOK_EVENTS = ("notification", "verified", "denied", "renewal_failed", "gap", "diagnostics")


class HandlerFailedError(Exception):
    """A hook raised while the hub waited for the answer (ack="after_handler")."""


class CallbackCore:
    """Answers callback requests for the subscriptions in `store`.

    Hooks (`on_notification`, `on_denial`, and those added with `add_hook`) may be plain
    functions (run in a worker thread) or coroutine functions (run on the loop). Notification
    and gap hooks run after the answer, or before it with `ack="after_handler"`; the others
    run after the answer.
    """

    def __init__(
        self,
        store: SubscriptionStore,
        *,
        on_notification: NotificationHandler | None = None,
        on_denial: DenialHandler | None = None,
        settings: SubscriberSettings | None = None,
        now: Callable[[], datetime] = utc_now,
        rng: random.Random | None = None,
        ack: str = ACK_AFTER_RESPONSE,
    ) -> None:
        if ack not in ACK_MODES:
            raise SettingsError(f"ack must be {' or '.join(ACK_MODES)}, got {ack!r}")
        self.store = store
        self.ack = ack
        # A receiver that keeps the raw delivery itself (sync's inbox): when set, it alone runs
        # before the answer (no parsing, no store update), and its exception answers 503.
        self.on_receive: Callable[[Subscription, CallbackRequest], Awaitable[None]] | None = None
        self.hooks: dict[str, list[Hook]] = {event: [] for event in HOOK_EVENTS}
        self.on_notification = on_notification
        self.on_denial = on_denial
        # The latest hub.diagnostics link each subscription's callback was sent (by id).
        self.diagnostics_links: dict[str, str] = {}
        self.settings = settings or SubscriberSettings()
        self.now = now
        self.rng = rng or random.SystemRandom()
        self._locks: dict[str, asyncio.Lock] = {}
        self._queues: dict[str, asyncio.Queue[ReceivedNotification | None]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._waiters: dict[tuple[str, str], list[asyncio.Future[Subscription]]] = {}
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def max_body_bytes(self) -> int:
        return self.settings.max_body_bytes

    # --- hooks -----------------------------------------------------------------------------

    def add_hook(self, event: str, hook: Hook) -> Hook:
        """Call `hook` on `event` (one of HOOK_EVENTS), after those added before; returns it."""
        if event not in self.hooks:
            raise SettingsError(f"hook event must be one of {', '.join(HOOK_EVENTS)}, got {event!r}")
        self.hooks[event].append(hook)
        return hook

    @property
    def on_notification(self) -> NotificationHandler | None:
        """The first notification hook (setting it replaces every notification hook)."""
        return self.hooks["notification"][0] if self.hooks["notification"] else None

    @on_notification.setter
    def on_notification(self, handler: NotificationHandler | None) -> None:
        self.hooks["notification"] = [handler] if handler is not None else []

    @property
    def on_denial(self) -> DenialHandler | None:
        """The first denial hook (setting it replaces every denial hook)."""
        return self.hooks["denied"][0] if self.hooks["denied"] else None

    @on_denial.setter
    def on_denial(self, handler: DenialHandler | None) -> None:
        self.hooks["denied"] = [handler] if handler is not None else []

    def fire(self, event: str, *args: Any) -> None:
        """Run the hooks of `event` in the background; their errors are logged."""
        for hook in self.hooks[event]:
            self._spawn(self._call(hook, *args, what=f"{event} hook"))

    async def handle(self, request: CallbackRequest) -> CallbackResponse:
        """The answer to one callback request. S-17: the method tells the cases apart."""
        if not SUBSCRIPTION_ID.fullmatch(request.subscription_id):
            return CallbackResponse(404, "no subscription at this callback URL")
        if request.method == "GET":
            return await self._verify(request)
        if request.method == "POST":
            return await self._receive(request)
        return CallbackResponse(405, f"method {request.method} not allowed; expected GET or POST")

    # --- waiting for verification (used by the lifecycle client) --------------------------

    def expect(self, subscription_id: str, mode: str) -> asyncio.Future[Subscription]:
        """A future settled when the hub verifies (or denies) `mode` for this subscription."""
        future: asyncio.Future[Subscription] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault((subscription_id, mode), []).append(future)
        return future

    def forget_waiter(self, subscription_id: str, mode: str, future: asyncio.Future[Subscription]) -> None:
        if future.done() and not future.cancelled():
            future.exception()  # retrieved: a denial nobody awaited is not an unhandled error
        waiters = self._waiters.get((subscription_id, mode), [])
        if future in waiters:
            waiters.remove(future)
        if not waiters:
            self._waiters.pop((subscription_id, mode), None)

    def _settle(self, subscription_id: str, mode: str, result: Subscription | BaseException) -> None:
        for future in self._waiters.pop((subscription_id, mode), []):
            def settle(f: asyncio.Future[Subscription] = future) -> None:
                if f.done():
                    return
                if isinstance(result, BaseException):
                    f.set_exception(result)
                else:
                    f.set_result(result)
            loop = future.get_loop()
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            # The lifecycle client may run on another loop than the server (WSGI bridge, ASGI).
            settle() if loop is running else loop.call_soon_threadsafe(settle)

    # --- GET: verification of intent, denial ---------------------------------------------

    async def _verify(self, request: CallbackRequest) -> CallbackResponse:
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
            return CallbackResponse(
                400, f"hub.mode must be subscribe, unsubscribe, denied or diagnostics, got {mode!r}")
        challenge = request.query.get("hub.challenge")
        if not challenge:
            return CallbackResponse(400, "hub.challenge is required, got nothing")
        if subscription.pending_mode != mode or not _same_url(topic, subscription.topic):
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
        self._settle(verified.id, mode, verified)
        self.fire("verified", verified)
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
        error = SubscriptionDeniedError(
            f"hub {denied.hub} denied the subscription to {denied.topic}: {reason or 'no reason given'}",
            reason=reason,
        )
        self._settle(denied.id, "subscribe", error)
        self.fire("denied", denied)
        return CallbackResponse(200, "denial noted")  # S-15: 2xx is the safe answer

    def _note_diagnostics(self, subscription: Subscription, topic: str, link: str | None) -> CallbackResponse:
        """Keep the hub's diagnostics link (rsnotify hubs send one after POST /diagnostics)."""
        if not _same_url(topic, subscription.topic) or subscription.is_ended:
            return CallbackResponse(404, f"no subscription to topic {topic!r} at this callback URL")
        if not link or not link.startswith(("http://", "https://")):
            return CallbackResponse(400, f"hub.diagnostics must be an http(s) URL, got {link!r}")
        self.diagnostics_links[subscription.id] = link
        log.info("hub %s sent a diagnostics link for %s (callback %s)", subscription.hub, subscription.topic,
                 subscription.id)
        self._settle(subscription.id, "diagnostics", subscription)
        self.fire("diagnostics", subscription, link)
        return CallbackResponse(200, "diagnostics link noted")

    # --- POST: content distribution --------------------------------------------------------

    async def _receive(self, request: CallbackRequest) -> CallbackResponse:
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
        if self.on_receive is not None:
            try:
                await self.on_receive(subscription, request)
            except Exception as exc:
                log.exception("could not store the delivery to %s", subscription.id)
                return CallbackResponse(503, f"the notification could not be stored ({exc}); deliver it again later")
            return CallbackResponse(200, "stored")
        if self.ack == ACK_AFTER_HANDLER:
            return await self._receive_and_handle(subscription, request)
        notification_id = request.header(NOTIFICATION_ID_HEADER)
        sequence = _sequence(request.header(SEQUENCE_HEADER))
        async with self._lock(subscription.id):
            subscription = await self.store.get(subscription.id) or subscription
            if (repeat := _repeat(subscription, notification_id, "received")) is not None:
                return repeat
            gaps = _sequence_gap(subscription.last_sequence, sequence)
            await self.store.put(subscription.evolve(
                last_sequence=sequence if sequence is not None else subscription.last_sequence,
                recent_ids=_remember(subscription.recent_ids, notification_id, self.settings.remembered_ids),
            ))
        received = self._received(subscription, request, sequence, gaps)
        log.info("received %s (sequence %s) for %s on %s", received.notification_id, sequence, subscription.id,
                 subscription.topic)
        self._enqueue(received)
        return CallbackResponse(200, "received")

    async def _receive_and_handle(self, subscription: Subscription, request: CallbackRequest) -> CallbackResponse:
        """ack="after_handler": run the hooks first; only a handled notification is recorded as
        received, so the hub's retry of a failed one is not dropped as a repeat."""
        notification_id = request.header(NOTIFICATION_ID_HEADER)
        sequence = _sequence(request.header(SEQUENCE_HEADER))
        # The lock is held through the handler: one subscription's notifications are handled
        # one after another, in the order the hub sends them.
        async with self._lock(subscription.id):
            subscription = await self.store.get(subscription.id) or subscription
            if (repeat := _repeat(subscription, notification_id, "handled")) is not None:
                return repeat
            received = self._received(subscription, request, sequence, _sequence_gap(subscription.last_sequence,
                                                                                      sequence))
            received = await self._parse(received)
            if received.notification is not None:
                gap = _interval_gap(subscription.last_until, received.notification)
                received = _evolve(received, gaps=received.gaps + ((gap,) if gap else ()))
            log.info("received %s (sequence %s) for %s on %s", notification_id, sequence, subscription.id,
                     subscription.topic)
            try:
                await self._hand_over(received, raising=True)
            except HandlerFailedError as exc:
                return CallbackResponse(503, f"the notification was not handled ({exc}); deliver it again later")
            current = await self.store.get(subscription.id) or subscription
            n = received.notification
            await self.store.put(current.evolve(
                last_sequence=sequence if sequence is not None else current.last_sequence,
                recent_ids=_remember(current.recent_ids, notification_id, self.settings.remembered_ids),
                last_until=n.until_time if n is not None else current.last_until,
            ))
        return CallbackResponse(200, "handled")

    def _received(self, subscription: Subscription, request: CallbackRequest, sequence: int | None,
                  gaps: tuple[Gap, ...]) -> ReceivedNotification:
        try:
            links = tuple(parse_link_header(request.header("Link") or ""))
        except WireError:
            links = ()  # topic metadata only (S-19): a bad one must not lose the notification
        return ReceivedNotification(
            subscription_id=subscription.id, topic=subscription.topic, hub=subscription.hub,
            notification_id=request.header(NOTIFICATION_ID_HEADER), sequence=sequence,
            content_type=(request.header("Content-Type") or "application/octet-stream"),
            body=request.body, notification=None, links=links, gaps=gaps, received_at=self.now(),
        )

    def _lock(self, subscription_id: str) -> asyncio.Lock:
        return self._locks.setdefault(subscription_id, asyncio.Lock())

    # --- handing notifications to the application, in order, after the answer -------------

    def _enqueue(self, received: ReceivedNotification) -> None:
        queue = self._queues.get(received.subscription_id)
        if queue is None:
            queue = self._queues[received.subscription_id] = asyncio.Queue()
            self._workers[received.subscription_id] = asyncio.create_task(
                self._work(received.subscription_id, queue))
        queue.put_nowait(received)

    async def _work(self, subscription_id: str, queue: asyncio.Queue[ReceivedNotification | None]) -> None:
        while (received := await queue.get()) is not None:
            try:
                received = await self._complete(received)
                await self._hand_over(received, raising=False)
            finally:
                queue.task_done()
        queue.task_done()

    async def _hand_over(self, received: ReceivedNotification, *, raising: bool) -> None:
        """Gap hooks (when there are gaps), then notification hooks, in registration order."""
        for item in received.gaps:
            log.warning("gap on %s (%s): %s", received.topic, received.subscription_id, item.message)
        hooks = (self.hooks["gap"] if received.gaps else []) + self.hooks["notification"]
        for hook in hooks:
            what = "gap hook" if hook in self.hooks["gap"] else "notification handler"
            await self._call(hook, received, what=what, raising=raising)

    async def _parse(self, received: ReceivedNotification) -> ReceivedNotification:
        """The body parsed as a change notification (in a parser thread, time-bounded), or its problems."""
        media_type = received.content_type.split(";")[0].strip().lower()
        if media_type not in XML_TYPES and not media_type.endswith("+xml"):
            return received
        try:
            notification = await parse_in_thread(parse_notification, received.body, max_bytes=self.max_body_bytes,
                                                 error=NotificationParseError)
        except ValidationError as exc:
            return _evolve(received, problems=tuple(exc.problems))
        except DocumentParseError as exc:
            return _evolve(received, problems=(str(exc),))
        return _evolve(received, notification=notification)

    async def _complete(self, received: ReceivedNotification) -> ReceivedNotification:
        """Parse the body (off the response path) and check the from/until chain."""
        received = await self._parse(received)
        notification = received.notification
        if notification is None:
            return received
        async with self._lock(received.subscription_id):
            subscription = await self.store.get(received.subscription_id)
            gap = _interval_gap(subscription.last_until if subscription else None, notification)
            if subscription is not None:
                await self.store.put(subscription.evolve(last_until=notification.until_time))
        return _evolve(received, gaps=received.gaps + ((gap,) if gap else ()))

    async def _call(self, handler: Hook, *args: Any, what: str, raising: bool = False) -> None:
        """Run one hook. Errors are logged; with `raising` (the hub still waits for the
        answer) they become HandlerFailedError, so the hub is told to retry."""
        try:
            if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__):
                await cast(Awaitable[None], handler(*args))
            else:
                result = await asyncio.to_thread(handler, *args)
                if inspect.isawaitable(result):
                    await result
        except Exception as exc:
            if not raising:
                log.exception("%s failed", what)
                return
            log.warning("%s failed; the hub is asked to deliver again", what, exc_info=True)
            raise HandlerFailedError(f"{what} raised {type(exc).__name__}") from exc

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait until every notification received so far has been handed to the application."""
        waits = [queue.join() for queue in self._queues.values()] + list(self._background)
        if waits:
            await asyncio.wait_for(asyncio.gather(*waits), timeout)

    async def close(self, timeout: float = 10.0) -> None:
        """Hand over what was received, then stop the per-subscription workers."""
        try:
            await self.drain(timeout)
        except TimeoutError:
            log.warning("some notifications were still being handled at shutdown")
        for queue in self._queues.values():
            queue.put_nowait(None)
        workers = list(self._workers.values())
        for worker in workers:
            if not worker.done():
                try:
                    await asyncio.wait_for(worker, 1.0)
                except TimeoutError:
                    worker.cancel()
        self._queues.clear()
        self._workers.clear()


def _same_url(a: str, b: str) -> bool:
    try:
        return normalize_url(a) == normalize_url(b)
    except ValueError:
        return False


def _lease(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not value.strip().isdigit() or int(value) <= 0:
        raise WireError(f"hub.lease_seconds must be a positive integer, got {value!r}")
    # A lease past datetime's range (e.g. 999999999999 s) would overflow the expiry: for us it
    # is as good as ten years, renewed well before then.
    return min(int(value), MAX_LEASE_SECONDS)


def _repeat(subscription: Subscription, notification_id: str | None, done: str) -> CallbackResponse | None:
    """The answer to a notification id the subscription already `done` (received or handled): 200,
    so the hub stops retrying, and it is dropped; None for a new one."""
    if notification_id and notification_id in subscription.recent_ids:
        log.info("dropped repeat %s for %s", notification_id, subscription.id)
        return CallbackResponse(200, f"notification {notification_id} already {done}")
    return None


def _sequence(value: str | None) -> int | None:
    sequence = parse_sequence(value)
    if value is not None and sequence is None:
        log.warning("ignored %s %r: expected a positive integer", SEQUENCE_HEADER, value)
    return sequence


def _remember(ids: tuple[str, ...], new: str | None, keep: int) -> tuple[str, ...]:
    if not new:
        return ids
    return (ids + (new,))[-keep:]


def _sequence_gap(last: int | None, sequence: int | None) -> tuple[Gap, ...]:
    if last is None or sequence is None or sequence == last + 1:
        return ()
    if sequence > last + 1:
        missing = f"{last + 1}" if sequence == last + 2 else f"{last + 1}..{sequence - 1}"
        return (Gap("sequence", f"sequence jumped from {last} to {sequence}: notification(s) {missing} missing"),)
    return (Gap("sequence", f"sequence {sequence} arrived after {last}: out of order or the hub's log was reset"),)


def _interval_gap(last_until: datetime | None, notification: ChangeNotification) -> Gap | None:
    if last_until is None or notification.from_time == last_until:
        return None
    start, end = format_datetime(last_until), format_datetime(notification.from_time)
    if notification.from_time > last_until:
        return Gap("interval", f"from={end} is after the previous until={start}: changes in between may be missing")
    return Gap("interval", f"from={end} is before the previous until={start}: the intervals overlap")


def _evolve(received: ReceivedNotification, **changes: Any) -> ReceivedNotification:
    return replace(received, **changes)


def header_pairs(items: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Header (name, value) pairs as the core wants them."""
    return tuple((str(k), str(v)) for k, v in items)

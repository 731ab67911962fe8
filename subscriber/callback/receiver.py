"""The hook receiver: what a Destination's own web app does with a delivery the core accepted.

It drops repeats (the notification ids a subscription saw last), sees gaps (a jump in the
sequence, a break in the from/until chain), and hands each notification to the application's
hooks, one subscription's notifications in order. By default (`ack="after_response"`) the hub
is answered once the delivery is recorded and the hooks run later on a per-subscription queue,
so a slow application never makes a hub wait; with `ack="after_handler"` they run before the
answer and an exception answers 503, so the hub delivers the notification again.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from rsnotify.datetimes import format_datetime
from rsnotify.errors import DocumentParseError, NotificationParseError, ValidationError
from rsnotify.notification import ChangeNotification
from rsnotify.safexml import parse_in_thread
from rsnotify.websub import HeaderLink, missing_sequences
from rsnotify.xml import parse_notification

from ..errors import SettingsError
from ..hooks import HandlerFailedError, Hook, Hooks, call_hook
from ..settings import SubscriberSettings
from ..store import Subscription, SubscriptionStore
from .core import CallbackResponse, Delivery, is_xml

log = logging.getLogger(__name__)

# When the hub gets its 2xx: right after the notification is checked and recorded (the handler
# runs afterwards), or only once the handler returned (an exception answers 503 and the hub retries).
ACK_AFTER_RESPONSE = "after_response"
ACK_AFTER_HANDLER = "after_handler"
ACK_MODES = (ACK_AFTER_RESPONSE, ACK_AFTER_HANDLER)
DELIVERY_EVENTS = ("notification", "gap")


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


class HookReceiver:
    """Records each delivery on its subscription and hands it to the notification and gap hooks."""

    def __init__(self, store: SubscriptionStore, *, settings: SubscriberSettings | None = None,
                 ack: str = ACK_AFTER_RESPONSE, on_notification: NotificationHandler | None = None) -> None:
        if ack not in ACK_MODES:
            raise SettingsError(f"ack must be {' or '.join(ACK_MODES)}, got {ack!r}")
        self.store = store
        self.ack = ack
        self.settings = settings or SubscriberSettings()
        self.hooks = Hooks(DELIVERY_EVENTS, SettingsError)
        if on_notification is not None:
            self.hooks.add("notification", on_notification)
        self._locks: dict[str, asyncio.Lock] = {}
        self._queues: dict[str, asyncio.Queue[ReceivedNotification | None]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}

    def add_hook(self, event: str, hook: Hook) -> Hook:
        """Call `hook` on "notification" or "gap", after those added before; returns it."""
        return self.hooks.add(event, hook)

    async def receive(self, delivery: Delivery) -> CallbackResponse:
        if self.ack == ACK_AFTER_HANDLER:
            return await self._receive_and_handle(delivery)
        async with self._lock(delivery.subscription.id):
            subscription = await self._current(delivery)
            if (repeat := _repeat(subscription, delivery.notification_id, "received")) is not None:
                return repeat
            await self._record(subscription, delivery, None)
        received = _received(delivery, sequence_gaps(subscription.last_sequence, delivery.sequence))
        log.info("received %s (sequence %s) for %s on %s", delivery.notification_id, delivery.sequence,
                 subscription.id, subscription.topic)
        self._enqueue(received)
        return CallbackResponse(200, "received")

    async def _receive_and_handle(self, delivery: Delivery) -> CallbackResponse:
        """ack="after_handler": run the hooks first; only a handled notification is recorded as
        received, so the hub's retry of a failed one is not dropped as a repeat."""
        # The lock is held through the handler: one subscription's notifications are handled
        # one after another, in the order the hub sends them.
        async with self._lock(delivery.subscription.id):
            subscription = await self._current(delivery)
            if (repeat := _repeat(subscription, delivery.notification_id, "handled")) is not None:
                return repeat
            received = await _parse(_received(delivery, sequence_gaps(subscription.last_sequence, delivery.sequence)),
                                    self.settings.max_body_bytes)
            received = _with_interval_gap(received, subscription.last_until)
            log.info("received %s (sequence %s) for %s on %s", delivery.notification_id, delivery.sequence,
                     subscription.id, subscription.topic)
            try:
                await self._hand_over(received, raising=True)
            except HandlerFailedError as exc:
                return CallbackResponse(503, f"the notification was not handled ({exc}); deliver it again later")
            await self._record(await self._current(delivery), delivery, received.notification)
        return CallbackResponse(200, "handled")

    async def _current(self, delivery: Delivery) -> Subscription:
        return await self.store.get(delivery.subscription.id) or delivery.subscription

    async def _record(self, subscription: Subscription, delivery: Delivery,
                      notification: ChangeNotification | None) -> None:
        """The subscription with this delivery seen: its sequence, its id among the recent ones."""
        await self.store.put(subscription.evolve(
            last_sequence=delivery.sequence if delivery.sequence is not None else subscription.last_sequence,
            recent_ids=_remember(subscription.recent_ids, delivery.notification_id, self.settings.remembered_ids),
            last_until=notification.until_time if notification is not None else subscription.last_until,
        ))

    def _lock(self, subscription_id: str) -> asyncio.Lock:
        return self._locks.setdefault(subscription_id, asyncio.Lock())

    # --- handing notifications to the application, in order, after the answer -------------

    def _enqueue(self, received: ReceivedNotification) -> None:
        queue = self._queues.get(received.subscription_id)
        if queue is None:
            queue = self._queues[received.subscription_id] = asyncio.Queue()
            self._workers[received.subscription_id] = asyncio.create_task(self._work(queue))
        queue.put_nowait(received)

    async def _work(self, queue: asyncio.Queue[ReceivedNotification | None]) -> None:
        while (received := await queue.get()) is not None:
            try:
                received = await self._complete(received)
                await self._hand_over(received, raising=False)
            finally:
                queue.task_done()
        queue.task_done()

    async def _complete(self, received: ReceivedNotification) -> ReceivedNotification:
        """Parse the body (off the response path) and check the from/until chain."""
        received = await _parse(received, self.settings.max_body_bytes)
        notification = received.notification
        if notification is None:
            return received
        async with self._lock(received.subscription_id):
            subscription = await self.store.get(received.subscription_id)
            if subscription is None:
                return received
            await self.store.put(subscription.evolve(last_until=notification.until_time))
        return _with_interval_gap(received, subscription.last_until)

    async def _hand_over(self, received: ReceivedNotification, *, raising: bool) -> None:
        """Gap hooks (when there are gaps), then notification hooks, in registration order."""
        for item in received.gaps:
            log.warning("gap on %s (%s): %s", received.topic, received.subscription_id, item.message)
        gap_hooks = self.hooks.by_event["gap"] if received.gaps else []
        for hook in gap_hooks:
            await call_hook(hook, received, what="gap hook", raising=raising)
        for hook in self.hooks.by_event["notification"]:
            await call_hook(hook, received, what="notification handler", raising=raising)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait until every notification received so far has been handed to the application."""
        waits = [queue.join() for queue in self._queues.values()]
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
        for worker in list(self._workers.values()):
            if not worker.done():
                try:
                    await asyncio.wait_for(worker, 1.0)
                except TimeoutError:
                    worker.cancel()
        self._queues.clear()
        self._workers.clear()


def _received(delivery: Delivery, gaps: tuple[Gap, ...]) -> ReceivedNotification:
    subscription = delivery.subscription
    return ReceivedNotification(
        subscription_id=subscription.id, topic=subscription.topic, hub=subscription.hub,
        notification_id=delivery.notification_id, sequence=delivery.sequence, content_type=delivery.content_type,
        body=delivery.body, notification=delivery.notification, links=delivery.links, gaps=gaps,
        received_at=delivery.received_at,
    )


async def _parse(received: ReceivedNotification, max_bytes: int) -> ReceivedNotification:
    """The body parsed as a change notification (in a parser thread, time-bounded), or its problems."""
    if received.notification is not None or not is_xml(received.content_type):
        return received         # parsed already by the core (which checked its dates)
    try:
        notification = await parse_in_thread(parse_notification, received.body, max_bytes=max_bytes,
                                             error=NotificationParseError)
    except ValidationError as exc:
        return replace(received, problems=tuple(exc.problems))
    except DocumentParseError as exc:
        return replace(received, problems=(str(exc),))
    return replace(received, notification=notification)


def _repeat(subscription: Subscription, notification_id: str | None, done: str) -> CallbackResponse | None:
    """The answer to a notification id the subscription already `done` (received or handled): 200,
    so the hub stops retrying, and it is dropped; None for a new one."""
    if notification_id and notification_id in subscription.recent_ids:
        log.info("dropped repeat %s for %s", notification_id, subscription.id)
        return CallbackResponse(200, f"notification {notification_id} already {done}")
    return None


def _remember(ids: tuple[str, ...], new: str | None, keep: int) -> tuple[str, ...]:
    if not new:
        return ids
    return (ids + (new,))[-keep:]


def sequence_gaps(last: int | None, sequence: int | None) -> tuple[Gap, ...]:
    if last is None or sequence is None or sequence == last + 1:
        return ()
    if sequence > last + 1:
        return (Gap("sequence", f"sequence jumped from {last} to {sequence}: "
                                f"notification(s) {missing_sequences(last, sequence)} missing"),)
    return (Gap("sequence", f"sequence {sequence} arrived after {last}: out of order or the hub's log was reset"),)


def _with_interval_gap(received: ReceivedNotification, last_until: datetime | None) -> ReceivedNotification:
    """`received` with a gap added when its `from` does not meet the previous notification's `until`."""
    notification = received.notification
    if notification is None or last_until is None or notification.from_time == last_until:
        return received
    start, end = format_datetime(last_until), format_datetime(notification.from_time)
    if notification.from_time > last_until:
        gap = Gap("interval", f"from={end} is after the previous until={start}: changes in between may be missing")
    else:
        gap = Gap("interval", f"from={end} is before the previous until={start}: the intervals overlap")
    return replace(received, gaps=received.gaps + (gap,))

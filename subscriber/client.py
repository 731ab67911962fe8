"""The subscription lifecycle: subscribe, wait for verification, renew before the lease ends,
unsubscribe. `Subscriber` owns the callback core, the store and one HTTP client session.

`ensure` and `follow` are idempotent: across restarts they reuse the stored subscription (same
callback URL, so the hub keeps its place in the topic log) instead of adding another one.
`ensure_when_listening` / `follow_when_listening` wait until the callback URL answers, for
startup code that runs before the server listens.

The pending intent is stored before the hub is asked (a hub may verify before it answers),
each subscription gets its own unguessable callback URL, and secrets are random by default.
"""
from __future__ import annotations

import asyncio
import logging
import random
import secrets as secrets_lib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urljoin

import aiohttp

from rsnotify import __version__
from rsnotify.errors import WireError
from rsnotify.neterrors import describe_client_error
from rsnotify.websub import (
    SubscriptionRequest,
    check_lease_seconds,
    check_secret,
    check_url,
    normalize_url,
)

from .callback.core import CallbackCore, Receiver, utc_now
from .callback.receiver import ACK_AFTER_RESPONSE, HookReceiver, NotificationHandler
from .diagnostics import read_diagnostics
from .discovery import discover, discover_capability_list, discover_topic
from .errors import (
    DiscoveryError,
    SettingsError,
    SubscriberError,
    SubscriptionDeniedError,
    SubscriptionError,
)
from .hooks import Hook
from .lifecycle import DenialHandler, Lifecycle
from .settings import SubscriberSettings
from .store import (
    ACTIVE,
    DENIED,
    EXPIRED,
    FAILED,
    PENDING,
    UNSUBSCRIBED,
    SqliteStore,
    Subscription,
    SubscriptionStore,
    open_store,
)

log = logging.getLogger(__name__)

MAX_HUB_REDIRECTS = 5
USER_AGENT = f"rsnotify-subscriber/{__version__}"
# A path segment the callback core answers 404 at once (too short to be a subscription id):
# any answer there means the server listens.
LISTEN_PROBE = "listening"
# s that *_when_listening waits for the callback URL to answer before subscribing anyway (a
# public URL may be unreachable from inside, e.g. behind a proxy without hairpin routing).
LISTEN_TIMEOUT = 60.0
H = TypeVar("H", bound=Hook)


def new_subscription_id() -> str:
    """256 random bits, URL-safe: the capability part of a callback URL (WebSub §8.2)."""
    return secrets_lib.token_urlsafe(32)


def new_secret() -> str:
    """A fresh random hub.secret: 256 bits, 43 characters (the limit is 200 bytes)."""
    return secrets_lib.token_urlsafe(32)


class Subscriber:
    """Subscribes callbacks under `callback_base_url` to topics, and keeps them alive.

    Use as `async with Subscriber(...) as subscriber:` or call `start()` / `close()`.
    Serve `subscriber.core` at `callback_base_url` with one of the adapters.

    The core hands each accepted delivery to `receiver`: by default a HookReceiver running
    the `on_notification` / `on_gap` hooks; sync gives its inbox receiver instead.

    `ack="after_response"` (the default) answers the hub as soon as a notification is checked
    and recorded, then runs the handler; `ack="after_handler"` runs the handler first and
    answers 503 when it raises, so the hub delivers the notification again (keep handlers
    within the hub's delivery timeout, 15 s by default on rsnotify's hub).
    """

    def __init__(
        self,
        callback_base_url: str | None = None,
        store: SubscriptionStore | None = None,
        *,
        on_notification: NotificationHandler | None = None,
        on_denial: DenialHandler | None = None,
        settings: SubscriberSettings | None = None,
        now: Callable[[], datetime] = utc_now,
        rng: random.Random | None = None,
        session: aiohttp.ClientSession | None = None,
        ack: str = ACK_AFTER_RESPONSE,
        receiver: Receiver | None = None,
    ) -> None:
        self.settings = settings or SubscriberSettings()
        self.callback_base_url = callback_base_url or self.settings.callback_url
        self.store: SubscriptionStore = store if store is not None else open_store(self.settings.state_file)
        self._owns_store = store is None        # opened here, so closed by close(), like the session
        self.now = now
        if receiver is not None and (on_notification is not None or ack != ACK_AFTER_RESPONSE):
            raise SettingsError("give on_notification and ack to the default receiver, or a receiver of your own")
        self.receiver = receiver or HookReceiver(self.store, settings=self.settings, ack=ack,
                                                 on_notification=on_notification)
        self.lifecycle = Lifecycle()
        if on_denial is not None:
            self.lifecycle.hooks.add("denied", on_denial)
        self.core = CallbackCore(self.store, self.receiver, lifecycle=self.lifecycle, settings=self.settings,
                                 now=now, rng=rng)
        self._session = session
        self._owns_session = session is None
        self._renewal_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._at_listening: list[tuple[Callable[[], Awaitable[Any]], str]] = []
        # What *_when_listening started: await them to know the outcome (each returns or raises).
        self.startup_tasks: list[asyncio.Task[Any]] = []
        # Extra form fields for an intent, e.g. rsnotify.replay_from (hubs ignore unknown ones).
        self.intent_extras: Callable[[Subscription, str], dict[str, str]] | None = None
        # A verification can bring the next renewal closer than the renewal loop's sleep (a
        # short lease): it wakes the loop, so a lease under renew_check_seconds is renewed in time.
        self._renewal_wake = asyncio.Event()
        self.lifecycle.hooks.add("verified", self._wake_renewals)

    # --- hooks (decorators) ----------------------------------------------------------------

    def on_notification(self, hook: H) -> H:
        """Decorator: `hook(received)` for each notification, in order per subscription."""
        return self._hook_receiver().add_hook("notification", hook)  # type: ignore[return-value]

    def on_verified(self, hook: H) -> H:
        """Decorator: `hook(subscription)` when the hub verified a subscribe (or renewal) or unsubscribe."""
        return self.lifecycle.hooks.add("verified", hook)  # type: ignore[return-value]

    def on_denied(self, hook: H) -> H:
        """Decorator: `hook(subscription)` when the hub denied a subscription (hub.mode=denied)."""
        return self.lifecycle.hooks.add("denied", hook)  # type: ignore[return-value]

    def on_renewal_failed(self, hook: H) -> H:
        """Decorator: `hook(subscription, error)` when a renewal was refused or not verified."""
        return self.lifecycle.hooks.add("renewal_failed", hook)  # type: ignore[return-value]

    def on_gap(self, hook: H) -> H:
        """Decorator: `hook(received)` before the notification hooks when `received.gaps` is not empty."""
        return self._hook_receiver().add_hook("gap", hook)  # type: ignore[return-value]

    def _hook_receiver(self) -> HookReceiver:
        if not isinstance(self.receiver, HookReceiver):
            raise SettingsError("notification and gap hooks need the default receiver (HookReceiver)")
        return self.receiver

    # --- start and stop --------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def start(self, *, renew: bool = True) -> None:
        """Open the HTTP session, forget long-ended subscriptions, start the renewal loop and
        what *_when_listening asked for."""
        self.session  # noqa: B018 - opens it on this loop
        self._loop = asyncio.get_running_loop()
        await self.forget_ended()
        if renew and self._renewal_task is None:
            self._renewal_task = asyncio.create_task(self._renewal_loop())
        self._launch_at_listening()

    async def close(self) -> None:
        """Stop renewing, hand over received notifications, close the HTTP session and the store
        it opened itself. start() may be called again afterwards."""
        try:
            for task in self.startup_tasks:
                task.cancel()
            if self.startup_tasks:
                await asyncio.wait(self.startup_tasks)
            self.startup_tasks.clear()
            self._loop = None
            if self._renewal_task is not None:
                renewal, self._renewal_task = self._renewal_task, None
                renewal.cancel()
                # asyncio.wait, not `await renewal` in try/except CancelledError: that except would
                # also swallow a cancellation of close() itself (a timeout around it, a shutdown
                # cancelling every task), and close() would go on through its drains regardless.
                await asyncio.wait({renewal})
            await self.core.close()
            try:
                await self.lifecycle.hooks.drain(10.0)
            except TimeoutError:
                log.warning("some lifecycle hooks were still running at shutdown")
        finally:
            # also when close() itself is cut short (SubscriberThread.stop past its timeout while a
            # handler holds core.close() up): the session's connections and the store's file would
            # otherwise stay open until the process ends ("Unclosed client session")
            if self._owns_session and self._session is not None:
                session, self._session = self._session, None
                await session.close()
            if self._owns_store and isinstance(self.store, SqliteStore):
                self.store.close()      # its file stays; start() again opens it again

    async def drain(self, timeout: float | None = None) -> None:
        """Wait until what was received so far has been handed over and the hooks fired so far ran."""
        if isinstance(self.receiver, HookReceiver):
            await self.receiver.drain(timeout)
        await self.lifecycle.hooks.drain(timeout)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout),
                headers={"User-Agent": USER_AGENT},
            )
        return self._session

    # --- subscribe / unsubscribe -----------------------------------------------------------

    async def subscribe(
        self,
        topic: str,
        hub: str,
        lease_seconds: int | None = None,
        secret: bool | str | None = True,
        *,
        wait: bool = True,
        discovered_from: str | None = None,
        discovery: str | None = None,
    ) -> Subscription:
        """Subscribe a new callback URL to `topic` at `hub`; with `wait`, until the hub verifies.

        `secret=True` makes a random secret, a string is used as given, False/None asks for
        unsigned deliveries. With `discovered_from` (a topic URL with discovery="topic", or a
        Capability List URL with discovery="capability-list"), each renewal discovers again
        and follows the channel when its topic or hub changed (WebSub §6.1). Raises SubscriptionError when the hub refuses or does not
        verify within the verification timeout, SubscriptionDeniedError when it denies.
        """
        base = self._callback_base()
        try:
            topic, hub = check_url("topic", topic), check_url("hub", hub)
            lease_seconds = check_lease_seconds(lease_seconds if lease_seconds is not None
                                                else self.settings.lease_seconds)
            chosen_secret = new_secret() if secret is True else check_secret(secret or None)
        except WireError as exc:
            raise SubscriptionError(str(exc)) from None
        subscription_id = new_subscription_id()
        now = self.now()
        subscription = Subscription(
            id=subscription_id, topic=topic, hub=hub, callback=f"{base}/{subscription_id}",
            secret=chosen_secret, requested_lease_seconds=lease_seconds, status=PENDING,
            pending_mode="subscribe", created_at=now, intent_sent_at=now, discovered_from=discovered_from,
            discovery=discovery if discovered_from else None, advertised_hub=hub,
        )
        waiter = self.lifecycle.expect(subscription.id, "subscribe")
        try:
            await self.store.put(subscription)  # S-12: before the POST
            subscription = await self._send_intent(subscription, "subscribe")
            log.info("asked hub %s to subscribe %s to %s", subscription.hub, subscription.callback, topic)
            if not wait:
                return subscription
            return await self._await_verification(subscription, "subscribe", waiter)
        except SubscriptionDeniedError:
            raise
        except SubscriptionError:
            current = await self.store.get(subscription.id) or subscription
            if current.status == PENDING:
                await self.store.put(current.evolve(status=FAILED, pending_mode=None, ended_at=self.now()))
            raise
        finally:
            self.lifecycle.forget_waiter(subscription.id, "subscribe", waiter)

    async def unsubscribe(self, subscription: Subscription | str, *, wait: bool = True) -> Subscription:
        """Ask the hub to end the subscription; with `wait`, until it verifies the unsubscription."""
        subscription_id = subscription if isinstance(subscription, str) else subscription.id
        current = await self.store.get(subscription_id)
        if current is None:
            raise SubscriptionError(f"no subscription with id {subscription_id!r} in the store")
        if current.status in (UNSUBSCRIBED, DENIED, FAILED):
            return current
        current = current.evolve(pending_mode="unsubscribe", intent_sent_at=self.now())
        waiter = self.lifecycle.expect(current.id, "unsubscribe")
        try:
            await self.store.put(current)
            current = await self._send_intent(current, "unsubscribe")
            log.info("asked hub %s to unsubscribe %s from %s", current.hub, current.callback, current.topic)
            if not wait:
                return current
            return await self._await_verification(current, "unsubscribe", waiter)
        except SubscriptionError:
            latest = await self.store.get(current.id) or current
            if latest.pending_mode == "unsubscribe":
                await self.store.put(latest.evolve(pending_mode=None, intent_sent_at=None))
            raise
        finally:
            self.lifecycle.forget_waiter(current.id, "unsubscribe", waiter)

    async def ensure(self, topic: str, hub: str, lease_seconds: int | None = None,
                     secret: bool | str | None = True, *, wait: bool = False, **options: Any) -> Subscription:
        """Be subscribed to `topic` at `hub`, reusing this callback base's stored subscription.

        A stored one (active, expired or still pending) is renewed with the same callback URL and
        secret, so a restart neither adds a subscription at the hub nor loses its place in the
        topic log; others for the same topic and hub under this base (left by earlier versions)
        are unsubscribed. Otherwise a new subscription is made. With `wait`, returns once the hub
        verified (never from code that must serve the verification GET: WSGI requests, startup
        hooks that run before the server listens).
        """
        base = self._callback_base() + "/"
        matching = [s for s in await self.store.all()
                    if s.status in (ACTIVE, EXPIRED, PENDING) and s.callback.startswith(base)
                    and _same(s.topic, topic) and (_same(s.hub, hub) or _same(s.advertised_hub or "", hub))]
        if not matching:
            return await self.subscribe(topic, hub, lease_seconds, secret, wait=wait, **options)
        matching.sort(key=lambda s: (s.status == ACTIVE, s.verified_at or s.created_at or self.now()), reverse=True)
        kept, extra = matching[0], matching[1:]
        for duplicate in extra:
            log.info("unsubscribing duplicate subscription %s to %s", duplicate.id, duplicate.topic)
            try:
                await self.unsubscribe(duplicate, wait=False)
            except SubscriptionError as exc:
                log.warning("could not unsubscribe duplicate %s: %s", duplicate.id, exc)
        log.info("reusing subscription %s to %s at %s", kept.id, kept.topic, kept.hub)
        return await self.renew(kept, wait=True) if wait else await self.renew(kept)

    async def follow(self, url: str, *, wait: bool = False, **options: Any) -> list[Subscription]:
        """Discover the channel(s) at `url` (a Source base URL, Capability List or WebSub topic)
        and `ensure` a subscription to each, at its first hub that accepts.

        Raises DiscoveryError when nothing is found, SubscriptionError when no channel could
        be subscribed to (a channel that fails is logged while others succeed).
        """
        channels = await discover(url, self.session)
        subscribed, problems = [], []
        for channel in channels:
            for hub in channel.hubs:  # one hub is enough; try the next when one refuses
                try:
                    subscribed.append(await self.ensure(
                        channel.topic, hub, wait=wait, discovered_from=channel.discovered_from,
                        discovery=channel.discovery, **options))
                    break
                except SubscriptionError as exc:
                    problems.append(str(exc))
                    log.warning("could not subscribe to %s at %s: %s", channel.topic, hub, exc)
        if not subscribed:
            raise SubscriptionError(f"no channel found from {url} could be subscribed to: " + "; ".join(problems))
        return subscribed

    def ensure_when_listening(self, topic: str, hub: str, lease_seconds: int | None = None,
                              secret: bool | str | None = True, **options: Any) -> None:
        """`ensure(...)` once the callback URL answers: call it from startup code (module level,
        a lifespan, a WSGI app factory) before the server listens. Runs once the subscriber is
        started (at once when it already is); the task lands in `startup_tasks`. Thread-safe."""
        self._when_listening(lambda: self.ensure(topic, hub, lease_seconds, secret, **options),
                             f"subscribe to {topic} at {hub}")

    def follow_when_listening(self, url: str, **options: Any) -> None:
        """`follow(url)` once the callback URL answers; as ensure_when_listening."""
        self._when_listening(lambda: self.follow(url, **options), f"follow {url}")

    def _when_listening(self, factory: Callable[[], Awaitable[Any]], what: str) -> None:
        self._at_listening.append((factory, what))
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._launch_at_listening)

    def _launch_at_listening(self) -> None:
        waiting, self._at_listening = self._at_listening, []
        for factory, what in waiting:
            task = asyncio.create_task(self._after_listening(factory, what))
            # Already logged in _after_listening; retrieved so asyncio does not report it again.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self.startup_tasks.append(task)

    async def _after_listening(self, factory: Callable[[], Awaitable[Any]], what: str) -> Any:
        try:
            try:
                await self.wait_listening()
            except SubscriberError as exc:
                log.warning("%s; trying to %s anyway (the hub may reach what this process cannot)", exc, what)
            return await factory()
        except SubscriberError as exc:
            log.error("could not %s: %s", what, exc)
            raise

    async def wait_listening(self, timeout: float = LISTEN_TIMEOUT) -> None:
        """Return once an HTTP request to the callback base URL gets an answer (any status)."""
        probe = f"{self._callback_base()}/{LISTEN_PROBE}"
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + timeout, 0.05
        while True:
            try:
                async with self.session.get(probe, allow_redirects=False,
                                            timeout=aiohttp.ClientTimeout(total=5)) as response:
                    log.debug("callback URL answers (%s at %s)", response.status, probe)
                    return
            except (TimeoutError, aiohttp.ClientError) as exc:
                if loop.time() + delay > deadline:
                    raise SubscriberError(f"the callback URL {probe} did not answer within {timeout:g} s: "
                                          f"{exc or type(exc).__name__}") from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def diagnostics(self, subscription: Subscription | str, *, timeout: float | None = None) -> dict[str, Any]:
        """The hub's report on `subscription` (status, lease, cursor, recent attempts, dead letters).

        Signed with the subscription's secret; without a secret the hub sends a link to the
        callback, which must be served meanwhile. Raises DiagnosticsError.
        """
        subscription_id = subscription if isinstance(subscription, str) else subscription.id
        current = await self.store.get(subscription_id)
        if current is None:
            raise SubscriptionError(f"no subscription with id {subscription_id!r} in the store")
        return await read_diagnostics(self.session, self.lifecycle, current,
                                      link_timeout=timeout or self.settings.verification_timeout)

    async def subscriptions(self) -> list[Subscription]:
        return await self.store.all()

    async def forget_ended(self) -> int:
        """Delete subscriptions that ended (unsubscribed, denied, failed) long enough ago."""
        cutoff = self.now() - timedelta(seconds=self.settings.forget_after_seconds)
        gone = [s for s in await self.store.all() if s.is_ended and s.ended_at and s.ended_at < cutoff]
        for subscription in gone:
            await self.store.delete(subscription.id)
        return len(gone)

    # --- renewal ---------------------------------------------------------------------------

    async def renew_due(self) -> list[Subscription]:
        """One renewal pass: re-subscribe every subscription whose renewal time has come.

        The same callback and secret are kept, so the hub keeps its place in the topic log
        and deliveries go on in order across renewals (WebSub §5.3.1 / S-16).
        """
        now = self.now()
        renewed = []
        for subscription in await self.store.all():
            if subscription.status not in (ACTIVE, EXPIRED):
                continue
            if subscription.pending_mode is not None and not self._intent_lost(subscription, now):
                continue  # the hub has not verified yet; give it time
            if subscription.status == ACTIVE and subscription.expires_at and now >= subscription.expires_at:
                log.warning("lease of %s on %s ran out before a renewal was verified",
                            subscription.id, subscription.topic)
                subscription = subscription.evolve(status=EXPIRED)
                await self.store.put(subscription)
            if subscription.renew_at is None or now >= subscription.renew_at:
                moved = await self._follow_move(subscription)
                renewed.append(moved or await self.renew(subscription))
        return renewed

    async def _follow_move(self, subscription: Subscription) -> Subscription | None:
        """Discover again (WebSub §6.1); when the channel moved, subscribe there and leave here.

        Returns the new subscription, or None when nothing moved or discovery failed (then the
        old subscription is simply renewed).
        """
        if not subscription.discovered_from or not subscription.discovery:
            return None
        try:
            if subscription.discovery == "topic":
                channels = [await discover_topic(self.session, subscription.discovered_from)]
            else:
                channels = await discover_capability_list(self.session, subscription.discovered_from)
        except DiscoveryError as exc:
            log.warning("renewing %s without rediscovery: %s", subscription.topic, exc)
            return None
        same = [c for c in channels if normalize_url(c.topic) == normalize_url(subscription.topic)]
        channel = same[0] if same else channels[0] if len(channels) == 1 else None
        if channel is None or (same and subscription.advertised_hub in channel.hubs):
            return None
        log.info("channel %s at %s moved to %s at %s", subscription.topic, subscription.advertised_hub,
                 channel.topic, channel.hubs[0])
        try:
            moved = await self.subscribe(
                channel.topic, channel.hubs[0], subscription.requested_lease_seconds,
                secret=subscription.has_secret, wait=False, discovered_from=subscription.discovered_from,
                discovery=subscription.discovery)
        except SubscriptionError as exc:
            log.warning("could not follow %s to %s: %s", subscription.topic, channel.topic, exc)
            return None
        try:
            await self.unsubscribe(subscription, wait=False)
        except SubscriptionError as exc:
            log.warning("could not leave the old subscription %s: %s", subscription.id, exc)
        return moved

    async def renew(self, subscription: Subscription, *, wait: bool = False) -> Subscription:
        """Send a renewal now; the hub's verification then sets the new lease.

        Without `wait`, a refused or unanswered renewal is retried later (renew_retry_seconds)
        and the subscription is returned as it stands. With `wait`, the verified subscription
        is returned, and SubscriptionError raised when that fails.
        """
        now = self.now()
        pending = subscription.evolve(pending_mode="subscribe", intent_sent_at=now)
        waiter = self.lifecycle.expect(subscription.id, "subscribe")
        try:
            await self.store.put(pending)
            sent = await self._send_intent(pending, "subscribe")
            log.info("asked hub %s to renew %s on %s", sent.hub, sent.id, sent.topic)
            return await self._await_verification(sent, "subscribe", waiter) if wait else sent
        except SubscriptionDeniedError:
            raise
        except SubscriptionError as exc:
            retry_at = now + timedelta(seconds=self.settings.renew_retry_seconds)
            log.warning("renewal of %s on %s failed, retrying at %s: %s", subscription.id,
                        subscription.topic, retry_at.isoformat(), exc)
            latest = await self.store.get(subscription.id) or pending
            failed = latest.evolve(pending_mode=None, intent_sent_at=None, renew_at=retry_at)
            await self.store.put(failed)
            self.lifecycle.hooks.fire("renewal_failed", failed, exc)
            if wait:
                raise
            return failed
        finally:
            self.lifecycle.forget_waiter(subscription.id, "subscribe", waiter)

    def _intent_lost(self, subscription: Subscription, now: datetime) -> bool:
        sent = subscription.intent_sent_at
        return sent is None or now - sent > timedelta(seconds=self.settings.verification_timeout)

    async def _renewal_loop(self) -> None:
        while True:
            self._renewal_wake.clear()
            try:
                await self.renew_due()
                delay = await self._next_check_delay()
            except Exception:
                log.exception("renewal pass failed")
                delay = self.settings.renew_check_seconds
            # asyncio.wait, not wait_for: on 3.11 wait_for can swallow close()'s cancellation
            # when the wake event is set at the same moment, and the loop would never end.
            woken = asyncio.ensure_future(self._renewal_wake.wait())
            try:
                await asyncio.wait({woken}, timeout=delay)
            finally:
                woken.cancel()

    async def _wake_renewals(self, subscription: Subscription) -> None:
        self._renewal_wake.set()

    async def _next_check_delay(self) -> float:
        now = self.now()
        times = [s.renew_at for s in await self.store.all() if s.renew_at and s.status in (ACTIVE, EXPIRED)]
        soonest = min(((t - now).total_seconds() for t in times), default=self.settings.renew_check_seconds)
        return min(max(soonest, 0.5), self.settings.renew_check_seconds)

    # --- the hub conversation -------------------------------------------------------------

    def _callback_base(self) -> str:
        if not self.callback_base_url:
            raise SubscriberError("no callback base URL: give callback_base_url (e.g. https://example.org/websub)")
        try:
            return check_url("callback base URL", self.callback_base_url).rstrip("/")
        except WireError as exc:
            raise SubscriberError(str(exc)) from None

    async def _send_intent(self, subscription: Subscription, mode: str) -> Subscription:
        """POST the form to the hub, following 307/308 to its new URL (kept in the store)."""
        form = SubscriptionRequest(
            mode=mode, topic=subscription.topic, callback=subscription.callback,
            lease_seconds=subscription.requested_lease_seconds, secret=subscription.secret,
        ).to_form()
        if self.intent_extras is not None:
            form = {**self.intent_extras(subscription, mode), **form}
        hub = subscription.hub
        for _ in range(MAX_HUB_REDIRECTS + 1):
            try:
                async with self.session.post(hub, data=form, allow_redirects=False) as response:
                    reply = (await response.text(errors="replace"))[:500].strip()
                    location = response.headers.get("Location")
                    status = response.status
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise SubscriptionError(f"cannot reach hub {hub} to {mode} {subscription.topic}: "
                                        f"{describe_client_error(exc)}") from exc
            if status in (307, 308) and location:
                hub = urljoin(hub, location)
                log.info("hub moved (%s) to %s", status, hub)
                subscription = subscription.evolve(hub=hub)
                await self.store.put(subscription)
                continue
            if 200 <= status < 300:
                return subscription
            raise SubscriptionError(
                f"hub {hub} refused to {mode} {subscription.topic}: {status} {reply or '(no reason given)'}",
                status=status, reason=reply,
            )
        raise SubscriptionError(f"hub {subscription.hub} redirected more than {MAX_HUB_REDIRECTS} times")

    async def _await_verification(self, subscription: Subscription, mode: str,
                                  waiter: asyncio.Future[Subscription]) -> Subscription:
        """The verified subscription; polls the store too, in case another process got the GET."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.verification_timeout
        while (remaining := deadline - loop.time()) > 0:
            try:
                return await asyncio.wait_for(asyncio.shield(waiter), min(remaining, 0.5))
            except TimeoutError:
                pass
            current = await self.store.get(subscription.id)
            if current is None or current.pending_mode is not None:
                continue
            if current.status == DENIED:
                raise SubscriptionDeniedError(
                    f"hub {current.hub} denied the subscription to {current.topic}: "
                    f"{current.denial_reason or 'no reason given'}", reason=current.denial_reason)
            if current.status == (ACTIVE if mode == "subscribe" else UNSUBSCRIBED):
                return current
        raise SubscriptionError(
            f"hub {subscription.hub} did not verify the {mode} of {subscription.topic} within "
            f"{self.settings.verification_timeout:g} s (is {subscription.callback} reachable from the hub?)"
        )


def _same(a: str, b: str) -> bool:
    try:
        return normalize_url(a) == normalize_url(b)
    except ValueError:
        return False

"""What the hub did with a subscription's intents, as the subscription client hears it from the
callback core: the waiters of `subscribe`/`unsubscribe`/`renew`/`diagnostics`, the lifecycle
hooks (verified, denied, renewal failed, diagnostics), and the diagnostics links received.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .errors import SettingsError, SubscriptionDeniedError
from .hooks import Hooks
from .store import Subscription

DenialHandler = Callable[[Subscription], Awaitable[None] | None]
LIFECYCLE_EVENTS = ("verified", "denied", "renewal_failed", "diagnostics")


class Lifecycle:
    """The callback core's `Lifecycle` listener of one subscription client."""

    def __init__(self) -> None:
        self.hooks = Hooks(LIFECYCLE_EVENTS, SettingsError)
        # The latest hub.diagnostics link each subscription's callback was sent (by id).
        self.diagnostics_links: dict[str, str] = {}
        self._waiters: dict[tuple[str, str], list[asyncio.Future[Subscription]]] = {}

    # --- what the core tells ---------------------------------------------------------------

    def verified(self, subscription: Subscription, mode: str) -> None:
        self._settle(subscription.id, mode, subscription)
        self.hooks.fire("verified", subscription)

    def denied(self, subscription: Subscription, error: SubscriptionDeniedError) -> None:
        self._settle(subscription.id, "subscribe", error)
        self.hooks.fire("denied", subscription)

    def diagnostics(self, subscription: Subscription, link: str) -> None:
        self.diagnostics_links[subscription.id] = link
        self._settle(subscription.id, "diagnostics", subscription)
        self.hooks.fire("diagnostics", subscription, link)

    # --- waiting for the hub ---------------------------------------------------------------

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

"""Push for sync: the callback server, the subscription (reused across restarts), and the
inbox receiver that stores each delivery before the hub gets its 2xx.

The callback core hands each delivery it accepted to the `InboxReceiver`, which keeps its
bytes in the inbox before the answer; when that fails the hub is answered 503 and delivers
again. Subscriptions live beside the engine's state
(DIR/.rsnotify/subscriptions.db), so a restart finds the callback URL and secret again and the
hub keeps the subscription's place in its log.
"""
from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import web

from rsnotify.websub import REPLAY_FIELD

from ..callback.aiohttp_adapter import add_callback_routes
from ..callback.core import CallbackResponse, Delivery
from ..client import Subscriber
from ..discovery import DiscoveredTopic
from ..errors import SubscriberError
from ..settings import CALLBACK_PATH, SubscriberSettings
from ..store import SqliteStore, Subscription
from .sink import DISK_ERRNOS
from .state import SyncState

log = logging.getLogger(__name__)

SUBSCRIPTIONS_FILE = "subscriptions.db"  # beside the state database, in DIR/.rsnotify/


# SQLite's primary result codes for a disk that cannot take the write: full, read-only, failing,
# or the database file gone. Anything else (a "database is locked" past the busy timeout, say) is
# answered 503 and delivered again by the hub, as before.
_DISK_CODES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN})


def _is_disk_trouble(exc: sqlite3.Error | OSError) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in DISK_ERRNOS
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _DISK_CODES     # extended codes carry the primary in the low byte


class InboxReceiver:
    """The callback core's receiver for sync: each delivery's bytes into the inbox, nothing else.

    Runs before the hub's answer: a failed write answers 503, so the hub keeps the delivery and
    retries. Parsing, de-duplication by notification id and gaps wait for the engine, which
    reads the inbox (live.py)."""

    def __init__(self, state: SyncState, wake: asyncio.Event) -> None:
        self.state = state
        self.wake = wake
        # The state database could not be written (a full or read-only disk): the engine stops
        # on it, with one line, rather than go on with records it cannot keep.
        self.fatal: sqlite3.Error | OSError | None = None

    async def receive(self, delivery: Delivery) -> CallbackResponse:
        try:
            self.state.add_to_inbox(delivery.subscription.hub, delivery.sequence, delivery.notification_id,
                                    delivery.content_type, delivery.body)
        except (sqlite3.Error, OSError) as exc:
            if self.fatal is None and _is_disk_trouble(exc):
                self.fatal = exc
            self.wake.set()
            return CallbackResponse(503, f"the notification could not be stored ({exc}); deliver it again later")
        except Exception as exc:
            log.exception("could not store the delivery to %s", delivery.subscription.id)
            return CallbackResponse(503, f"the notification could not be stored ({exc}); deliver it again later")
        self.wake.set()
        return CallbackResponse(200, "stored")

    async def close(self) -> None:
        """Nothing is held: every delivery was written before its answer."""


class Push:
    """The callback server and subscription of one synced folder."""

    def __init__(self, state: SyncState, settings: SubscriberSettings, wake: asyncio.Event,
                 status: Callable[[str], None] = lambda message: None) -> None:
        self.state = state
        self.settings = settings
        self.wake = wake
        self.status = status
        # Its own file: the inbox writes to the state file on every delivery, which would make
        # the store re-read its subscription each time (its cache follows the file's version).
        self.store = SqliteStore(state.path.with_name(SUBSCRIPTIONS_FILE))
        self.receiver = InboxReceiver(state, wake)
        self.subscriber = Subscriber(None, self.store, settings=settings, receiver=self.receiver)
        self.subscriber.on_denied(self._lost)
        self.subscriber.on_renewal_failed(self._lost)
        self.subscriber.intent_extras = self._replay_field
        self.subscription: Subscription | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def _lost(self, subscription: Subscription, *details: object) -> None:
        # A denied subscription or a failed renewal: push is unhealthy until a new subscription
        # is verified; the engine polls the Source's lists meanwhile.
        if self.subscription is not None and subscription.id == self.subscription.id:
            self.status(f"the subscription to {subscription.topic} at {subscription.hub} was lost "
                        f"({subscription.denial_reason or 'renewal failed'}); polling until it is back")
            self.subscription = None
            self.wake.set()

    def _replay_field(self, subscription: Subscription, mode: str) -> dict[str, str]:
        if mode != "subscribe":
            return {}
        last = self.state.last_sequences().get(subscription.hub)
        return {REPLAY_FIELD: str(last + 1)} if last is not None else {}

    async def start(self) -> str:
        """Serve the callbacks; returns the callback base URL."""
        app = web.Application(client_max_size=self.settings.max_body_bytes + 1024)
        path = urlsplit(self.settings.callback_url).path.rstrip("/") if self.settings.callback_url else CALLBACK_PATH
        add_callback_routes(app, self.subscriber.core, path or CALLBACK_PATH)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.listen_host, self.settings.listen_port)
        try:
            await site.start()
        except OSError as exc:
            raise SubscriberError(f"cannot listen on {self.settings.listen_host}:{self.settings.listen_port}: "
                                  f"{exc}") from None
        self.port = int(self._runner.addresses[0][1])
        host = self.settings.listen_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        base = self.settings.callback_url or f"http://{host}:{self.port}{CALLBACK_PATH}"
        self.subscriber.callback_base_url = base
        await self.subscriber.start()
        return base

    async def subscribe(self, channel: DiscoveredTopic) -> Subscription:
        """Reuse this folder's subscription to the channel (renewed, asking for a replay), else
        subscribe anew at the first hub that accepts."""
        problems = []
        for hub in channel.hubs:
            try:
                self.subscription = await self.subscriber.ensure(
                    channel.topic, hub, self.settings.lease_seconds, secret=self.settings.use_secret, wait=True,
                    discovered_from=channel.discovered_from, discovery=channel.discovery)
                return self.subscription
            except SubscriberError as exc:
                problems.append(str(exc))
        raise SubscriberError("; ".join(problems))

    async def close(self, *, unsubscribe: bool) -> None:
        if unsubscribe and self.subscription is not None:
            try:
                await self.subscriber.unsubscribe(self.subscription)
                self.status(f"unsubscribed from {self.subscription.topic}")
            except SubscriberError as exc:
                self.status(f"could not unsubscribe from {self.subscription.topic}: {exc}")
        await self.subscriber.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self.store.close()


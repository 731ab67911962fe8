"""The Destination side: callback endpoint, subscription lifecycle, discovery, signatures, sync.

    from rsnotify.subscriber import Subscriber, SubscriberSettings, ReceivedNotification
    from rsnotify.subscriber.callback.aiohttp_adapter import add_callback_routes, subscriber_context
    from rsnotify.subscriber.callback.asgi import ASGICallbackApp, subscriber_lifespan   # FastAPI, Starlette
    from rsnotify.subscriber.callback.wsgi import SubscriberThread, subscriber_thread
    from rsnotify.subscriber.callback.flask import callback_blueprint
    from rsnotify.subscriber.callback.django import callback_urls

The framework modules are imported on their own, so each framework stays optional.

Importing this package starts nothing and loads no module: the names below load theirs on first
use, so `rsnotify sync --help` (which imports `rsnotify.subscriber.cli`) does not pay for the
callback core, the client and aiohttp.web.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as mypy and editors see them; at run time __getattr__ loads them
    from .callback.core import (
        CallbackCore,
        CallbackRequest,
        CallbackResponse,
        Delivery,
        Receiver,
    )
    from .callback.receiver import (
        ACK_AFTER_HANDLER,
        ACK_AFTER_RESPONSE,
        Gap,
        HookReceiver,
        ReceivedNotification,
    )
    from .client import Subscriber
    from .discovery import (
        DiscoveredTopic,
        discover,
        discover_capability_list,
        discover_source,
        discover_topic,
    )
    from .errors import (
        DiagnosticsError,
        DiscoveryError,
        SettingsError,
        StoreError,
        SubscriberError,
        SubscriptionDeniedError,
        SubscriptionError,
    )
    from .settings import SubscriberSettings
    from .store import JsonFileStore, MemoryStore, Subscription, SubscriptionStore

# public name -> the module that defines it
_EXPORTS = {
    "CallbackCore": "rsnotify.subscriber.callback.core",
    "CallbackRequest": "rsnotify.subscriber.callback.core",
    "CallbackResponse": "rsnotify.subscriber.callback.core",
    "Delivery": "rsnotify.subscriber.callback.core",
    "Receiver": "rsnotify.subscriber.callback.core",
    "ACK_AFTER_HANDLER": "rsnotify.subscriber.callback.receiver",
    "ACK_AFTER_RESPONSE": "rsnotify.subscriber.callback.receiver",
    "Gap": "rsnotify.subscriber.callback.receiver",
    "HookReceiver": "rsnotify.subscriber.callback.receiver",
    "ReceivedNotification": "rsnotify.subscriber.callback.receiver",
    "Subscriber": "rsnotify.subscriber.client",
    "DiscoveredTopic": "rsnotify.subscriber.discovery",
    "discover": "rsnotify.subscriber.discovery",
    "discover_capability_list": "rsnotify.subscriber.discovery",
    "discover_source": "rsnotify.subscriber.discovery",
    "discover_topic": "rsnotify.subscriber.discovery",
    "DiagnosticsError": "rsnotify.subscriber.errors",
    "DiscoveryError": "rsnotify.subscriber.errors",
    "SettingsError": "rsnotify.subscriber.errors",
    "StoreError": "rsnotify.subscriber.errors",
    "SubscriberError": "rsnotify.subscriber.errors",
    "SubscriptionDeniedError": "rsnotify.subscriber.errors",
    "SubscriptionError": "rsnotify.subscriber.errors",
    "SubscriberSettings": "rsnotify.subscriber.settings",
    "JsonFileStore": "rsnotify.subscriber.store",
    "MemoryStore": "rsnotify.subscriber.store",
    "Subscription": "rsnotify.subscriber.store",
    "SubscriptionStore": "rsnotify.subscriber.store",
}

__all__ = [
    "ACK_AFTER_HANDLER",
    "ACK_AFTER_RESPONSE",
    "CallbackCore",
    "CallbackRequest",
    "CallbackResponse",
    "Delivery",
    "DiagnosticsError",
    "DiscoveredTopic",
    "DiscoveryError",
    "Gap",
    "HookReceiver",
    "JsonFileStore",
    "MemoryStore",
    "ReceivedNotification",
    "Receiver",
    "SettingsError",
    "StoreError",
    "Subscriber",
    "SubscriberError",
    "SubscriberSettings",
    "Subscription",
    "SubscriptionDeniedError",
    "SubscriptionError",
    "SubscriptionStore",
    "discover",
    "discover_capability_list",
    "discover_source",
    "discover_topic",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rsnotify.subscriber' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

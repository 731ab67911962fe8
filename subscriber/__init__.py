"""The Destination side: callback endpoint, subscription lifecycle, discovery, signatures, sync.

    from rsnotify.subscriber import Subscriber, SubscriberSettings, ReceivedNotification
    from rsnotify.subscriber.callback.aiohttp_adapter import add_callback_routes, subscriber_context
    from rsnotify.subscriber.callback.asgi import ASGICallbackApp, subscriber_lifespan   # FastAPI, Starlette
    from rsnotify.subscriber.callback.wsgi import SubscriberThread, subscriber_thread
    from rsnotify.subscriber.callback.flask import callback_blueprint
    from rsnotify.subscriber.callback.django import callback_urls

The framework modules are imported on their own, so each framework stays optional.
"""
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

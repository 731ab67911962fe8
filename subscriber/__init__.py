"""The Destination side: callback endpoint, subscription lifecycle, discovery, signatures, mirror.

    from subscriber import Subscriber, ReceivedNotification
    from subscriber.aiohttp_adapter import add_callback_routes, subscriber_context
    from subscriber.asgi import ASGICallbackApp
    from subscriber.wsgi import SubscriberThread
"""
from .client import Subscriber
from .core import (
    CallbackCore,
    CallbackRequest,
    CallbackResponse,
    Gap,
    ReceivedNotification,
)
from .discovery import (
    DiscoveredTopic,
    discover_capability_list,
    discover_source,
    discover_topic,
)
from .errors import (
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
    "CallbackCore", "CallbackRequest", "CallbackResponse", "DiscoveredTopic", "DiscoveryError", "Gap",
    "JsonFileStore", "MemoryStore", "ReceivedNotification", "SettingsError", "StoreError", "Subscriber",
    "SubscriberError", "SubscriberSettings", "Subscription", "SubscriptionDeniedError", "SubscriptionError",
    "SubscriptionStore", "discover_capability_list", "discover_source", "discover_topic",
]

"""The Source side: build, split and submit change notifications; advertise the channel.

    from publisher import Publisher
    ids = await Publisher(hub_url, topic_url).publish([("https://example.org/a", "updated")])

Importing this package starts nothing; the names below load their modules on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Publisher": "publisher.client",
    "Receipt": "publisher.client",
    "Outbox": "publisher.outbox",
    "OutboxEntry": "publisher.outbox",
    "Topic": "publisher.topic",
    "topic_handler": "publisher.topic",
    "add_topic_route": "publisher.topic",
    "asgi_topic_app": "publisher.topic",
    "wsgi_topic_app": "publisher.topic",
    "add_channel": "publisher.advertise",
    "add_channel_to_document": "publisher.advertise",
    "new_capability_list": "publisher.advertise",
    "PublisherSettings": "publisher.settings",
    "PublisherError": "publisher.errors",
    "PublishError": "publisher.errors",
    "HubUnreachableError": "publisher.errors",
    "ChangeInputError": "publisher.errors",
    "CapabilityListError": "publisher.errors",
    "SettingsError": "publisher.errors",
    "StateError": "publisher.errors",
}

__all__ = [  # noqa: RUF022  (grouped by module, as in _EXPORTS)
    "Publisher", "Receipt", "Outbox", "OutboxEntry", "Topic", "topic_handler", "add_topic_route",
    "asgi_topic_app", "wsgi_topic_app", "add_channel", "add_channel_to_document", "new_capability_list",
    "PublisherSettings", "PublisherError", "PublishError", "HubUnreachableError", "ChangeInputError",
    "CapabilityListError", "SettingsError", "StateError",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'publisher' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

"""The Source side: build, split and submit change notifications; advertise the channel.

    from rsnotify.publisher import Publisher
    async with Publisher(hub_url, topic_url) as publisher:     # closes its HTTP session
        ids = await publisher.publish([("https://example.org/a", "updated")])

Framework glue, imported on its own so each framework stays optional:
`rsnotify.publisher.web.flask` (add_topic_rule, publish_after_request) and
`rsnotify.publisher.web.django` (topic_path, publish_on_commit).

Importing this package starts nothing; the names below load their modules on first use.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Publisher": "rsnotify.publisher.client",
    "Receipt": "rsnotify.publisher.receipt",
    "Outbox": "rsnotify.publisher.outbox",
    "OutboxEntry": "rsnotify.publisher.outbox",
    "ChangeMemory": "rsnotify.publisher.memory.store",
    "ListPolicy": "rsnotify.publisher.memory.store",
    "Topic": "rsnotify.publisher.web.topic",
    "TopicResponse": "rsnotify.publisher.web.topic",
    "topic_response": "rsnotify.publisher.web.topic",
    "topic_handler": "rsnotify.publisher.web.topic",
    "add_topic_route": "rsnotify.publisher.web.topic",
    "asgi_topic_app": "rsnotify.publisher.web.topic",
    "wsgi_topic_app": "rsnotify.publisher.web.topic",
    "add_channel": "rsnotify.publisher.advertise",
    "add_channel_to_document": "rsnotify.publisher.advertise",
    "new_capability_list": "rsnotify.publisher.advertise",
    "PublisherSettings": "rsnotify.publisher.settings",
    "PublisherError": "rsnotify.publisher.errors",
    "PublishError": "rsnotify.publisher.errors",
    "HubUnreachableError": "rsnotify.publisher.errors",
    "ChangeInputError": "rsnotify.publisher.errors",
    "CapabilityListError": "rsnotify.publisher.errors",
    "SettingsError": "rsnotify.publisher.errors",
    "StateError": "rsnotify.publisher.errors",
}

__all__ = [  # noqa: RUF022  (grouped by module, as in _EXPORTS)
    "Publisher", "Receipt", "Outbox", "OutboxEntry", "ChangeMemory", "ListPolicy", "Topic", "TopicResponse", "topic_response", "topic_handler",
    "add_topic_route",
    "asgi_topic_app", "wsgi_topic_app", "add_channel", "add_channel_to_document", "new_capability_list",
    "PublisherSettings", "PublisherError", "PublishError", "HubUnreachableError", "ChangeInputError",
    "CapabilityListError", "SettingsError", "StateError",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'publisher' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

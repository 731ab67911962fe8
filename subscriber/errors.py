"""Errors of the subscriber toolkit.

SubscriberError
├── DiscoveryError          no topic or hub could be found from a URL (fetch failed, the
│                           document did not parse, no hub advertised); says what was tried
├── SubscriptionError       a hub refused a subscribe/unsubscribe request (its status and
│   │                       reason), or never verified it in time
│   └── SubscriptionDeniedError   the hub sent hub.mode=denied for the intent
├── DiagnosticsError        the hub would not show a subscription's diagnostics (its status and reason)
├── StoreError              the subscription state could not be read or written
└── SettingsError           a setting (option or RSNOTIFY_SUBSCRIBER_* variable) has a bad value

OutboundRefusedError (an aiohttp.ClientConnectionError, so fetch code handles it like any
other connection failure): a fetch made on a Source's word reached for an address the
outbound guard (rsnotify.netguard) does not allow. It lives in sync/session.py, beside the one
session that raises it, so this module needs no aiohttp and every command's start stays light.

Problems with an incoming callback request are not exceptions: the callback core answers
them with a typed `CallbackResponse` (4xx, text/plain reason).
"""
from __future__ import annotations


class SubscriberError(Exception):
    """Base of every error the subscriber toolkit raises."""


class DiscoveryError(SubscriberError):
    """No change-notification topic or hub could be found from the given URL."""


class SubscriptionError(SubscriberError):
    """A hub refused a subscription request, or did not verify it in time."""

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status     # the hub's HTTP status, when it answered
        self.reason = reason     # the hub's reply text (or hub.reason of a denial)


class SubscriptionDeniedError(SubscriptionError):
    """The hub denied the subscription (hub.mode=denied)."""


class DiagnosticsError(SubscriberError):
    """The hub did not answer a diagnostics request with the subscription's status."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status     # the hub's HTTP status, when it answered


class StoreError(SubscriberError):
    """The subscription state could not be read or written."""


class SettingsError(SubscriberError, ValueError):
    """A subscriber setting has a value that cannot be used."""

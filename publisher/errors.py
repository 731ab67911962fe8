"""Errors of the publisher toolkit.

PublisherError
├── ChangeInputError     a change given to the publisher cannot become a resource change
│                        (bad tuple/dict/JSON line, unknown change type, a datetime before
│                        the end of the topic's last notification, a malformed URI@DATETIME)
├── PublishError         the hub did not accept a notification: `.status` is the hub's HTTP
│   │                    status (None when it could not be reached), `.reason` its reply
│   │                    text; raised at once for 3xx/4xx, after the retries for 5xx
│   └── HubUnreachableError   no connection / timeout, after every retry (`.status` is None)
├── SettingsError        a setting or constructor argument is out of range (bad URL, number)
├── StateError           the chain-state file or the outbox database cannot be used
└── CapabilityListError  a Capability List cannot be produced or edited

Foreign errors (aiohttp's, sqlite3's, OSError) are translated here with `raise ... from`, so
callers never import aiohttp to handle a failed publish.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .receipt import Receipt

if TYPE_CHECKING:
    from rsnotify.notification import ResourceChange


class PublisherError(Exception):
    """Base of every error the publisher toolkit raises."""


class ChangeInputError(PublisherError, ValueError):
    """A change given to the publisher cannot become a resource change."""


class PublishError(PublisherError):
    """The hub did not accept a notification.

    `status`: the hub's HTTP status, or None when the hub could not be reached.
    `reason`: the hub's reply text (or the connection error), as the hub said it.
    `hub_url`: the hub that refused. `accepted`: receipts of the notifications accepted by
    every hub before this one failed. `unsent`: the resource changes not yet accepted, in
    order; `publish(error.unsent)` retries exactly those (the chain state only advances for
    accepted notifications).
    """

    def __init__(
        self,
        status: int | None,
        reason: str,
        hub_url: str = "",
        *,
        attempts: int = 1,
    ) -> None:
        self.status = status
        self.reason = reason
        self.hub_url = hub_url
        self.attempts = attempts
        self.accepted: list[Receipt] = []
        self.unsent: list[ResourceChange] = []
        super().__init__(self._message())

    def _message(self) -> str:
        where = f"hub {self.hub_url}" if self.hub_url else "the hub"
        tries = f" after {self.attempts} attempts" if self.attempts > 1 else ""
        if self.status is None:
            return f"{where} could not be reached{tries}: {self.reason}"
        return f"{where} refused the notification with {self.status}{tries}: {self.reason}"


class HubUnreachableError(PublishError):
    """No connection to the hub (refused, reset, DNS, timeout), after every retry."""

    def __init__(self, reason: str, hub_url: str = "", *, attempts: int = 1) -> None:
        super().__init__(None, reason, hub_url, attempts=attempts)


class SettingsError(PublisherError, ValueError):
    """A setting or constructor argument is out of range; the message names it and the value."""


class StateError(PublisherError):
    """The chain-state file or the outbox database cannot be read or written."""


class CapabilityListError(PublisherError, ValueError):
    """A Capability List cannot be produced or edited (unreadable, invalid, bad URL)."""

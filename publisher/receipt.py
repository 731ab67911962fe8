"""What a hub answers for one published notification: the value `Publisher.publish` returns and
a `PublishError` carries for the hubs that did accept. Its own module so errors.py, the client
and the outbox can all name it without importing each other."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Receipt:
    """A hub's acknowledgement of one notification."""

    notification_id: str | None   # the id the hub gave (None when a third-party hub gave none)
    hub_url: str
    topic_url: str
    status: int                   # the hub's 2xx status (the spec requires 200)
    sequence: int | None = None   # the notification's position in the topic's log, when told
    from_time: datetime | None = None
    until_time: datetime | None = None
    change_count: int = 0

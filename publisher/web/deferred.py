"""Changes taken now and sent later (after a web framework's commit or response): checked and
dated when taken, so a bad change fails the request that made it, then handed to an Outbox
(returns at once; the preferred sink in a request path) or a Publisher (waits for the hubs)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from rsnotify.notification import ResourceChange

from ..changes import ChangeLike, to_resource_changes
from ..client import Publisher
from ..outbox import Outbox

Sink = Outbox | Publisher


def take_changes(changes: Iterable[ChangeLike], now: Callable[[], datetime] | None = None) -> list[ResourceChange]:
    """The changes as ResourceChanges, those without a datetime dated now; ChangeInputError if bad."""
    return to_resource_changes(changes, now or (lambda: datetime.now(UTC)))


def send_changes(sink: Sink, changes: list[ResourceChange]) -> None:
    """Queue `changes` in the outbox, or publish them (blocking) with the publisher."""
    if isinstance(sink, Outbox):
        sink.add(changes)
    else:
        sink.publish_blocking(changes)

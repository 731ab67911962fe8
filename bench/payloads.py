"""The notifications a benchmark publishes: real ResourceSync change notifications built with
rsnotify's own model and serializer, plus the Link header of a submission."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange
from rsnotify.websub import build_link_header
from rsnotify.xml import to_xml

CHANGES = (ChangeType.CREATED, ChangeType.UPDATED, ChangeType.DELETED)
BASE_TIME = datetime(2025, 1, 1, tzinfo=timezone.utc)


def notification_body(index: int, entries: int = 10, *, site: str = "http://bench.example.org") -> bytes:
    """A valid change notification with `entries` <url> entries, different for each `index`."""
    start = BASE_TIME + timedelta(seconds=index * entries)
    changes = tuple(
        ResourceChange(loc=f"{site}/res/{index}/{n}", change=CHANGES[(index + n) % 3],
                       changed_at=start + timedelta(seconds=n), length=1000 + n,
                       hashes=(("md5", f"{index:016x}{n:016x}"),), media_type="text/html")
        for n in range(entries))
    notification = ChangeNotification(from_time=start, until_time=start + timedelta(seconds=entries),
                                      changes=changes, up=f"{site}/capabilitylist.xml")
    return to_xml(notification)


def bodies(count: int, entries: int = 10) -> list[bytes]:
    return [notification_body(i, entries) for i in range(count)]


def submission_headers(topic: str, hub_url: str) -> dict[str, str]:
    """Headers of a ResourceSync submission from loopback (no token needed there)."""
    return {"Content-Type": "application/xml",
            "Link": build_link_header([(topic, "self"), (hub_url, "hub")])}


def delivery_headers(topic: str, hub_url: str, notification_id: str, sequence: int) -> dict[str, str]:
    """The headers a hub's delivery carries; the ceiling client sends the same ones."""
    from rsnotify.websub import NOTIFICATION_ID_HEADER, SEQUENCE_HEADER

    return {"Content-Type": "application/xml",
            "Link": build_link_header([(topic, "self"), (hub_url, "hub")]),
            NOTIFICATION_ID_HEADER: notification_id, SEQUENCE_HEADER: str(sequence)}

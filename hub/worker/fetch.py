"""Async core of the thin-ping fetch: GET a topic URL and append what it returns to the topic's log.

Bounded in time (fetch_timeout) and size (fetch_max_bytes), through the worker's guarded
thin-ping client (rsnotify/outbound.py, one that keeps the answers' header fields), never
following redirects. No RQ here beyond queueing the fan-out.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any


from rsnotify.errors import WireError
from rsnotify.outbound import Limits
from rsnotify.outbound_answer import (
    BodyTooLongError,
    ContentEncodingError,
    RequestFailedError,
)
from rsnotify.websub import links_by_rel, parse_link_header

from .. import enqueue, store
from ..callbacks import exact_url
from ..records import AppendedNotification

log = logging.getLogger(__name__)

DEFAULT_CONTENT_TYPE = "application/octet-stream"
IDENTITY = {"Accept-Encoding": "identity"}  # the body is relayed as is, so it must not arrive compressed


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    """What a thin-ping fetch did: `notification` when the body was appended, else `reason`."""

    topic: str
    status: int | None = None
    notification: AppendedNotification | None = None
    reason: str = ""


async def fetch_topic(ctx: Any, topic: str) -> FetchOutcome:
    """Fetch `topic` and append the body with its Content-Type; then make sure a fan-out is queued."""
    settings = ctx.settings
    limit = settings.fetch_max_bytes
    # the body as sent is read at most one byte past the limit: enough to tell it is too long
    limits = Limits(settings.connect_timeout, settings.fetch_timeout, limit + 1)
    try:
        async with await ctx.fetcher.open("GET", exact_url(topic), IDENTITY, limits) as response:
            status = response.status
            if not 200 <= status < 300:
                return _refused(topic, status, f"topic answered {status}; expected 2xx (redirects are not followed)")
            headers = response.headers
            encoding = headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                return _refused(topic, status, f"topic answered with Content-Encoding {encoding}; expected identity")
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > limit:
                return _refused(topic, status, f"response of {int(length)} bytes is over the limit of {limit} "
                                               "(--fetch-max-bytes)")
            body = await response.read(limit)
            content_type = headers.get("content-type", DEFAULT_CONTENT_TYPE)
            resourcesync = _resourcesync_link(headers.get("link", ""))
    except BodyTooLongError:
        return _refused(topic, None, f"response is over the limit of {limit} bytes (--fetch-max-bytes)")
    except (RequestFailedError, ContentEncodingError) as exc:
        refused = isinstance(exc, RequestFailedError) and exc.is_refused
        return _refused(topic, None, str(exc) if refused else f"topic unreachable: {exc}")
    except ValueError as exc:   # yarl: not a URL it can send to (intake checked it; a refusal, never a crash)
        return _refused(topic, None, f"topic URL cannot be fetched: {exc}")
    appended = await store.append_notification(
        ctx.redis, topic, body, content_type=content_type, resourcesync=resourcesync,
        now=ctx.now(), max_len=settings.log_max_len)
    await enqueue.ensure_fan_out(ctx.queue, appended.topic_id, redis=ctx.redis)
    log.info("fetched %s for a thin ping: notification %s (seq %s, %d bytes, %s)",
             topic, appended.notification_id, appended.sequence, len(body), content_type)
    return FetchOutcome(topic, status, appended)


def _refused(topic: str, status: int | None, reason: str) -> FetchOutcome:
    log.warning("thin-ping fetch of %s stored nothing: %s", topic, reason)
    return FetchOutcome(topic, status, None, reason)


def _resourcesync_link(value: str) -> str:
    """The first rel="resourcesync" link of the answer's Link fields (the client joins repeated
    fields with ", ", which a Link header's grammar reads as one list)."""
    try:
        found = links_by_rel(parse_link_header([value]), "resourcesync") if value else []
    except WireError:
        return ""
    return found[0] if found else ""

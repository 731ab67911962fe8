"""Async core of the thin-ping fetch: GET a topic URL and append what it returns to the topic's log.

Bounded in time (fetch_timeout) and size (fetch_max_bytes), through the guarded session,
never following redirects. No RQ here beyond queueing the fan-out.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import aiohttp

from rsnotify.errors import WireError
from rsnotify.websub import links_by_rel, parse_link_header

from .. import enqueue, store
from ..netguard import ResponseTooLargeError, describe_refusal, read_limited
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
    timeout = aiohttp.ClientTimeout(total=settings.fetch_timeout, sock_connect=settings.connect_timeout)
    try:
        async with ctx.session.get(topic, allow_redirects=False, timeout=timeout, headers=IDENTITY) as response:
            status = response.status
            if not 200 <= status < 300:
                return _refused(topic, status, f"topic answered {status}; expected 2xx (redirects are not followed)")
            encoding = response.headers.get("Content-Encoding", "identity").lower()
            if encoding != "identity" and ctx.session.auto_decompress is False:
                return _refused(topic, status, f"topic answered with Content-Encoding {encoding}; expected identity")
            body = await read_limited(response, settings.fetch_max_bytes, strict=True)
            content_type = response.headers.get("Content-Type", DEFAULT_CONTENT_TYPE)
            resourcesync = _resourcesync_link(response.headers.getall("Link", []))
    except ResponseTooLargeError as exc:
        return _refused(topic, None, f"{exc} (--fetch-max-bytes)")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return _refused(topic, None, describe_refusal(exc) or f"topic unreachable: {type(exc).__name__} {exc}".strip())
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


def _resourcesync_link(values: list[str]) -> str:
    try:
        found = links_by_rel(parse_link_header(values), "resourcesync")
    except WireError:
        return ""
    return found[0] if found else ""

"""The hub endpoint (POST /): subscribe / unsubscribe, ResourceSync submissions, thin pings; and /health.

Each request is validated completely before anything is stored; refusals are HubErrors
(the app's middleware answers them as text/plain with their status).
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from cryptography.fernet import Fernet
from multidict import MultiDictProxy
from redis.asyncio import Redis
from redis.exceptions import RedisError
from rq import Queue

from rsnotify.errors import DocumentParseError, ValidationError, WireError
from rsnotify.websub import (
    NOTIFICATION_ID_HEADER,
    SubscriptionRequest,
    check_url,
    links_by_rel,
    normalize_url,
    parse_link_header,
    parse_subscription_form,
)
from rsnotify.xml import parse_notification

from . import jobs, store
from .errors import (
    AuthenticationError,
    BadRequestError,
    ForbiddenError,
    PayloadTooLargeError,
    UnsupportedMediaError,
)
from .secrets import encrypt_secret
from .settings import HubSettings

log = logging.getLogger(__name__)


# app keys: what build_app puts in the application, read by the handlers
SETTINGS = web.AppKey("settings", HubSettings)
REDIS = web.AppKey("redis", Redis)                           # asyncio client, bytes replies
QUEUE = web.AppKey("queue", Queue)                           # rq.Queue on its own synchronous connection
FERNET = web.AppKey("fernet", Fernet)                        # encrypts subscription secrets
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")  # () -> epoch seconds

FORM_TYPE = "application/x-www-form-urlencoded"
XML_TYPE = "application/xml"
MAX_PING_TOPICS = 100
PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")  # a local proxy relays remote clients
PARSE_INLINE_BYTES = 256 * 1024  # larger documents are parsed in a thread, so the loop stays free
CHALLENGE_BYTES = 32


# --- publishers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Publishers:
    """Publisher tokens and the topic prefixes each may publish to (normalized)."""

    tokens: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_pairs(cls, pairs: tuple[tuple[str, str], ...]) -> Publishers:
        grouped: dict[str, list[str]] = {}
        for token, prefix in pairs:
            grouped.setdefault(token, []).append(normalize_url(prefix))
        return cls(tuple((token, tuple(prefixes)) for token, prefixes in grouped.items()))

    @property
    def is_open_to_loopback(self) -> bool:
        """With no tokens configured, loopback clients may publish anything."""
        return not self.tokens

    def serves(self, topic: str) -> bool:
        """May anyone publish `topic` here (so subscribing to it makes sense)?"""
        wanted = normalize_url(topic)
        return not self.tokens or any(wanted.startswith(p) for _, ps in self.tokens for p in ps)

    def authorize(self, request: web.Request, topics: list[str]) -> None:
        """Raise AuthenticationError (401) or ForbiddenError (403) unless `request` may publish `topics`."""
        if self.is_open_to_loopback:
            if not _is_loopback(request.remote):
                raise ForbiddenError(f"only loopback clients may publish to a hub without publisher tokens, "
                                     f"got a request from {request.remote}")
            if any(name in request.headers for name in PROXY_HEADERS):
                raise ForbiddenError("a request relayed by a proxy needs a publisher token "
                                     "(configure --publish-token): only local clients may publish without one")
            return
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("publishing needs 'Authorization: Bearer <token>', got none")
        prefixes = self._prefixes(token.strip())
        if prefixes is None:
            raise AuthenticationError("the bearer token is not a publisher token of this hub")
        outside = [t for t in topics if not normalize_url(t).startswith(prefixes)]
        if outside:
            raise ForbiddenError([f"this token may not publish to {t}; it may publish under "
                                  f"{', '.join(prefixes)}" for t in outside])

    def _prefixes(self, token: str) -> tuple[str, ...] | None:
        found = None
        for known, prefixes in self.tokens:  # compare every token in constant time
            if hmac.compare_digest(known.encode(), token.encode()):
                found = prefixes
        return found


PUBLISHERS = web.AppKey("publishers", Publishers)            # tokens and their topic prefixes


def _is_loopback(remote: str | None) -> bool:
    try:
        ip = ipaddress.ip_address((remote or "").split("%", 1)[0])
    except ValueError:
        return False  # a Unix socket peer has no address: not trusted
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


# --- the hub endpoint ---------------------------------------------------------------------


async def hub_endpoint(request: web.Request) -> web.StreamResponse:
    """POST /: dispatch on Content-Type and hub.mode."""
    content_type = request.content_type if "Content-Type" in request.headers else ""
    if content_type == FORM_TYPE:
        form = await _read_form(request)
        mode = form.get("hub.mode")
        if mode in ("subscribe", "unsubscribe"):
            return await subscription_request(request, form)
        if mode == "publish":
            return await thin_ping(request, form)
        raise BadRequestError(f"hub.mode must be subscribe, unsubscribe or publish, got {mode!r}")
    if content_type == XML_TYPE:
        return await submission(request)
    raise UnsupportedMediaError(
        f"Content-Type must be {FORM_TYPE} (subscribe, unsubscribe, publish) or {XML_TYPE} "
        f"(a ResourceSync change notification), got {content_type or 'none'!r}")


async def _read_form(request: web.Request) -> MultiDictProxy[str]:
    settings = request.app[SETTINGS]
    if request.content_length is not None and request.content_length > settings.max_body:
        raise PayloadTooLargeError(f"form of {request.content_length} bytes is larger than the "
                                   f"hub's limit of {settings.max_body} bytes")
    try:
        form = await request.post()
    except UnicodeDecodeError:
        raise BadRequestError("the form is not valid UTF-8") from None
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLargeError(f"form is larger than the hub's limit of {settings.max_body} bytes") from None
    return form  # type: ignore[return-value]  # urlencoded forms hold only strings


# --- subscribe / unsubscribe --------------------------------------------------------------


def clamp_lease(requested: int | None, settings: HubSettings) -> int:
    """The lease granted: the request (or the default) held within [lease_min, lease_max]."""
    wanted = settings.lease_default if requested is None else requested
    return max(settings.lease_min, min(settings.lease_max, wanted))


async def subscription_request(request: web.Request, form: MultiDictProxy[str]) -> web.Response:
    """Validate a subscribe/unsubscribe form, keep the intent, queue its verification: 202."""
    try:
        wanted = parse_subscription_form(form)
    except WireError as exc:
        raise BadRequestError(exc.problems) from None
    app = request.app
    challenge = secrets.token_urlsafe(CHALLENGE_BYTES)
    intent = make_intent(wanted, app[SETTINGS], app[PUBLISHERS], app[FERNET])
    if await store.queue_intent(app[REDIS], challenge, intent, app[SETTINGS].intent_ttl):
        await jobs.enqueue_pending_verifications(app[QUEUE])
    log.info("%s request for %s at %s accepted; verification queued%s", wanted.mode, wanted.callback,
             wanted.topic, f" (will be denied: {intent.reason})" if intent.reason else "")
    return web.Response(status=202, text=f"{wanted.mode} request accepted; the callback will be verified\n")


def make_intent(wanted: SubscriptionRequest, settings: HubSettings, publishers: Publishers,
                fernet: Fernet) -> store.Intent:
    """The intent to verify, or a denial when this hub does not serve the topic."""
    if not publishers.serves(wanted.topic):
        return store.Intent("denied", wanted.topic, wanted.callback,
                            reason="this hub does not carry that topic (no publisher may publish it here)")
    if wanted.mode == "unsubscribe":
        return store.Intent("unsubscribe", wanted.topic, wanted.callback)
    return store.Intent("subscribe", wanted.topic, wanted.callback,
                        lease_seconds=clamp_lease(wanted.lease_seconds, settings),
                        secret=encrypt_secret(fernet, wanted.secret))


# --- ResourceSync submission --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubmissionLinks:
    topic: str
    resourcesync: str = ""


def check_submission_links(values: list[str], hub_url: str) -> SubmissionLinks:
    """The topic (rel=self) and optional rel=resourcesync of a submission; rel=hub must name this hub."""
    if not values:
        raise BadRequestError(f'a submission needs a Link header with <topic>; rel="self" and '
                              f'<{hub_url}>; rel="hub", got none')
    try:
        links = parse_link_header(values)
    except WireError as exc:
        raise BadRequestError(exc.problems) from None
    problems: list[str] = []
    selves, hubs = links_by_rel(links, "self"), links_by_rel(links, "hub")
    topic = ""
    if not selves:
        problems.append('the Link header must carry rel="self" (the topic), got none')
    elif len(set(selves)) > 1:
        problems.append(f'the Link header must carry one rel="self" topic, got {", ".join(selves)}')
    else:
        try:
            topic = check_url('the rel="self" link', selves[0])
        except WireError as exc:
            problems.extend(exc.problems)
    if not hubs:
        problems.append(f'the Link header must carry rel="hub" naming this hub ({hub_url}), got none')
    elif not any(_same_url(h, hub_url) for h in hubs):
        problems.append(f'the Link header\'s rel="hub" must name this hub ({hub_url}), got {", ".join(hubs)}')
    if problems:
        raise BadRequestError(problems)
    rs = links_by_rel(links, "resourcesync")
    return SubmissionLinks(topic, rs[0] if rs else "")


def _same_url(url: str, hub_url: str) -> bool:
    try:
        return normalize_url(url) == hub_url
    except ValueError:  # a bad port, for instance
        return False


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` (nothing more is read)."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLargeError(f"body of {request.content_length} bytes is larger than the hub's "
                                   f"limit of {limit} bytes (--max-body)")
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(min(1 << 20, limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"body is larger than the hub's limit of {limit} bytes (--max-body)")
    return b"".join(chunks)


async def submission(request: web.Request) -> web.Response:
    """A ResourceSync change notification: authenticate, bound, validate, append, queue fan-out: 200."""
    app = request.app
    settings = app[SETTINGS]
    links = check_submission_links(request.headers.getall("Link", []), settings.hub_url)
    app[PUBLISHERS].authorize(request, [links.topic])
    body = await read_body(request, settings.max_body)
    await validate_notification(body)
    appended = await store.append_notification(
        app[REDIS], links.topic, body, content_type=request.headers["Content-Type"],
        resourcesync=links.resourcesync, now=app[CLOCK](), max_len=settings.log_max_len)
    await jobs.ensure_fan_out(app[QUEUE], appended.topic_id, redis=app[REDIS])
    log.info("notification %s stored for %s (seq %s, %d bytes)", appended.notification_id, links.topic,
             appended.sequence, len(body))
    answer = {"notification_id": appended.notification_id, "topic": links.topic, "sequence": appended.sequence}
    return web.Response(status=200, text=json.dumps(answer), content_type="application/json",
                        headers={NOTIFICATION_ID_HEADER: appended.notification_id})


async def validate_notification(body: bytes) -> None:
    """Raise BadRequestError with every problem unless `body` is a valid change notification."""
    if not body:
        raise BadRequestError("the body is empty; expected a ResourceSync change notification (<urlset>)")
    try:
        if len(body) <= PARSE_INLINE_BYTES:
            parse_notification(body)
        else:
            await asyncio.to_thread(parse_notification, body)
    except ValidationError as exc:
        raise BadRequestError(["the body is not a valid change notification:", *exc.problems]) from None
    except DocumentParseError as exc:
        raise BadRequestError(f"the body is not a change notification: {exc}") from None


# --- thin ping ----------------------------------------------------------------------------


async def thin_ping(request: web.Request, form: MultiDictProxy[str]) -> web.Response:
    """hub.mode=publish with one or more hub.url / hub.topic: queue a fetch of each: 202."""
    topics: list[str] = []
    problems: list[str] = []
    for name in ("hub.url", "hub.topic"):
        for value in form.getall(name, []):
            try:
                url = check_url(name, value)
            except WireError as exc:
                problems.extend(exc.problems)
                continue
            if url not in topics:
                topics.append(url)
    if not topics and not problems:
        problems.append("hub.mode=publish needs at least one hub.url or hub.topic, got none")
    if len(topics) > MAX_PING_TOPICS:
        problems.append(f"a ping may name at most {MAX_PING_TOPICS} topics, got {len(topics)}")
    if problems:
        raise BadRequestError(problems)
    request.app[PUBLISHERS].authorize(request, topics)
    for topic in topics:
        await jobs.enqueue_fetch(request.app[QUEUE], topic)
    log.info("thin ping for %s: fetch queued", ", ".join(topics))
    return web.Response(status=202, text=f"publish accepted; fetching {len(topics)} topic(s)\n")


# --- /health ------------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    """200 with counts once Redis answers (and a worker is seen when this hub runs workers); else 503."""
    app = request.app
    settings = app[SETTINGS]
    queue = settings.queue_name
    try:
        redis = app[REDIS]
        async with redis.pipeline(transaction=False) as pipe:
            pipe.ping()
            pipe.smembers("rq:workers")
            for registry in ("queue", "wip", "scheduled", "failed"):
                (pipe.llen if registry == "queue" else pipe.zcard)(f"rq:{registry}:{queue}")
            pipe.zcard(store.leases_key())
            pipe.scard(store.topics_key())
            pipe.llen(store.verify_pending_key())
            _, members, queued, started, scheduled, failed, subscriptions, topics, pending = await pipe.execute()
        async with redis.pipeline(transaction=False) as pipe:
            for member in members:
                pipe.exists(member)
            workers = sum(await pipe.execute()) if members else 0
    except (RedisError, OSError) as exc:
        body = {"status": "unavailable", "redis": False, "error": f"{type(exc).__name__}: {exc}"}
        return web.json_response(body, status=503)
    ready = workers > 0 or settings.workers == 0
    body = {
        "status": "ok" if ready else "starting",
        "redis": True,
        "workers": workers,
        "queues": {queue: {"queued": queued, "started": started, "scheduled": scheduled, "failed": failed}},
        "subscriptions": subscriptions,
        "topics": topics,
        "verifications_pending": pending,
        "hub_url": settings.hub_url,
    }
    return web.json_response(body, status=200 if ready else 503)

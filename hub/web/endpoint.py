"""The hub endpoint (POST /): subscribe / unsubscribe, ResourceSync submissions, thin pings.

Each request is validated completely before anything is stored; refusals are HubErrors
(the app's middleware answers them as text/plain with their status).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii as json_string
from urllib.parse import parse_qsl, urlsplit

from aiohttp import web
from cryptography.fernet import Fernet
from multidict import MultiDict, MultiDictProxy

from rsnotify.datetimes import utc_stamp
from rsnotify.errors import (
    DocumentParseError,
    NotificationParseError,
    Problems,
    ValidationError,
    WireError,
)
from rsnotify.notification import future_problems
from rsnotify.notification_scan import is_valid_usual_notification
from rsnotify.safexml import INLINE_BYTES, parse_soon
from rsnotify.websub import (
    NOTIFICATION_ID_HEADER,
    REPLAY_FIELD,
    SubscriptionRequest,
    check_url,
    links_by_rel,
    normalize_url,
    parse_link_header,
    parse_subscription_form,
    repeated_field_problem,
)
from rsnotify.xml import parse_notification

from .. import enqueue, store
from ..crypto import encrypt_secret
from ..errors import (
    BadRequestError,
    PayloadTooLargeError,
    RequestTimeoutError,
    UnsupportedMediaError,
)
from ..logs import escape, redact_callback
from ..netguard import literal_refusal
from ..records import Intent
from ..settings import HubSettings
from .appkeys import BATCH, CLOCK, FERNET, LIMITS, PUBLISHERS, QUEUE, REDIS, SETTINGS
from .auth import Publishers, bearer_token, client_of
from .ratelimit import client_identifier, token_identifier
from .replication import wait_for_replicas

log = logging.getLogger(__name__)


FORM_TYPE = "application/x-www-form-urlencoded"
XML_TYPE = "application/xml"
MAX_PING_TOPICS = 100
MAX_FORM_FIELDS = 200  # a subscribe form has five; a thin ping names at most MAX_PING_TOPICS
CHALLENGE_BYTES = 32
IDEMPOTENCY_HEADER = "Idempotency-Key"      # a publisher's name for one publish, kept for log_max_age
REPLAYED_HEADER = "Idempotent-Replayed"     # "true" on the answer to a repeat: nothing was stored
MAX_IDEMPOTENCY_KEY = 200
# s the key the hub gives a publish without one is kept at least: it only has to outlive the
# append's own retries (for --redis-timeout, each try up to --redis-timeout long; see
# own_key_ttl). Every such publish stores one: at 3,500 publishes/s, 300 s meant ~1M keys.
OWN_KEY_TTL = 60


# --- the hub endpoint ---------------------------------------------------------------------


async def hub_endpoint(request: web.Request) -> web.StreamResponse:
    """POST /: dispatch on Content-Type and hub.mode."""
    content_type = request.content_type if "Content-Type" in request.headers else ""
    if content_type == FORM_TYPE:
        form = await read_form(request)
        if problem := repeated_field_problem("hub.mode", form.getall("hub.mode", [])):
            raise BadRequestError(problem)
        mode = form.get("hub.mode")
        if mode in ("subscribe", "unsubscribe"):
            return await subscription_request(request, form)
        if mode == "publish":
            return await thin_ping(request, form)
        got = repr(mode) if mode is not None else "no hub.mode field"
        raise BadRequestError(f"hub.mode must be subscribe, unsubscribe or publish, got {got}")
    if content_type == XML_TYPE:
        # the charset parameter outranks the XML declaration (RFC 7303, 3.2), and the type goes
        # to every subscriber as published: one other than UTF-8 would make them misread the body
        charset = request.charset
        if charset is not None and charset.lower() not in ("utf-8", "utf8"):
            raise BadRequestError(f"a change notification must be UTF-8; got Content-Type charset "
                                  f"{escape(charset, 40)!r}")
        return await submission(request)
    raise UnsupportedMediaError(
        f"Content-Type must be {FORM_TYPE} (subscribe, unsubscribe, publish) or {XML_TYPE} "
        f"(a ResourceSync change notification), got {repr(content_type) if content_type else 'no Content-Type'}")


async def read_form(request: web.Request) -> MultiDictProxy[str]:
    """The urlencoded form, read up to --max-form bytes within --body-timeout; UTF-8 only."""
    settings = request.app[SETTINGS]
    charset = (request.charset or "utf-8").lower()
    if charset not in ("utf-8", "utf8", "us-ascii", "ascii"):
        raise BadRequestError(f"the form's charset must be UTF-8, got {escape(charset, 40)!r}")
    body = await read_body(request, settings.max_form, what="form", setting="--max-form")
    try:
        text = body.decode("utf-8")
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=False, encoding="utf-8",
                          errors="strict", max_num_fields=MAX_FORM_FIELDS)
    except UnicodeDecodeError:
        raise BadRequestError("the form is not valid UTF-8") from None
    except ValueError:  # max_num_fields passed
        raise BadRequestError(f"the form has more than {MAX_FORM_FIELDS} fields") from None
    return MultiDictProxy(MultiDict(pairs))


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
    settings = app[SETTINGS]
    refusal = literal_refusal(wanted.callback, settings.allowed_networks)
    if refusal:  # nothing is stored or queued, so no verification or denial ever goes there
        raise BadRequestError(f"hub.callback cannot be reached from this hub: {refusal}")
    await app[LIMITS].check_subscribe(client_of(request), urlsplit(wanted.callback).hostname or "",
                                      ipv6_prefix=settings.rate_ipv6_prefix,
                                      resolve_timeout=settings.connect_timeout)
    challenge = secrets.token_urlsafe(CHALLENGE_BYTES)
    # --replay-max 0: the extension is off
    intent = make_intent(wanted, settings, app[PUBLISHERS], app[FERNET],
                         replay_from=replay_from(form) if settings.replay_max != 0 else 0)
    # the requests arriving meanwhile share one pipeline (app[BATCH]), each its own script call
    if await store.queue_intent(app[REDIS], challenge, intent, settings.intent_ttl, batch=app[BATCH]):
        await enqueue.enqueue_pending_verifications(app[QUEUE])
    if log.isEnabledFor(logging.INFO):     # its arguments cost as much as the line: none below INFO
        log.info("%s request for %s at %s accepted; verification queued%s", wanted.mode,
                 redact_callback(wanted.callback), escape(wanted.topic),
                 f" (will be denied: {intent.reason})" if intent.reason else "")
        log.debug("%s request's callback: %s", wanted.mode, escape(wanted.callback))
    return web.Response(status=202, text=f"{wanted.mode} request accepted; the callback will be verified\n")


def replay_from(form: MultiDictProxy[str]) -> int:
    """rsnotify.replay_from, the first sequence a returning subscriber wants (0 for none). An
    extension other hubs ignore, so a malformed one is ignored here too, never a 400."""
    value = form.get(REPLAY_FIELD, "")
    if not (value.isascii() and value.isdigit() and len(value) <= 12):
        return 0
    return int(value)


def make_intent(wanted: SubscriptionRequest, settings: HubSettings, publishers: Publishers,
                fernet: Fernet, *, replay_from: int = 0) -> Intent:
    """The intent to verify, or a denial when this hub does not serve the topic. `replay_from`
    (rsnotify.replay_from) is kept for a subscribe only."""
    if not publishers.serves(wanted.topic):
        return Intent("denied", wanted.topic, wanted.callback,
                            reason="this hub does not carry that topic (no publisher may publish it here)")
    if wanted.mode == "unsubscribe":
        return Intent("unsubscribe", wanted.topic, wanted.callback)
    return Intent("subscribe", wanted.topic, wanted.callback,
                        lease_seconds=clamp_lease(wanted.lease_seconds, settings),
                        secret=encrypt_secret(fernet, wanted.secret), replay_from=replay_from)


# --- ResourceSync submission --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubmissionLinks:
    topic: str
    resourcesync: str = ""


def check_submission_links(values: list[str], hub_url: str) -> SubmissionLinks:
    """The topic (rel=self) and optional rel=resourcesync of a submission; rel=hub must name this hub."""
    if sum(map(len, values)) > MAX_KEPT_LINKS:      # read as sent, not kept: see _kept_links_of
        return _links_of(values, hub_url)
    return _kept_links_of(tuple(values), hub_url)


# A publisher sends the same Link header with every publish to a topic: the answer for a header
# is kept (a refusal is not, it raises), so most publishes skip the parse and the URL checks. It
# is read before the publisher is known, so only short headers are kept: at most
# KEPT_LINKS x MAX_KEPT_LINKS characters, whatever anyone sends.
KEPT_LINKS = 256
MAX_KEPT_LINKS = 2048


@functools.lru_cache(maxsize=KEPT_LINKS)
def _kept_links_of(values: tuple[str, ...], hub_url: str) -> SubmissionLinks:
    return _links_of(values, hub_url)


def _links_of(values: Sequence[str], hub_url: str) -> SubmissionLinks:
    if not values:
        raise BadRequestError(f'a submission needs a Link header with <topic>; rel="self" and '
                              f'<{hub_url}>; rel="hub", got none')
    try:
        links = parse_link_header(values)
    except WireError as exc:
        raise BadRequestError(exc.problems) from None
    problems = Problems()
    selves, hubs = links_by_rel(links, "self"), links_by_rel(links, "hub")
    topic: str | None = ""
    if not selves:
        problems.add('the Link header must carry rel="self" (the topic), got none')
    elif len(set(selves)) > 1:
        problems.add(f'the Link header must carry one rel="self" topic, got {", ".join(selves)}')
    else:
        topic = problems.check(check_url, 'the rel="self" link', selves[0])
    if not hubs:
        problems.add(f'the Link header must carry rel="hub" naming this hub ({hub_url}), got none')
    elif not any(_same_url(h, hub_url) for h in hubs):
        problems.add(f'the Link header\'s rel="hub" must name this hub ({hub_url}), got {", ".join(hubs)}')
    problems.raise_if_any(BadRequestError)
    rs = links_by_rel(links, "resourcesync")
    return SubmissionLinks(topic or "", rs[0] if rs else "")


def _same_url(url: str, hub_url: str) -> bool:
    try:
        return normalize_url(url) == hub_url
    except ValueError:  # a bad port, for instance
        return False


async def read_body(request: web.Request, limit: int, *, what: str = "body", setting: str = "--max-body") -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` (nothing more is read), and
    with 408 when it does not arrive within --body-timeout."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLargeError(f"{what} of {request.content_length} bytes is larger than the hub's "
                                   f"limit of {limit} bytes ({setting})")
    timeout = request.app[SETTINGS].body_timeout
    content = request.content
    chunks: list[bytes] = []
    size = 0
    too_large = f"{what} is larger than the hub's limit of {limit} bytes ({setting})"
    try:
        if content.is_eof():    # all of it has arrived (a small body usually has): no wait to bound
            chunks.append(content.read_nowait(limit + 1))
            size = len(chunks[0])
            if size > limit:
                raise PayloadTooLargeError(too_large)
        if not content.at_eof():
            async with asyncio.timeout(timeout):
                while chunk := await content.read(min(1 << 20, limit + 1 - size)):
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > limit:
                        raise PayloadTooLargeError(too_large)
    except TimeoutError:
        raise RequestTimeoutError(f"the {what} did not arrive within {timeout:g} s (--body-timeout)") from None
    except web.RequestPayloadError as exc:  # e.g. Content-Encoding: gzip on bytes that are not gzip
        reason = " ".join(str(exc).split()).removeprefix("400, message:").strip()
        raise BadRequestError(f"the {what} cannot be read as sent: {reason or 'broken body'}") from None
    return b"".join(chunks)


async def submission(request: web.Request) -> web.Response:
    """A ResourceSync change notification: authenticate, bound, validate, append, queue fan-out: 200."""
    app = request.app
    settings = app[SETTINGS]
    links = check_submission_links(request.headers.getall("Link", []), settings.hub_url)
    app[PUBLISHERS].authorize(request, [links.topic])
    await check_publish_rate(request)
    body = await read_body(request, settings.max_body)
    await validate_notification(body, app[CLOCK](), settings.future_skew)
    given_key = idempotency_key(request)
    # without a key of its own the publish gets one for this request (store.append_notification_once
    # draws it): the hub's own retries of the append then never store it twice either. A given key
    # is scoped to the publisher's credential (the topic scopes it in the store): another
    # publisher's same key is another key. The appends of concurrent publishes share a pipeline
    # (app[BATCH]): each is still its own script, answered before its 200.
    appended = await store.append_notification_once(
        app[REDIS], links.topic, body, content_type=request.headers["Content-Type"],
        resourcesync=links.resourcesync, now=app[CLOCK](), max_len=settings.log_max_len,
        publish_key=f"{publisher_scope(request)} {given_key}" if given_key else None,
        key_ttl=settings.log_max_age if given_key else own_key_ttl(settings), fan_out_flag_ttl=enqueue.QUEUED_TTL,
        retry_for=settings.redis_timeout, batch=app[BATCH])
    # the append set the topic's "fan-out queued" flag in its own round trip (ensure_fan_out's
    # first step); only when it was not set already is there a job to queue
    if appended.is_fan_out_flagged:
        await enqueue.queue_flagged_fan_out(app[QUEUE], appended.topic_id)
    await wait_for_replicas(app)    # 200 only once --min-replicas replicas hold it (503 otherwise)
    if log.isEnabledFor(logging.INFO):     # its arguments cost as much as the line: none below INFO
        log.info("notification %s %s for %s (seq %s, %d bytes)", appended.notification_id,
                 "repeated (same Idempotency-Key), stored once" if appended.is_repeat else "stored",
                 escape(links.topic), appended.sequence, len(body))
    # json.dumps({"notification_id": ..., "topic": ..., "sequence": ...}) as it writes it (json_string:
    # its encoder of a str), without its set-up, which cost more than the rest of the answer
    answer = (f'{{"notification_id": {json_string(appended.notification_id)}, "topic": {json_string(links.topic)}, '
              f'"sequence": {int(appended.sequence)}}}')
    headers = {NOTIFICATION_ID_HEADER: appended.notification_id}
    if appended.is_repeat:
        headers[REPLAYED_HEADER] = "true"
    return web.Response(status=200, text=answer, content_type="application/json", headers=headers)


def own_key_ttl(settings: HubSettings) -> int:
    """Seconds the hub's own key for a publish is kept: past the last retry of its append, which
    starts within --redis-timeout and takes at most --redis-timeout."""
    return max(OWN_KEY_TTL, math.ceil(3 * settings.redis_timeout))


def publisher_scope(request: web.Request) -> str:
    """Whose Idempotency-Keys a submission shares: its publisher token's (a digest), or, on a hub
    without tokens, the one scope of this machine's own clients."""
    if request.app[PUBLISHERS].is_open_to_loopback:
        return "loopback"
    return token_identifier(bearer_token(request))


def idempotency_key(request: web.Request) -> str | None:
    """The publisher's Idempotency-Key (None without one); BadRequestError for a malformed one."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY or not all(33 <= ord(c) < 127 for c in key):
        raise BadRequestError(f"{IDEMPOTENCY_HEADER} must be 1-{MAX_IDEMPOTENCY_KEY} visible ASCII characters, "
                              f"got {key[:80]!r}")
    return key


async def validate_notification(body: bytes, now: float, future_skew: float) -> None:
    """Raise BadRequestError with every problem unless `body` is a valid change notification
    dated no later than `now` (Unix time) + `future_skew` seconds."""
    if not body:
        raise BadRequestError("the body is empty; expected a ResourceSync change notification (<urlset>)")
    # most publishes are of the usual form, which one match tells valid without reading the values;
    # any other (or any problem) is read the full way, which words what is wrong
    if len(body) <= INLINE_BYTES and is_valid_usual_notification(body, utc_stamp(now + future_skew)):
        return
    try:
        notification = await parse_soon(parse_notification, body, error=NotificationParseError)
    except ValidationError as exc:
        raise BadRequestError(["the body is not a valid change notification:", *exc.problems]) from None
    except DocumentParseError as exc:
        raise BadRequestError(f"the body is not a change notification: {exc}") from None
    future = future_problems(notification.changes, notification.until_time, datetime.fromtimestamp(now, UTC),
                             future_skew)
    if future:
        raise BadRequestError(["the notification is dated in the future (see --future-skew):", *future])


# --- thin ping ----------------------------------------------------------------------------


async def thin_ping(request: web.Request, form: MultiDictProxy[str]) -> web.Response:
    """hub.mode=publish with one or more hub.url / hub.topic: queue a fetch of each: 202."""
    topics: list[str] = []
    problems = Problems()
    for name in ("hub.url", "hub.topic"):
        for value in form.getall(name, []):
            url = problems.check(check_url, name, value)
            if url is not None and url not in topics:
                topics.append(url)
    if not topics and not problems:
        problems.add("hub.mode=publish needs at least one hub.url or hub.topic, got none")
    if len(topics) > MAX_PING_TOPICS:
        problems.add(f"a ping may name at most {MAX_PING_TOPICS} topics, got {len(topics)}")
    problems.raise_if_any(BadRequestError)
    allowed = request.app[SETTINGS].allowed_networks
    refused = [f"{topic} cannot be fetched from this hub: {why}" for topic in topics
               if (why := literal_refusal(topic, allowed))]
    if refused:
        raise BadRequestError(refused)
    request.app[PUBLISHERS].authorize(request, topics)
    await check_publish_rate(request)
    for topic in topics:
        await enqueue.enqueue_fetch(request.app[QUEUE], topic)
    log.info("thin ping for %s: fetch queued", escape(", ".join(topics)))
    return web.Response(status=202, text=f"publish accepted; fetching {len(topics)} topic(s)\n")


async def check_publish_rate(request: web.Request) -> None:
    """Count a submission or thin ping against its token's rate (the client's, without tokens)."""
    app = request.app
    client = client_of(request)
    if app[LIMITS].publish is None or client.is_local:
        return      # RateLimits.check counts nothing for them: no key to compute either
    if app[PUBLISHERS].is_open_to_loopback:
        identifier = client_identifier(client.address, app[SETTINGS].rate_ipv6_prefix)
    else:
        identifier = token_identifier(bearer_token(request))
    await app[LIMITS].check(app[LIMITS].publish, client, identifier)

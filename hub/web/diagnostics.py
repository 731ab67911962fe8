"""Subscriber diagnostics: a subscriber reads its own subscription's status and recent delivery
attempts without admin rights, once it proves it holds the callback, in one of two ways.

1. A signed request (subscriptions with a secret): `GET /diagnostics/{sid}` with
   `X-RSNotify-Timestamp: <epoch seconds>` and
   `X-Hub-Signature: sha256=<hex HMAC of "{sid}\\n{timestamp}" keyed with the subscription's secret>`
   (any algorithm X-Hub-Signature allows); the timestamp must be within SIGNATURE_WINDOW of the
   hub's clock. sid = first 32 hex digits of sha256(topic + "\\n" + callback).
2. A link sent to the callback (any subscription): `POST /diagnostics` with the form fields
   hub.topic and hub.callback. The hub always answers 202 (it does not say whether the
   subscription exists); when it does and no link went to that callback within LINK_INTERVAL,
   the hub GETs the callback with hub.mode=diagnostics, hub.topic and
   hub.diagnostics=<hub URL>diagnostics/{sid}?token=<token>. The token works for TOKEN_TTL,
   in the query or as `Authorization: Bearer <token>`. Only verified callbacks are contacted,
   through the same outbound guard as deliveries, so this cannot aim the hub at other URLs.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from rsnotify.errors import Problems
from rsnotify.outbound import Limits, OutboundClient
from rsnotify.websub import SIGNATURE_HEADER, check_url, verify_signature

from .. import keys, store
from ..callbacks import callback_url
from ..crypto import decrypt_secret
from ..errors import AuthenticationError, BadRequestError, NotFoundError, SettingsError
from ..logs import redact_callback, redact_in
from ..netguard import outbound_client
from ..records import Subscription
from . import reports
from .appkeys import CLOCK, FERNET, REDIS, SETTINGS
from .endpoint import read_form

log = logging.getLogger(__name__)

TIMESTAMP_HEADER = "X-RSNotify-Timestamp"
MAX_TIMESTAMP_DIGITS = 12   # epoch seconds until the year 33658
SIGNATURE_WINDOW = 300      # s a signed request's timestamp may differ from the hub's clock
TOKEN_TTL = 86_400          # s a diagnostics token works
LINK_INTERVAL = 60          # s between two links sent to one callback
CONNECTIONS = 20            # the links' sends at once (one per subscription a minute at most)
ANSWER_READ = 1024          # bytes of a callback's answer read: only its status is logged
ATTEMPTS_SHOWN = 20
TOKEN_BYTES = 32



@dataclass
class Outbound:
    """The web process's guarded client for diagnostics links, and the sends in flight."""

    client: OutboundClient
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


OUTBOUND = web.AppKey("diagnostics_outbound", Outbound)


def signing_text(sid: str, timestamp: str) -> bytes:
    """What a subscriber signs to read its diagnostics: "{sid}\\n{timestamp}"."""
    return f"{sid}\n{timestamp}".encode()


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- reading one's own subscription ---------------------------------------------------------


async def get_diagnostics(request: web.Request) -> web.Response:
    """GET /diagnostics/{sid}: the subscription's status, for whoever proves it holds the callback."""
    app = request.app
    sid = request.match_info["sid"]
    if not (len(sid) == 32 and all(c in "0123456789abcdef" for c in sid)):
        raise BadRequestError(f"a subscription id is 32 lower-case hex digits, got {sid!r}")
    await check_holder(request, sid)
    now = float(app[CLOCK]())
    detail = await reports.subscription_detail(app[REDIS], sid, now)
    if detail is None:
        raise NotFoundError(f"no subscription {sid} on this hub (it ended, or never was)")
    detail["attempts_recent"] = detail["attempts_recent"][:ATTEMPTS_SHOWN]
    log.info("diagnostics of subscription %s read by its subscriber", sid, extra={"sid": sid})
    return web.json_response(detail)


async def check_holder(request: web.Request, sid: str) -> None:
    """Raise AuthenticationError unless the request carries a valid token or signature for `sid`."""
    app = request.app
    scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
    token = request.query.get("token") or (bearer.strip() if scheme.lower() == "bearer" else "")
    if token:
        stored = await store.diagnostics_token_digest(app[REDIS], sid)
        if stored is None or not hmac.compare_digest(stored, token_digest(token)):
            raise AuthenticationError("the diagnostics token is not valid for this subscription (tokens work "
                                      f"for {TOKEN_TTL // 3600} h; ask for a new link with POST /diagnostics)")
        return
    timestamp, signature = request.headers.get(TIMESTAMP_HEADER), request.headers.get(SIGNATURE_HEADER)
    if not (timestamp and signature):
        raise AuthenticationError(
            f"prove you hold the callback: sign \"{{sid}}\\n{{timestamp}}\" with the subscription's secret "
            f"({SIGNATURE_HEADER} and {TIMESTAMP_HEADER} headers), or use the token of a link from "
            "POST /diagnostics (hub.topic, hub.callback); got neither")
    # ASCII digits of a sane length only: int() takes "١٢٣" and "1_000", and a 400-digit number
    # overflows the float subtraction (a 500)
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= MAX_TIMESTAMP_DIGITS):
        shown = timestamp if len(timestamp) <= 40 else f"{timestamp[:40]}… ({len(timestamp)} characters)"
        raise AuthenticationError(f"{TIMESTAMP_HEADER} must be epoch seconds, got {shown!r}")
    age = abs(float(app[CLOCK]()) - int(timestamp))
    if age > SIGNATURE_WINDOW:
        raise AuthenticationError(f"{TIMESTAMP_HEADER} must be within {SIGNATURE_WINDOW} s of the hub's clock, "
                                  f"got one {int(age)} s away")
    stored_secret = await store.subscription_secret(app[REDIS], sid)
    try:
        secret = decrypt_secret(app[FERNET], stored_secret) if stored_secret else None
    except SettingsError:
        secret = None
    if not secret or not verify_signature(signing_text(sid, timestamp), secret, signature):
        raise AuthenticationError(f"the {SIGNATURE_HEADER} is not a valid signature of \"{{sid}}\\n{{timestamp}}\" "
                                  "with this subscription's secret (a subscription without a secret uses "
                                  "a link from POST /diagnostics instead)")


# --- sending a link to the callback ---------------------------------------------------------


async def request_link(request: web.Request) -> web.Response:
    """POST /diagnostics (hub.topic, hub.callback): send a diagnostics link to that callback; 202."""
    form = await read_form(request)
    problems = Problems()
    values = {name: problems.check(check_url, name, form.get(name)) or "" for name in ("hub.topic", "hub.callback")}
    problems.raise_if_any(BadRequestError)
    app = request.app
    sid = keys.subscription_id(values["hub.topic"], values["hub.callback"])
    subscription = await store.get_subscription(app[REDIS], sid)
    if subscription is not None and await store.mark_diagnostics_link_sent(app[REDIS], sid, LINK_INTERVAL):
        token = secrets.token_urlsafe(TOKEN_BYTES)
        await store.keep_diagnostics_token(app[REDIS], sid, token_digest(token), TOKEN_TTL)
        link = f"{app[SETTINGS].hub_url}diagnostics/{sid}?token={token}"
        task = asyncio.get_running_loop().create_task(send_link(app, subscription, link))
        app[OUTBOUND].tasks.add(task)
        task.add_done_callback(app[OUTBOUND].tasks.discard)
    return web.Response(status=202, text="if that subscription exists, its callback gets a GET with "
                                         "hub.mode=diagnostics and a hub.diagnostics link within a few seconds "
                                         f"(at most one per {LINK_INTERVAL} s)\n")


async def send_link(app: web.Application, subscription: Subscription, link: str) -> None:
    """GET the callback with the link (its answer is ignored); bounded in time, never redirected."""
    settings = app[SETTINGS]
    url = callback_url(subscription.callback, {"hub.mode": "diagnostics", "hub.topic": subscription.topic,
                                               "hub.diagnostics": link})
    limits = Limits(connect_timeout=settings.connect_timeout, total_timeout=settings.fetch_timeout,
                    max_body=ANSWER_READ)
    answer = await app[OUTBOUND].client.request("GET", url, {}, b"", limits)
    if answer.status is not None:
        log.info("diagnostics link sent to %s for subscription %s: callback answered %s",
                 redact_callback(subscription.callback), subscription.sid, answer.status,
                 extra={"sid": subscription.sid})
    else:
        why = answer.error if answer.is_refused else f"callback unreachable: {answer.error}"
        log.warning("diagnostics link for subscription %s not delivered to %s: %s", subscription.sid,
                    redact_callback(subscription.callback), redact_in(why, subscription.callback),
                    extra={"sid": subscription.sid})


async def _outbound(app: web.Application) -> AsyncIterator[None]:
    outbound = app[OUTBOUND] = Outbound(outbound_client(app[SETTINGS], limit=CONNECTIONS, max_idle=0))
    try:
        yield
    finally:
        pending = set(outbound.tasks)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
        await outbound.client.close()


def add_routes(app: web.Application) -> None:
    app.cleanup_ctx.append(_outbound)
    app.router.add_post("/diagnostics", request_link)
    app.router.add_get("/diagnostics/{sid}", get_diagnostics)

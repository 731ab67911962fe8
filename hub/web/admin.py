"""The admin JSON API under /admin/: inspect topics, subscriptions and dead letters; re-send dead
letters; pause, resume or remove a subscription (the subscriber is told with hub.mode=denied).

Every route needs `Authorization: Bearer <admin token>` (--admin-token); a hub without one
answers only loopback clients that did not come through a proxy. Refusals are HubErrors.
"""
from __future__ import annotations

import logging
import re
import secrets

from aiohttp import web

from .. import enqueue, keys, records, store
from ..errors import BadRequestError, NotFoundError
from ..logs import escape, redact_callback
from ..store import history
from . import reports
from .appkeys import CLOCK, QUEUE, REDIS, SCAN, SETTINGS
from .auth import Handler, check_admin
from .guards import raw_body_headers
from .replication import replication_report

log = logging.getLogger(__name__)

PAGE_DEFAULT = 100
PAGE_MAX = 1000
SEARCH_MAX = 200          # characters of a ?search= text
SEARCH_TOPICS = 10_000    # topics a ?search= looks through (by id)
DEFAULT_REMOVAL_REASON = "the hub's operator removed this subscription"

# --- authorization --------------------------------------------------------------------------


def admin_only(handler: Handler) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        check_admin(request, request.app[SETTINGS])
        return await handler(request)

    guarded.__name__ = handler.__name__
    guarded.__doc__ = handler.__doc__
    return guarded


# --- helpers --------------------------------------------------------------------------------


def _shown(raw: str) -> str:
    """A query value quoted in a refusal, cut to 40 characters (a 5,000-digit one is not echoed whole)."""
    return repr(raw) if len(raw) <= 40 else f"{raw[:40]!r}… ({len(raw)} characters)"


def _page(request: web.Request) -> tuple[int, int]:
    """(offset, limit) from the query; BadRequestError naming each bad value."""
    problems, values = [], {}
    for name, default, top in (("offset", 0, None), ("limit", PAGE_DEFAULT, PAGE_MAX)):
        raw = request.query.get(name, str(default))
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value < 0 or (top is not None and not 1 <= value <= top):
            bounds = f"1-{top}" if top else "0 or more"
            problems.append(f"{name} must be an integer {bounds}, got {_shown(raw)}")
        values[name] = value
    if problems:
        raise BadRequestError(problems)
    return values["offset"], values["limit"]


def _id(request: web.Request, name: str) -> str:
    value = request.match_info[name]
    if not (len(value) == 32 and all(c in "0123456789abcdef" for c in value)):
        kind = "subscription" if name == "sid" else "topic"
        raise BadRequestError(f"a {kind} id is 32 lower-case hex digits, got {value!r}")
    return value


# A Redis stream entry id: two unsigned 64-bit numbers in ASCII digits. int() alone takes more
# ("+5", " 5", "1_0", other scripts' digits, any size), which Redis then refused as a storage error (503).
_ENTRY_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")


def _nid(request: web.Request) -> str:
    value = request.match_info["nid"]
    found = _ENTRY_ID.fullmatch(value)
    if found is None or any(int(part) >= 1 << 64 for part in found.groups("0")):
        raise BadRequestError(f"a notification id looks like 1700000000000-0, got {_shown(value)}")
    return value


async def _require_subscription(request: web.Request, sid: str) -> records.Subscription:
    found = await store.get_subscription(request.app[REDIS], sid)
    if found is None:
        raise NotFoundError(f"no subscription {sid} on this hub")
    return found


def _search(request: web.Request) -> str:
    """?search=: lower-cased, at most SEARCH_MAX characters ("" when absent)."""
    value = request.query.get("search", "").strip().lower()
    if len(value) > SEARCH_MAX:
        raise BadRequestError(f"search must be at most {SEARCH_MAX} characters, got {len(value)}")
    return value


def _now(request: web.Request) -> float:
    return float(request.app[CLOCK]())


# --- reading --------------------------------------------------------------------------------


@admin_only
async def api_index(request: web.Request) -> web.Response:
    """GET /admin/: what this API offers."""
    return web.json_response({"endpoints": [
        "GET /admin/overview", "GET /admin/history?minutes=", "GET /admin/topics?offset=&limit=&url=&search=", "GET /admin/topics/{tid}",
        "GET /admin/topics/{tid}/notifications/{nid}",
        "GET /admin/subscriptions?offset=&limit=&topic=&callback=&state=&trouble=1&search=",
        "GET /admin/subscriptions/{sid}", "GET /admin/subscriptions/{sid}/attempts",
        "GET /admin/subscriptions/{sid}/dead-letters", "GET /admin/subscriptions/{sid}/dead-letters/{nid}",
        "POST /admin/subscriptions/{sid}/dead-letters/resend",
        "POST /admin/subscriptions/{sid}/dead-letters/{nid}/resend",
        "POST /admin/subscriptions/{sid}/pause", "POST /admin/subscriptions/{sid}/resume",
        "POST /admin/subscriptions/{sid}/retry",
        "DELETE /admin/subscriptions/{sid}?reason=",
    ]})


@admin_only
async def get_overview(request: web.Request) -> web.Response:
    """GET /admin/overview: totals, activity, latency, queues, busiest topics, subscriptions in trouble."""
    app = request.app
    body = await reports.overview(app[REDIS], app[SETTINGS], _now(request), app[SCAN])
    body["replication"] = await replication_report(app)   # the status page's Redis section
    return web.json_response(body)


@admin_only
async def get_history(request: web.Request) -> web.Response:
    """GET /admin/history?minutes=: deliveries, failures and average publish→delivery latency per
    minute, oldest first, up to the current minute (at most HISTORY_MINUTES)."""
    raw = request.query.get("minutes", str(history.HISTORY_MINUTES))
    # ASCII and short first: int() refuses numbers past 4,300 digits with a ValueError (a 500)
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not 1 <= int(raw) <= history.HISTORY_MINUTES:
        raise BadRequestError(f"minutes must be an integer 1-{history.HISTORY_MINUTES}, got {_shown(raw)}")
    rows = await history.delivery_history(request.app[REDIS], _now(request), int(raw))
    return web.json_response({"history": rows})


@admin_only
async def list_topics(request: web.Request) -> web.Response:
    """GET /admin/topics: topics by id (or the one with ?url=, or those whose URL holds ?search=)."""
    redis = request.app[REDIS]
    offset, limit = _page(request)
    search = _search(request)
    if "url" in request.query:
        rows = await reports.topic_rows(redis, [keys.topic_id(request.query["url"])])
        return web.json_response({"total": len(rows), "offset": offset, "topics": rows[offset:offset + limit]})
    elif search:
        rows = await reports.topic_rows(redis, (await store.topic_ids(redis))[:SEARCH_TOPICS])
        found = [row for row in rows if search in row["url"].lower()]
        return web.json_response({"total": len(found), "offset": offset, "topics": found[offset:offset + limit]})
    else:
        everything = await store.topic_ids(redis)
        tids, total = everything[offset:offset + limit], len(everything)
    return web.json_response({"total": total, "offset": offset, "topics": await reports.topic_rows(redis, tids)})


@admin_only
async def get_topic(request: web.Request) -> web.Response:
    """GET /admin/topics/{tid}: the topic, its subscriptions and recent notifications."""
    tid = _id(request, "tid")
    app = request.app
    detail = await reports.topic_detail(app[REDIS], tid, _now(request), app[SETTINGS].dormant_after, app[SCAN].facts)
    if detail is None:
        raise NotFoundError(f"no topic {tid} on this hub")
    return web.json_response(detail)


@admin_only
async def get_notification(request: web.Request) -> web.Response:
    """GET /admin/topics/{tid}/notifications/{nid}: the exact body, with its Content-Type."""
    tid, nid = _id(request, "tid"), _nid(request)
    entry = await store.get_notification(request.app[REDIS], tid, nid)
    if entry is None:
        raise NotFoundError(f"no notification {nid} in the log of topic {tid} (never there, or trimmed)")
    return web.Response(body=entry.body, headers=raw_body_headers(entry.content_type, f"notification-{nid}.xml"))


@admin_only
async def list_subscriptions(request: web.Request) -> web.Response:
    """GET /admin/subscriptions: by lease end; ?topic= (with ?callback= one), ?state=, ?trouble=1,
    ?search= (text in the topic or callback URL, or the start of the id)."""
    redis, now, query = request.app[REDIS], _now(request), request.query
    offset, limit = _page(request)
    search = _search(request)
    state = query.get("state")
    if state not in (None, "active", "paused", "expired"):
        raise BadRequestError(f"state must be active, paused or expired, got {state!r}")
    if "topic" in query and "callback" in query:
        chosen = await reports.summarize(redis, [keys.subscription_id(query["topic"], query["callback"])])
    elif "topic" in query:
        sids = await store.topic_subscription_ids(redis, keys.topic_id(query["topic"]))
        chosen = await reports.summarize(redis, sids)
    elif state or query.get("trouble") or search:
        chosen = await request.app[SCAN].get(redis)
    else:
        total = await store.count_subscriptions(redis)
        sids = await store.subscription_ids_by_lease(redis, offset, limit)
        rows = await reports.summarize(redis, sids)
        return web.json_response({"total": total, "offset": offset,
                                  "subscriptions": [s.to_json(now) for s in rows]})
    if state:
        chosen = [s for s in chosen if (s.expires < now) == (state == "expired")
                  and (state == "expired" or s.state == state)]
    if query.get("trouble") not in (None, "", "0"):
        chosen = [s for s in chosen if s.trouble(now)]
    if search:
        chosen = [s for s in chosen if s.matches(search)]
    page = chosen[offset:offset + limit]
    return web.json_response({"total": len(chosen), "offset": offset, "subscriptions": [s.to_json(now) for s in page]})


@admin_only
async def get_subscription(request: web.Request) -> web.Response:
    """GET /admin/subscriptions/{sid}: everything about it (never its secret)."""
    sid = _id(request, "sid")
    detail = await reports.subscription_detail(request.app[REDIS], sid, _now(request), request.app[SETTINGS].dormant_after)
    if detail is None:
        raise NotFoundError(f"no subscription {sid} on this hub")
    # what rsnotify.replay_from may still re-send to it: --replay-max less what it already had
    limit = request.app[SETTINGS].replay_max
    detail["replay_max"] = limit
    detail["replay_left"] = None if limit < 0 else max(0, limit - detail["replayed"])
    return web.json_response(detail)


@admin_only
async def get_attempts(request: web.Request) -> web.Response:
    """GET /admin/subscriptions/{sid}/attempts: the last delivery attempts, newest first."""
    sid = _id(request, "sid")
    await _require_subscription(request, sid)
    attempts = await store.recent_attempts(request.app[REDIS], sid)
    return web.json_response({"attempts": [
        {"at": a.at, "notification_id": a.notification_id, "sequence": a.sequence, "status": a.status,
         "error": a.error, "latency_ms": a.latency_ms, "outcome": a.outcome, "attempt": a.attempt}
        for a in attempts]})


@admin_only
async def get_dead_letters(request: web.Request) -> web.Response:
    """GET /admin/subscriptions/{sid}/dead-letters: oldest first."""
    sid = _id(request, "sid")
    await _require_subscription(request, sid)
    letters = await store.list_dead_letters(request.app[REDIS], sid)
    return web.json_response({"dead_letters": [
        {"notification_id": d.notification_id, "sequence": d.sequence, "published_ms": d.published_ms,
         "content_type": d.content_type, "attempts": d.attempts, "status": d.status, "error": d.error,
         "dead_at": d.dead_at, "resend": d.resend} for d in letters]})


@admin_only
async def get_dead_letter(request: web.Request) -> web.Response:
    """GET /admin/subscriptions/{sid}/dead-letters/{nid}: the exact body that was not delivered."""
    sid, nid = _id(request, "sid"), _nid(request)
    redis = request.app[REDIS]
    letter = await store.get_dead_letter(redis, sid, nid)
    body = await store.dead_letter_body(redis, sid, nid)
    if letter is None or body is None:
        raise NotFoundError(f"no dead letter {nid} for subscription {sid}")
    return web.Response(body=body, headers=raw_body_headers(letter.content_type, f"dead-letter-{nid}.xml"))


# --- acting ---------------------------------------------------------------------------------


@admin_only
async def resend_all(request: web.Request) -> web.Response:
    """POST /admin/subscriptions/{sid}/dead-letters/resend: queue every dead letter again, oldest first."""
    sid = _id(request, "sid")
    found = await _require_subscription(request, sid)
    queued = await store.resend_all_dead_letters(request.app[REDIS], sid, now=_now(request))
    request.app[SCAN].forget()
    log.info("admin: %d dead letter(s) of subscription %s (%s) queued for re-sending", queued, sid,
             redact_callback(found.callback),
             extra={"action": "resend", "sid": sid})
    return web.json_response({"sid": sid, "queued": queued})


@admin_only
async def resend_one(request: web.Request) -> web.Response:
    """POST /admin/subscriptions/{sid}/dead-letters/{nid}/resend: queue one dead letter again."""
    sid, nid = _id(request, "sid"), _nid(request)
    found = await _require_subscription(request, sid)
    redis = request.app[REDIS]
    if await store.get_dead_letter(redis, sid, nid) is None:
        raise NotFoundError(f"no dead letter {nid} for subscription {sid}")
    queued = await store.resend_dead_letter(redis, sid, nid, now=_now(request))
    request.app[SCAN].forget()
    log.info("admin: dead letter %s of subscription %s (%s) %s", escape(nid), sid, redact_callback(found.callback),
             "queued for re-sending" if queued else "was already queued", extra={"action": "resend", "sid": sid})
    return web.json_response({"sid": sid, "notification_id": nid, "queued": queued,
                              "already_queued": not queued})


async def _set_state(request: web.Request, paused: bool) -> web.Response:
    sid = _id(request, "sid")
    found = await _require_subscription(request, sid)
    redis = request.app[REDIS]
    if paused:
        changed = await store.pause_subscription(redis, sid)
    else:
        changed = await store.resume_subscription(redis, sid, now=_now(request))
    if not changed:
        raise NotFoundError(f"no subscription {sid} on this hub")
    request.app[SCAN].forget()
    state = "paused" if paused else "active"
    log.info("admin: subscription %s (%s) %s", sid, redact_callback(found.callback), "paused" if paused else "resumed",
             extra={"action": "pause" if paused else "resume", "sid": sid})
    return web.json_response({"sid": sid, "state": state})


@admin_only
async def pause(request: web.Request) -> web.Response:
    """POST /admin/subscriptions/{sid}/pause: no deliveries until resumed (the cursor stays)."""
    return await _set_state(request, paused=True)


@admin_only
async def resume(request: web.Request) -> web.Response:
    """POST /admin/subscriptions/{sid}/resume: deliveries start again now (backoff cleared)."""
    return await _set_state(request, paused=False)


@admin_only
async def retry(request: web.Request) -> web.Response:
    """POST /admin/subscriptions/{sid}/retry: its pending retry is due now, not when its backoff ends."""
    sid = _id(request, "sid")
    found = await _require_subscription(request, sid)
    now = _now(request)
    if not await store.retry_now(request.app[REDIS], sid, now=now):
        raise NotFoundError(f"no subscription {sid} on this hub")
    request.app[SCAN].forget()
    log.info("admin: subscription %s (%s) retried now", sid, redact_callback(found.callback),
             extra={"action": "retry", "sid": sid})
    return web.json_response({"sid": sid, "retry_at": now})


@admin_only
async def remove(request: web.Request) -> web.Response:
    """DELETE /admin/subscriptions/{sid}: remove it and tell the subscriber (hub.mode=denied, hub.reason)."""
    sid = _id(request, "sid")
    found = await _require_subscription(request, sid)
    reason = request.query.get("reason", "").strip() or DEFAULT_REMOVAL_REASON
    if len(reason) > 500:
        raise BadRequestError(f"reason must be at most 500 characters, got {len(reason)}")
    app = request.app
    await store.remove_subscription(app[REDIS], sid)
    challenge = secrets.token_urlsafe(32)
    await store.store_intent(app[REDIS], challenge, records.Intent("denied", found.topic, found.callback, reason=reason),
                             app[SETTINGS].intent_ttl)
    await enqueue.enqueue_verification(app[QUEUE], challenge)
    app[SCAN].forget()
    log.info("admin: subscription %s removed (%s for %s); denial queued: %s", sid, redact_callback(found.callback),
             escape(found.topic), escape(reason), extra={"action": "remove", "sid": sid})
    return web.json_response({"sid": sid, "removed": True, "denial": "queued", "reason": reason})


def add_routes(app: web.Application) -> None:
    """Register the admin API."""
    r = app.router
    r.add_get("/admin/", api_index)
    r.add_get("/admin/overview", get_overview)
    r.add_get("/admin/history", get_history)
    r.add_get("/admin/topics", list_topics)
    r.add_get("/admin/topics/{tid}", get_topic)
    r.add_get("/admin/topics/{tid}/notifications/{nid}", get_notification)
    r.add_get("/admin/subscriptions", list_subscriptions)
    r.add_get("/admin/subscriptions/{sid}", get_subscription)
    r.add_delete("/admin/subscriptions/{sid}", remove)
    r.add_get("/admin/subscriptions/{sid}/attempts", get_attempts)
    r.add_get("/admin/subscriptions/{sid}/dead-letters", get_dead_letters)
    r.add_post("/admin/subscriptions/{sid}/dead-letters/resend", resend_all)
    r.add_get("/admin/subscriptions/{sid}/dead-letters/{nid}", get_dead_letter)
    r.add_post("/admin/subscriptions/{sid}/dead-letters/{nid}/resend", resend_one)
    r.add_post("/admin/subscriptions/{sid}/pause", pause)
    r.add_post("/admin/subscriptions/{sid}/resume", resume)
    r.add_post("/admin/subscriptions/{sid}/retry", retry)

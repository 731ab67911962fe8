"""Browser safety for every request: who the client is, a Host check against DNS rebinding,
no state change from another site's page, admin actions only as non-simple requests, and
the security headers of every response.

A browser attaches no bearer token by itself, so a request carrying a credential this hub
accepts for its route (auth.carries_accepted_credential) is never a forged one; every other
request, whatever headers it carries, goes through the checks below, which guard what a page
on another site could make a visitor's browser send to a hub on their machine or network.
"""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from aiohttp import web

from ..errors import BadRequestError, ForbiddenError, MisdirectedRequestError, UnsupportedMediaError
from ..settings import HubSettings
from .appkeys import HOSTS, PUBLISHERS, SETTINGS
from .auth import CLIENT, carries_accepted_credential
from .clients import identify

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# Read without any credential, and named by service names (Prometheus scrapes hub:8080, probes
# use the pod's address): the Host check guards what loopback trust opens, not these.
OPEN_PATHS = frozenset({"/health", "/live", "/metrics"})
# What a cross-site <form> or a fetch without a preflight may send (the CORS "simple" types).
SIMPLE_TYPES = frozenset({"", "application/x-www-form-urlencoded", "multipart/form-data", "text/plain"})

PAGE_POLICY = ("default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; "
               "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Content-Security-Policy": PAGE_POLICY,
}
# A stored body (as a publisher sent it) must never run as a page of the hub's origin.
RAW_BODY_POLICY = "sandbox; default-src 'none'"


def raw_body_headers(content_type: str, filename: str) -> dict[str, str]:
    """Headers that serve a stored body as an inert download."""
    return {"Content-Type": content_type or "application/octet-stream",
            "Content-Disposition": f'attachment; filename="{filename}"',
            "Content-Security-Policy": RAW_BODY_POLICY}


def allowed_hosts(settings: HubSettings) -> frozenset[str]:
    """Host names a request may name: the public URL's, the listening address's, and localhost's
    (build_app keeps them as app[HOSTS]: computed once per process, not per request)."""
    names = set(LOCAL_NAMES)
    names.add((urlsplit(settings.hub_url).hostname or "").lower())
    if settings.host not in ("0.0.0.0", "::", ""):
        names.add(settings.host.strip("[]").lower())
    return frozenset(names)


def _host_name(value: str) -> str:
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.partition(":")[0]


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_host(request: web.Request, hosts: frozenset[str], *, is_credentialed: bool = False) -> None:
    """421 unless the Host header names this hub, localhost or an IP address: a DNS name an
    attacker rebound to this hub's address does not."""
    host = request.headers.get("Host")
    if host is None or request.path in OPEN_PATHS or is_credentialed:
        return
    name = _host_name(host)
    if name not in hosts and not _is_ip_literal(name):  # an address cannot be rebound; a name can
        raise MisdirectedRequestError(f"this hub answers to {', '.join(sorted(hosts))}, got Host: {host[:200]!r} "
                                      "(set --public-url to the name clients use)")


def check_same_site(request: web.Request, *, is_credentialed: bool = False) -> None:
    """403 for a state-changing request a page of another site made a browser send."""
    if request.method in SAFE_METHODS or is_credentialed:
        return
    fetch_site = request.headers.get("Sec-Fetch-Site", "").lower()
    if fetch_site in ("cross-site", "same-site"):
        raise ForbiddenError(f"a {fetch_site} request from a browser may not change anything here "
                             f"(Sec-Fetch-Site: {fetch_site})")
    origin = request.headers.get("Origin")
    if origin is None:
        return
    parts = urlsplit(origin)
    if origin == "null" or parts.netloc.lower() != request.headers.get("Host", "").lower():
        raise ForbiddenError(f"a cross-site request from a browser may not change anything here "
                             f"(Origin: {origin[:200]!r})")


def check_admin_action(request: web.Request, *, is_credentialed: bool = False) -> None:
    """403 for an admin action sent as a simple request (one a cross-site form could send)."""
    if request.method in SAFE_METHODS or not request.path.startswith("/admin/"):
        return
    if is_credentialed or request.method != "POST":
        return  # DELETE and friends are preflighted by browsers
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if content_type in SIMPLE_TYPES:
        raise ForbiddenError("admin actions must be sent with 'Content-Type: application/json' or the admin "
                             f"token, got {f'Content-Type {content_type!r}' if content_type else 'no Content-Type'}")


# Header fields that mean one thing: given twice, which one counts would depend on the reader (a
# proxy in front of the hub may read the other one), as with a form's repeated fields.
# Content-Type, Content-Length and Host twice aiohttp's parser refuses itself.
SINGLE_HEADERS = ("Content-Encoding", "Idempotency-Key", "Authorization", "Origin", "Sec-Fetch-Site",
                  "X-Hub-Signature", "X-RSNotify-Timestamp")
# The content codings aiohttp's parser decodes (br and zstd when their libraries are installed;
# without them the parser refuses the request itself): any other it passes on still coded.
DECODED_CODINGS = frozenset({"identity", "gzip", "deflate", "br", "zstd"})


def check_fields(request: web.Request) -> None:
    """400 for a single-valued header field (or a Content-Type parameter) given more than once,
    or a transfer coding other than chunked; 415 for a body in a content coding the hub does not
    decode (it would be read, and stored, as it came)."""
    headers = request.headers
    for name in SINGLE_HEADERS:
        values = headers.getall(name, ())
        if len(values) > 1:
            raise BadRequestError(f"the {name} header is given {len(values)} times; send it once")
    content_type = headers.get("Content-Type", "")
    if ";" in content_type:
        names = [part.partition("=")[0].strip().lower() for part in content_type.split(";")[1:]]
        repeated = sorted({name for name in names if name and names.count(name) > 1})
        if repeated:    # "charset=utf-8; charset=latin1": the hub and a subscriber could read different ones
            raise BadRequestError(f"the Content-Type parameter {repeated[0]} is given {names.count(repeated[0])} "
                                  "times; send it once")
    transfer = headers.get("Transfer-Encoding")
    if transfer is not None and transfer.strip().lower() != "chunked":
        # aiohttp's parser reads "gzip, chunked" as chunked and leaves the gzip on: the body
        # would be read (and refused, or stored) still compressed
        raise BadRequestError(f"Transfer-Encoding {transfer[:80]!r} is not supported: send the body chunked or with "
                              "a Content-Length (compressed: with Content-Encoding gzip or deflate)")
    coding = headers.get("Content-Encoding")
    if coding is not None and request.method not in SAFE_METHODS and coding.strip().lower() not in DECODED_CODINGS:
        raise UnsupportedMediaError(f"Content-Encoding {coding[:80]!r} is not supported: send the body as it is "
                                    "(identity) or in one of gzip, deflate")


def check_request(request: web.Request) -> None:
    """Every request's guards, before its handler (the app's one middleware calls it): the
    header fields, who the client is (kept as request[CLIENT]), then the Host, same-site and
    admin-action checks."""
    check_fields(request)
    settings = request.app[SETTINGS]
    request[CLIENT] = identify(request, settings.trusted_proxy_networks)
    credentialed = carries_accepted_credential(request, settings, request.app[PUBLISHERS])
    check_host(request, request.app[HOSTS], is_credentialed=credentialed)
    check_same_site(request, is_credentialed=credentialed)
    check_admin_action(request, is_credentialed=credentialed)


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every answer (errors included) carries the security headers;
    a handler's own Content-Security-Policy (raw bodies) wins."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)

"""Who may do what on the web side: publishers (bearer tokens and their topic prefixes, or
loopback clients when the hub has no tokens) and operators (the admin token, or loopback)."""
from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from rsnotify.websub import normalize_url

from ..errors import AuthenticationError, ForbiddenError
from ..settings import HubSettings

PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")  # a local proxy relays remote clients

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(remote: str | None) -> bool:
    """Is the peer address a loopback address (IPv4-mapped IPv6 judged as IPv4)?"""
    try:
        ip = ipaddress.ip_address((remote or "").split("%", 1)[0])
    except ValueError:
        return False  # a Unix socket peer has no address: not trusted
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


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
            if not is_loopback(request.remote):
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


def check_admin(request: web.Request, settings: HubSettings) -> None:
    """Raise AuthenticationError (401) or ForbiddenError (403) unless `request` may use the admin API."""
    token = settings.admin_token
    if not token:
        proxied = [h for h in PROXY_HEADERS if h in request.headers]
        if not is_loopback(request.remote) or proxied:
            seen = f"a request through a proxy ({proxied[0]})" if proxied else f"a request from {request.remote}"
            raise ForbiddenError(f"this hub has no admin token (--admin-token / RSNOTIFY_ADMIN_TOKEN), so only "
                                 f"loopback clients not behind a proxy may use it, got {seen}")
        return
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise AuthenticationError("the admin API needs 'Authorization: Bearer <admin token>', got none")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise AuthenticationError("the bearer token is not this hub's admin token")

"""Who may do what on the web side: publishers (bearer tokens and their topic prefixes, or
this machine's own clients when the hub has no tokens) and operators (the admin token, or
this machine's own clients); `clients.identify` decides what "this machine's own" means."""
from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from rsnotify.websub import normalize_url

from ..errors import AuthenticationError, ForbiddenError
from ..settings import HubSettings
from .clients import Client, identify

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


CLIENT = web.RequestKey("client", Client)  # the Client that web.guards judged with --trusted-proxy


def client_of(request: web.Request) -> Client:
    """The request's client as the guards middleware judged it (no trusted proxies without it)."""
    client = request.get(CLIENT)
    if client is None:
        client = request[CLIENT] = identify(request, ())
    return client


def _not_local(client: Client) -> str:
    if client.relayed_by:
        return f"a request through a proxy ({client.relayed_by}; see --trusted-proxy) from {client.address}"
    return f"a request from {client.address}"


def is_under(topic: str, prefix: str) -> bool:
    """Is normalized `topic` the normalized `prefix` itself or below it, on a path-segment
    boundary (a token for .../x covers .../x/y and .../x?q, never .../xy)?"""
    if topic == prefix or prefix.endswith("/"):
        return topic.startswith(prefix)
    return topic.startswith((prefix + "/", prefix + "?"))


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
        return not self.tokens or any(is_under(wanted, p) for _, ps in self.tokens for p in ps)

    def authorize(self, request: web.Request, topics: list[str]) -> None:
        """Raise AuthenticationError (401) or ForbiddenError (403) unless `request` may publish `topics`."""
        if self.is_open_to_loopback:
            client = client_of(request)
            if not client.is_local:
                raise ForbiddenError("only loopback clients may publish to a hub without publisher tokens "
                                     f"(configure --publish-token), got {_not_local(client)}")
            return
        prefixes = self.token_prefixes(request)
        outside = [t for t in topics if not any(is_under(normalize_url(t), p) for p in prefixes)]
        if outside:
            raise ForbiddenError([f"this token may not publish to {t}; it may publish under "
                                  f"{', '.join(prefixes)}" for t in outside])

    def token_prefixes(self, request: web.Request) -> tuple[str, ...]:
        """The prefixes of the request's bearer token; AuthenticationError when it has none or an unknown one."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("publishing needs 'Authorization: Bearer <token>', got none")
        prefixes = self._prefixes(token.strip())
        if prefixes is None:
            raise AuthenticationError("the bearer token is not a publisher token of this hub")
        return prefixes

    def knows(self, token: str) -> bool:
        """Is `token` one of this hub's publisher tokens?"""
        return self._prefixes(token) is not None

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
        client = client_of(request)
        if not client.is_local:
            raise ForbiddenError(f"this hub has no admin token (--admin-token / RSNOTIFY_ADMIN_TOKEN), so only "
                                 f"loopback clients not behind a proxy may use it, got {_not_local(client)}")
        return
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise AuthenticationError("the admin API needs 'Authorization: Bearer <admin token>', got none")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise AuthenticationError("the bearer token is not this hub's admin token")


def bearer_token(request: web.Request) -> str:
    """The request's `Authorization: Bearer` token ("" without one)."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def carries_accepted_credential(request: web.Request, settings: HubSettings, publishers: Publishers) -> bool:
    """Does the request carry a credential this hub accepts for its route: the admin token on
    /admin/, a publisher token on a POST to the hub endpoint? Only such a request cannot have
    been forged by a page in a browser (a browser attaches no bearer token by itself); any other
    Authorization header, say on a hub without tokens, proves nothing."""
    token = bearer_token(request)
    if not token:
        return False
    if request.path.startswith("/admin/"):
        return bool(settings.admin_token) and hmac.compare_digest(token.encode(), str(settings.admin_token).encode())
    if request.method == "POST" and request.path in ("/", settings.hub_path):
        return publishers.knows(token)
    return False

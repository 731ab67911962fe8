"""Rate limits of the hub's intake, counted in the hub's Redis so every web process shares them:
subscriptions per client address and per callback host, submissions per publisher token.

What counts as one client or one host is chosen so that cheap variations don't buy a fresh
budget: an IPv6 client counts by its network (--rate-ipv6-prefix, /64 by default), and a
callback counts against its host name, its registrable domain (by the Public Suffix List, so
a.example.co.uk and b.example.co.uk are one domain, while two github.io sites are two) and
each address the name resolves to.

This machine's own clients (see clients.identify) are not limited: they are the operator's
tools, already trusted to publish and administer a hub without tokens.
"""
from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import math
import socket
import time
from dataclasses import dataclass
from functools import cache

from limits import RateLimitItem, parse
from limits.aio.storage import RedisStorage
from limits.aio.strategies import FixedWindowRateLimiter
from publicsuffixlist import PublicSuffixList
from redis.asyncio import Redis

from ..errors import TooManyRequestsError
from ..settings import HubSettings
from .clients import Client

KEY_PREFIX = "rsnotify:rate"


# `limits` builds its own client from a URI unless given a connection pool; its Sentinel scheme
# (async+redis+sentinel://) has no separate Sentinel password and reads counts from replicas, so
# the limiter gets the web process's own pool instead (hub/redis_clients.py builds every client):
# the same primary, TLS and failover handling as every other command. The URI is then unused.
POOL_URI = "async+redis://"


@dataclass(frozen=True)
class Limit:
    item: RateLimitItem
    what: str     # for messages: "subscription requests from one client address"
    setting: str  # the option that sets it


class RateLimits:
    """The configured limits on one shared storage; `check` raises TooManyRequestsError (429)."""

    def __init__(self, settings: HubSettings, redis: Redis) -> None:
        self._storage = RedisStorage(POOL_URI, implementation="redispy", key_prefix=KEY_PREFIX,
                                     connection_pool=redis.connection_pool)  # type: ignore[arg-type]  # its stub types options as scalars
        self._limiter = FixedWindowRateLimiter(self._storage)
        self.subscribe_client = _limit(settings.rate_subscribe_client, "subscription requests from one client "
                                       "address", "--rate-subscribe-client")
        self.subscribe_callback_host = _limit(settings.rate_subscribe_callback_host, "subscription requests for "
                                              "one callback host", "--rate-subscribe-callback-host")
        self.publish = _limit(settings.rate_publish_token, "submissions with one publisher token",
                              "--rate-publish-token")

    async def check(self, limit: Limit | None, client: Client, identifier: str, what: str = "") -> None:
        """Count one request against `limit` for `identifier`; 429 with Retry-After past it.
        `what` replaces the limit's own words in the message (one callback domain, say)."""
        if limit is None or client.is_local:
            return
        if await self._limiter.hit(limit.item, identifier):
            return
        stats = await self._limiter.get_window_stats(limit.item, identifier)
        retry_after = math.ceil(stats.reset_time - time.time())
        raise TooManyRequestsError(f"too many {what or limit.what}: at most {limit.item} ({limit.setting}); "
                                   f"retry in {max(1, retry_after)} s", retry_after)

    async def check_subscribe(self, client: Client, callback_host: str, *, ipv6_prefix: int,
                              resolve_timeout: float) -> None:
        """Count a subscribe/unsubscribe request against the client's limit and its callback's."""
        if client.is_local:  # nothing to count, and no name to resolve
            return
        await self.check(self.subscribe_client, client, client_identifier(client.address, ipv6_prefix))
        if self.subscribe_callback_host is None:
            return
        for identifier, what in await callback_identifiers(callback_host, ipv6_prefix, resolve_timeout):
            await self.check(self.subscribe_callback_host, client, identifier, what)


def _limit(text: str, what: str, setting: str) -> Limit | None:
    return Limit(parse(text), what, setting) if text.strip() else None


def token_identifier(token: str) -> str:
    """A token's rate-limit key: a digest, so Redis never holds the token itself."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]


def client_identifier(address: str, ipv6_prefix: int) -> str:
    """A client's rate-limit key: its IPv4 address, or its IPv6 address's /`ipv6_prefix` network
    (a subscriber line gets a whole /64 and can pick any address in it)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "client:" + address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return f"client:{ip.ipv4_mapped}"
        return f"client:{ipaddress.IPv6Network((ip, ipv6_prefix), strict=False)}"
    return f"client:{ip}"


async def callback_identifiers(host: str, ipv6_prefix: int, resolve_timeout: float) -> list[tuple[str, str]]:
    """(rate-limit key, words for the message) for each thing a callback host counts against: the
    name, its registrable domain, and each address it resolves to now (an unresolvable name
    counts by name and domain; its verification will fail anyway)."""
    host = host.lower().rstrip(".")
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None:
        return [(client_identifier(str(literal), ipv6_prefix).replace("client:", "address:", 1),
                 "subscription requests for one callback address")]
    found = [("host:" + host, "subscription requests for one callback host")]
    domain = registrable_domain(host)
    if domain and domain != host:
        found.append(("domain:" + domain, f"subscription requests for callbacks under {domain}"))
    for address in await resolve(host, resolve_timeout):
        found.append((client_identifier(address, ipv6_prefix).replace("client:", "address:", 1),
                      f"subscription requests for callbacks at {address}"))
    return list(dict.fromkeys(found))


def registrable_domain(host: str) -> str | None:
    """The registrable domain of `host` (example.co.uk for a.b.example.co.uk), by the Public
    Suffix List that publicsuffixlist bundles (no network); None for a bare public suffix."""
    domain = _suffix_list().privatesuffix(host)
    return str(domain) if domain else None


@cache
def _suffix_list() -> PublicSuffixList:
    # parsed once per process, on first use (about 10k rules); the package ships the list, so
    # nothing is fetched
    return PublicSuffixList()


async def resolve(host: str, timeout: float) -> list[str]:
    """The addresses `host` resolves to within `timeout` ([] when it does not)."""
    try:
        async with asyncio.timeout(timeout):
            infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError, UnicodeError):
        return []
    return sorted({str(info[4][0]).split("%", 1)[0] for info in infos})

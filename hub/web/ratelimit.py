"""Rate limits of the hub's intake, counted in the hub's Redis so every web process shares them:
subscriptions per client address and per callback host, submissions per publisher token.

This machine's own clients (see clients.identify) are not limited: they are the operator's
tools, already trusted to publish and administer a hub without tokens.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from limits import RateLimitItem, parse
from limits.aio.storage import RedisStorage
from limits.aio.strategies import FixedWindowRateLimiter
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

    async def check(self, limit: Limit | None, client: Client, identifier: str) -> None:
        """Count one request against `limit` for `identifier`; 429 with Retry-After past it."""
        if limit is None or client.is_local:
            return
        if await self._limiter.hit(limit.item, identifier):
            return
        stats = await self._limiter.get_window_stats(limit.item, identifier)
        retry_after = math.ceil(stats.reset_time - time.time())
        raise TooManyRequestsError(f"too many {limit.what}: at most {limit.item} ({limit.setting}); "
                                   f"retry in {max(1, retry_after)} s", retry_after)


def _limit(text: str, what: str, setting: str) -> Limit | None:
    return Limit(parse(text), what, setting) if text.strip() else None


def token_identifier(token: str) -> str:
    """A token's rate-limit key: a digest, so Redis never holds the token itself."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]

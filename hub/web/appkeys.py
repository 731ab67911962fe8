"""What build_app puts in the application, read by the handlers (one place, so no handler
module depends on another one's registration order)."""
from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from cryptography.fernet import Fernet
from redis.asyncio import Redis
from rq import Queue

from ..batch import RedisBatcher
from ..settings import HubSettings
from .auth import Publishers
from .ratelimit import RateLimits
from .reports import ScanCache

SETTINGS = web.AppKey("settings", HubSettings)
REDIS = web.AppKey("redis", Redis)                           # asyncio client, bytes replies
BATCH = web.AppKey("batch", RedisBatcher)                    # REDIS's commands of concurrent publishes, pipelined
QUEUE = web.AppKey("queue", Queue)                           # rq.Queue on its own synchronous connection
FERNET = web.AppKey("fernet", Fernet)                        # encrypts subscription secrets
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")  # () -> epoch seconds
PUBLISHERS = web.AppKey("publishers", Publishers)            # tokens and their topic prefixes
SCAN = web.AppKey("scan", ScanCache)                         # one subscription scan shared by admin, status, /metrics
LIMITS = web.AppKey("limits", RateLimits)                    # intake rate limits, counted in Redis
HOSTS: web.AppKey[frozenset[str]] = web.AppKey("hosts")      # Host names a request may name (guards.allowed_hosts)

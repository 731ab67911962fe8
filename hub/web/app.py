"""build_app(settings): the hub's aiohttp application (routes, resources, error middleware).

Redis must already be reachable at settings.redis_url (embedded mode starts it first).
"""
from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from redis.exceptions import RedisError

from .. import redis_clients
from ..batch import RedisBatcher
from ..crypto import check_key_matches, load_fernet
from ..enqueue import make_queue
from ..errors import (
    AuthenticationError,
    HubError,
    SettingsError,
    TooManyRequestsError,
    UnavailableError,
)
from ..logs import escape
from ..settings import HubSettings
from . import admin, diagnostics, endpoint, health, metrics, status
from .appkeys import (
    BATCH,
    CLOCK,
    FERNET,
    HOSTS,
    LIMITS,
    PUBLISHERS,
    QUEUE,
    REDIS,
    SCAN,
    SETTINGS,
)
from .auth import Publishers
from .guards import add_security_headers, allowed_hosts, check_request
from .ratelimit import RateLimits
from .reports import ScanCache

log = logging.getLogger(__name__)

FORM_SLACK = 64 * 1024  # a form may be a little larger than --max-body before aiohttp refuses it


def build_app(settings: HubSettings, *, now: Callable[[], float] = time.time) -> web.Application:
    """The hub application. Raises SettingsError for a missing Redis URL or a bad tokens file."""
    if not settings.redis_url:
        raise SettingsError("build_app needs settings.redis_url (embedded mode starts Redis first)")
    # one middleware (each is a call layer per request): the guards, then the handler, and every
    # refusal of either answered the same way
    app = web.Application(middlewares=[hub_middleware],
                          client_max_size=settings.max_body + FORM_SLACK)
    app.on_response_prepare.append(add_security_headers)
    app[SETTINGS] = settings
    app[CLOCK] = now
    app[PUBLISHERS] = Publishers.from_pairs(settings.all_publish_tokens())
    app[HOSTS] = allowed_hosts(settings)
    app[SCAN] = ScanCache()     # one scan of the subscriptions, shared by admin, status page and /metrics
    app.cleanup_ctx.append(_resources)
    paths = {"/", settings.hub_path}
    for path in sorted(paths):  # also serve the public URL's path, for proxies that keep it
        app.router.add_post(path, endpoint.hub_endpoint)
    for routes in (health, status, admin, diagnostics, metrics):  # GET / is the status page
        routes.add_routes(app)
    return app


async def _resources(app: web.Application) -> AsyncIterator[None]:
    """Redis clients (asyncio for handlers, synchronous for RQ), the Fernet key checked against Redis."""
    settings = app[SETTINGS]
    target = redis_clients.RedisTarget.of(settings)  # build_app made sure there is a URL
    # pools that wait for a free connection: a burst of requests queues instead of failing; each
    # command gives up after --redis-timeout, so a failover is answered 503, never a hang
    client = redis_clients.async_client(target, settings.redis_connections, command_timeout=True)
    connection = redis_clients.sync_client(target, settings.redis_connections, command_timeout=True)
    try:
        fernet = load_fernet(settings)
        await check_key_matches(client, fernet)
        app[REDIS] = client
        app[BATCH] = RedisBatcher(client)
        app[FERNET] = fernet
        app[QUEUE] = make_queue(settings.queue_name, connection)
        app[LIMITS] = RateLimits(settings, client)
        yield
    finally:
        await client.aclose()
        connection.close()


@web.middleware
async def hub_middleware(request: web.Request, handler: Callable) -> web.StreamResponse:
    """The browser-safety guards (web.guards.check_request), then the handler. HubError ->
    text/plain with its status; Redis trouble -> 503 + Retry-After; bugs -> logged 500."""
    try:
        check_request(request)
        return await handler(request)
    except HubError as exc:
        headers = {"WWW-Authenticate": 'Bearer realm="rsnotify"'} if isinstance(exc, AuthenticationError) else {}
        if isinstance(exc, (TooManyRequestsError, UnavailableError)):
            headers["Retry-After"] = str(exc.retry_after)
        log.info("%s %s refused with %s: %s", request.method, escape(request.path), exc.status,
                 escape(exc.problems[0]))
        return web.Response(status=exc.status, text=str(exc) + "\n", headers=headers)
    except web.HTTPException:
        raise
    except (RedisError, ConnectionError) as exc:
        log.error("storage unavailable for %s %s: %s", request.method, escape(request.path), exc)
        return web.Response(status=503, text="the hub's storage is unavailable right now; retry later\n",
                            headers={"Retry-After": "5"})
    except Exception:
        log.exception("internal error on %s %s", request.method, escape(request.path))
        return web.Response(status=500, text="internal error; the hub's log has the details\n")

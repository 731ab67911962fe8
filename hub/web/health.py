"""GET /health: is this hub ready (Redis answers, and a worker is seen when it runs workers)?
GET /live: is this process serving HTTP at all (it asks nothing of Redis)?"""
from __future__ import annotations

import time

from aiohttp import web
from redis.exceptions import RedisError

from .. import store
from ..errors import UnavailableError
from .appkeys import REDIS, SETTINGS
from .replication import replication_report


async def health(request: web.Request) -> web.Response:
    """200 with counts once Redis answers (and a worker is seen when this hub runs workers); else 503."""
    app = request.app
    settings = app[SETTINGS]
    queue = settings.queue_name
    try:
        counts = await store.health_counts(app[REDIS], queue)
        lanes = await store.lane_backlogs(app[REDIS], queue, settings.intent_ttl, time.time())
        replication = await replication_report(app)
    except (RedisError, OSError, UnavailableError) as exc:
        body = {"status": "unavailable", "redis": False, "error": f"{type(exc).__name__}: {exc}"}
        return web.json_response(body, status=503)
    workers = counts.workers
    ready = workers > 0 or settings.workers == 0
    behind = [name for name, lane in lanes.items() if lane.is_behind(settings.lane_lag)]
    body = {
        # "behind": a lane's oldest item waited longer than lane_lag; still 200, this process serves
        "status": ("behind" if behind else "ok") if ready else "starting",
        "redis": True,
        "workers": workers,
        "queues": {queue: {"queued": counts.queued, "started": counts.started, "scheduled": counts.scheduled,
                           "failed": counts.failed}},
        "subscriptions": counts.subscriptions,
        "topics": counts.topics,
        "verifications_pending": counts.verifications_pending,
        "lanes": {name: {"waiting": lane.waiting, "oldest_seconds": lane.oldest_seconds, "behind": name in behind}
                  for name, lane in lanes.items()},
        "hub_url": settings.hub_url,
        "replication": replication,     # primary, replicas seen and their lag, the last failover
    }
    return web.json_response(body, status=200 if ready else 503)


async def live(request: web.Request) -> web.Response:
    """200 while the process answers HTTP. It never touches Redis, so a liveness probe on it does
    not restart every web process during a Redis outage (readiness on /health takes them out of
    rotation instead)."""
    return web.json_response({"status": "alive"})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/live", live)

"""Prometheus metrics at GET /metrics, for the whole hub, every name prefixed rsnotify_.

The hub runs as many web and worker processes, so counts live in Redis: the append script adds
publishes, the workers add delivery counters and latency histograms in their batched writes
(keys.stats_key()), and the verification jobs count their outcomes there too. A custom Collector renders those with
gauges read at scrape time (topics, subscriptions, backlog, dead letters, queues). Every web
process answers for the whole hub: scrape one of them (e.g. the Service), not each.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from redis.asyncio import Redis

from .. import store
from ..keys import verification_field
from ..settings import HubSettings
from . import reports
from .appkeys import CLOCK, REDIS, SCAN, SETTINGS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OUTCOMES = ("delivered", "retry", "gone", "dead")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "error")
VERIFICATION_OUTCOMES = ("activated", "renewed", "unsubscribed", "refused", "denial-sent", "denial-failed",
                         "unknown-challenge")


# --- what a scrape reads --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scrape renders, read from Redis beforehand (Collector.collect is synchronous)."""

    stats: dict[str, float]
    topics: int
    subscriptions: dict[str, int]     # by state: active, paused, expired
    scanned: int
    lagging: int
    in_trouble: int
    backlog: int
    dead_letters: int
    queues: dict[str, Any]


async def read_snapshot(redis: Redis, settings: HubSettings, now: float,
                        scan: reports.ScanCache | None = None) -> Snapshot:
    stats = await store.delivery_stats(redis)
    topics = await store.count_topics(redis)
    summaries = await (scan.get(redis) if scan is not None else reports.scan_subscriptions(redis))
    states = {"active": 0, "paused": 0, "expired": 0}
    for s in summaries:
        states["expired" if s.expires < now else "paused" if s.state == "paused" else "active"] += 1
    return Snapshot(
        stats=stats, topics=int(topics), subscriptions=states, scanned=len(summaries),
        lagging=sum(1 for s in summaries if s.backlog > 0),
        in_trouble=sum(1 for s in summaries if s.trouble(now)),
        backlog=sum(s.backlog for s in summaries), dead_letters=sum(s.dead_letters for s in summaries),
        queues=await reports.queue_depths(redis, settings, now))


class HubCollector(Collector):
    """Renders a Snapshot as Prometheus metric families."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap, stats = self.snapshot, self.snapshot.stats
        yield CounterMetricFamily("rsnotify_publishes", "Notifications stored (submissions and thin-ping fetches).",
                                  value=stats.get("publishes", 0.0))
        yield CounterMetricFamily("rsnotify_publish_bytes", "Bytes of the notifications stored.",
                                  value=stats.get("publish_bytes", 0.0))
        deliveries = CounterMetricFamily(
            "rsnotify_deliveries", "Delivery attempts by outcome: delivered (2xx), retry (failed, will be "
            "retried), gone (410, subscription ended), dead (failed for the last time: a dead letter).",
            labels=["outcome"])
        for outcome in OUTCOMES:
            deliveries.add_metric([outcome], stats.get(f"outcome:{outcome}", 0.0))
        yield deliveries
        classes = CounterMetricFamily(
            "rsnotify_delivery_status", "Delivery attempts by the subscriber's HTTP status class "
            "(error: no answer, e.g. timeout or connection refused).", labels=["status_class"])
        for status_class in STATUS_CLASSES:
            classes.add_metric([status_class], stats.get(f"status:{status_class}", 0.0))
        yield classes
        yield _histogram(stats, "delivery_seconds", "rsnotify_delivery_duration_seconds",
                         "Time of one delivery POST, from sending to the subscriber's answer.")
        yield _histogram(stats, "publish_to_delivery_seconds", "rsnotify_publish_to_delivery_seconds",
                         "Time from a notification's publish to its confirmed delivery to a subscriber.")
        verifications = CounterMetricFamily(
            "rsnotify_verifications", "Subscription intents verified or denied, by outcome.", labels=["outcome"])
        seen = {k.partition(":")[2] for k in stats if k.startswith("verification:")}
        for outcome in sorted(set(VERIFICATION_OUTCOMES) | seen):
            verifications.add_metric([outcome], stats.get(verification_field(outcome), 0.0))
        yield verifications
        yield GaugeMetricFamily("rsnotify_topics", "Topics known to the hub.", value=snap.topics)
        subscriptions = GaugeMetricFamily("rsnotify_subscriptions", "Subscriptions by state.", labels=["state"])
        for state, count in snap.subscriptions.items():
            subscriptions.add_metric([state], count)
        yield subscriptions
        yield GaugeMetricFamily("rsnotify_backlog_notifications",
                                "Notifications published but not yet confirmed, summed over subscriptions.",
                                value=snap.backlog)
        yield GaugeMetricFamily("rsnotify_subscriptions_lagging", "Subscriptions with a backlog.", value=snap.lagging)
        yield GaugeMetricFamily("rsnotify_subscriptions_in_trouble", "Subscriptions retrying, with dead "
                                "letters, paused, stalled or whose lease ends soon.", value=snap.in_trouble)
        yield GaugeMetricFamily("rsnotify_dead_letters", "Dead letters kept, over all subscriptions.",
                                value=snap.dead_letters)
        yield GaugeMetricFamily("rsnotify_subscriptions_scanned", "Subscriptions the gauges above were computed "
                                f"from (at most {reports.SCAN_LIMIT}).", value=snap.scanned)
        queue = snap.queues
        jobs = GaugeMetricFamily("rsnotify_queue_jobs", "RQ jobs of the hub's queue by state.", labels=["queue", "state"])
        for state in ("queued", "started", "scheduled", "failed"):
            jobs.add_metric([queue["queue"], state], queue[state])
        yield jobs
        yield GaugeMetricFamily("rsnotify_retries_waiting", "Subscriptions waiting for a retry, re-send or resume.",
                                value=queue["waiting_retries"])
        yield GaugeMetricFamily("rsnotify_workers", "Live RQ workers.", value=queue["workers"])


def _histogram(stats: dict[str, float], field: str, name: str, documentation: str) -> HistogramMetricFamily:
    data = reports.histogram(stats, field)
    return HistogramMetricFamily(name, documentation, buckets=data["buckets"], sum_value=data["sum"])


async def render(redis: Redis, settings: HubSettings, now: float, scan: reports.ScanCache | None = None) -> bytes:
    """The exposition text of one scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HubCollector(await read_snapshot(redis, settings, now, scan)))
    return generate_latest(registry)


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics (no token: it holds counts, never ids, URLs or secrets)."""
    app = request.app
    body = await render(app[REDIS], app[SETTINGS], float(app[CLOCK]()), app[SCAN])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", metrics)

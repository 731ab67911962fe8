"""GET /metrics after real traffic: Prometheus text that prometheus-client parses back, every name
prefixed rsnotify_, and counts that match what happened (they live in Redis, so any web process
of the hub gives the same answer)."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from rsnotify.hub.web.app import build_app

from .conftest import body


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("rsnotify_"), family.name
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


async def scrape(http, url: str) -> str:
    async with http.get(url + "metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return await response.text()


async def test_metrics_match_real_traffic(ops_hub, subscriber, aiohttp_server) -> None:
    await ops_hub.subscribe(subscriber.url("/ok"))
    subscriber.on("/down", 502)
    await ops_hub.subscribe(subscriber.url("/down"))
    for n in range(4):
        await ops_hub.publish(body(n))
    await ops_hub.drain()
    await ops_hub.counted("outcome:dead", 4)
    m = samples(await scrape(ops_hub.http, ops_hub.url))
    assert m[("rsnotify_publishes_total", ())] == 4
    assert m[("rsnotify_publish_bytes_total", ())] == sum(len(body(n)) for n in range(4))
    assert m[("rsnotify_deliveries_total", (("outcome", "delivered"),))] == 4
    assert m[("rsnotify_deliveries_total", (("outcome", "retry"),))] == 8
    assert m[("rsnotify_deliveries_total", (("outcome", "dead"),))] == 4
    assert m[("rsnotify_deliveries_total", (("outcome", "gone"),))] == 0
    assert m[("rsnotify_delivery_status_total", (("status_class", "2xx"),))] == 4
    assert m[("rsnotify_delivery_status_total", (("status_class", "5xx"),))] == 12
    assert m[("rsnotify_delivery_duration_seconds_count", ())] == 16
    assert m[("rsnotify_delivery_duration_seconds_bucket", (("le", "+Inf"),))] == 16
    assert m[("rsnotify_publish_to_delivery_seconds_count", ())] == 4
    assert 0 < m[("rsnotify_publish_to_delivery_seconds_sum", ())] < 60
    assert m[("rsnotify_verifications_total", (("outcome", "activated"),))] == 2
    assert m[("rsnotify_topics", ())] == 1
    assert m[("rsnotify_subscriptions", (("state", "active"),))] == 2
    assert m[("rsnotify_dead_letters", ())] == 4
    assert m[("rsnotify_subscriptions_in_trouble", ())] == 1
    assert m[("rsnotify_backlog_notifications", ())] == 0
    assert m[("rsnotify_queue_jobs", (("queue", "rsnotify"), ("state", "queued")))] == 0

    # a second web process on the same Redis answers the same counts
    other = await aiohttp_server(build_app(ops_hub.settings), host="127.0.0.1")
    again = samples(await scrape(ops_hub.http, str(other.make_url("/"))))
    assert again[("rsnotify_publishes_total", ())] == 4
    assert again[("rsnotify_deliveries_total", (("outcome", "delivered"),))] == 4


async def test_backlog_and_paused_subscriptions_show(ops_hub, subscriber) -> None:
    sid = await ops_hub.subscribe(subscriber.url("/slow"))
    await ops_hub.admin("POST", f"/admin/subscriptions/{sid}/pause")
    for n in range(3):
        await ops_hub.publish(body(n))
    m = samples(await scrape(ops_hub.http, ops_hub.url))
    assert m[("rsnotify_subscriptions", (("state", "paused"),))] == 1
    assert m[("rsnotify_backlog_notifications", ())] == 3
    assert m[("rsnotify_subscriptions_lagging", ())] == 1
    assert m[("rsnotify_queue_jobs", (("queue", "rsnotify"), ("state", "queued")))] == 1   # the fan-out job

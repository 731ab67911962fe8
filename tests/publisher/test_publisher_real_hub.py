"""The publisher through the real hub: `rsnotify hub` as a subprocess (real Redis, one worker)
and a loopback subscriber that subscribes with the WebSub form and answers the verification
GET itself. Library, CLI, and a 60,000-change publish split into chained documents."""
from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis as redis_lib

from rsnotify.publisher import Publisher
from rsnotify.hub.redis_server import RedisServer
from rsnotify.websub import NOTIFICATION_ID_HEADER, links_by_rel, parse_link_header
from rsnotify.xml import parse_notification
from tests.support import cli
from tests.support.http import post_form
from tests.support.hubproc import HubProcess, start_hub
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import wait_until

TOPIC = "https://example.org/dataset1/change/"
T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def real_hub(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """`rsnotify hub` with the test Redis and one worker, ready (GET /health is 200), shared by this
    module's tests: each subscribes its own callback, which starts at the log's end, so what an
    earlier test published never reaches it."""
    client = redis_lib.Redis.from_url(redis_server.url)
    client.flushall()       # what earlier modules left (their secret-key check, queued jobs)
    client.close()
    workdir = tmp_path_factory.mktemp("hub")
    hub = start_hub(workdir, "--retry-base", "0.2", "--log-level", "WARNING", data_dir=workdir / "hub-data",
                    redis_url=redis_server.url, workers=1)
    yield hub
    hub.stop()


@pytest.fixture
def subscriber(real_hub: HubProcess) -> Iterator[RecordingSubscriber]:
    """A loopback WebSub subscriber in a thread, subscribed to TOPIC through the real hub."""
    subscriber = RecordingSubscriber(default_status=204)
    server = subscriber.serve_in_thread()
    form = {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": subscriber.url(), "hub.lease_seconds": "3600"}
    before = real_hub.health()[1]["subscriptions"]
    assert post_form(real_hub.url, form)[0] == 202
    wait_until(lambda: real_hub.health()[1].get("subscriptions", 0) >= before + 1,
               what="the subscription to be verified")
    [verification] = subscriber.verifications()
    assert verification.query["hub.mode"] == "subscribe" and verification.query["hub.topic"] == TOPIC
    yield subscriber
    server.stop()


def received(subscriber: RecordingSubscriber) -> list[tuple[dict[str, str], bytes]]:
    """(headers, body) of each delivery so far."""
    return [(r.headers, r.body) for r in subscriber.deliveries()]


def test_library_publish_reaches_the_subscriber_through_the_real_hub(real_hub, subscriber):
    publisher = Publisher(real_hub.url, TOPIC, "https://example.org/dataset1/capabilitylist.xml")
    first = publisher.publish_blocking([("https://example.org/a", "created", T0), ("https://example.org/b", "updated", T0)])
    second = publisher.publish_blocking([("https://example.org/a", "deleted", T0 + timedelta(minutes=1))])
    wait_until(lambda: len(received(subscriber)) == 2, what="two deliveries")
    (headers1, body1), (headers2, body2) = received(subscriber)
    assert [headers1[NOTIFICATION_ID_HEADER], headers2[NOTIFICATION_ID_HEADER]] == first + second
    assert headers1["Content-Type"] == "application/xml"
    links = parse_link_header(headers1["Link"])
    assert links_by_rel(links, "self") == [TOPIC] and links_by_rel(links, "hub") == [real_hub.url]
    one, two = parse_notification(body1), parse_notification(body2)
    assert [(c.loc, c.change.value) for c in one.changes] == [("https://example.org/a", "created"),
                                                              ("https://example.org/b", "updated")]
    assert [(c.loc, c.change.value) for c in two.changes] == [("https://example.org/a", "deleted")]
    assert two.from_time == one.until_time


def test_cli_publish_prints_an_id_and_the_subscriber_gets_the_notification(real_hub, subscriber, tmp_path):
    done = cli.run("publish", "--hub", real_hub.url, "--topic", TOPIC, "--updated", "https://example.org/a",
                   "--state", str(tmp_path / "state.json"))
    assert done.returncode == 0, done.stderr
    notification_id = done.stdout.split()[0]
    wait_until(lambda: len(received(subscriber)) == 1, what="the delivery")
    [(headers, body)] = received(subscriber)
    assert headers[NOTIFICATION_ID_HEADER] == notification_id
    assert [c.loc for c in parse_notification(body).changes] == ["https://example.org/a"]


def test_a_hub_refusal_surfaces_with_the_hub_reason(real_hub):
    from rsnotify.publisher import PublishError

    # the same hub under another name: its Link rel="hub" does not name the hub, which refuses it
    other_name = real_hub.url.replace("127.0.0.1", "localhost")
    with pytest.raises(PublishError) as caught:
        Publisher(other_name, TOPIC, max_attempts=1).publish_blocking([("https://example.org/a", "updated", T0)])
    assert caught.value.status == 400
    assert "must name this hub" in caught.value.reason
    assert Publisher(real_hub.url, TOPIC).publish_blocking([("https://example.org/a", "updated", T0)])


def test_sixty_thousand_changes_arrive_split_chained_and_in_order(real_hub, subscriber):
    changes = [(f"https://example.org/r/{i}", "updated", T0 + timedelta(milliseconds=i)) for i in range(60_000)]
    publisher = Publisher(real_hub.url, TOPIC)
    started = time.monotonic()
    ids = publisher.publish_blocking(changes, deadline=120)  # two 50,000-entry documents: past the 10 s default
    assert len(ids) == 2
    wait_until(lambda: len(received(subscriber)) == 2, timeout=60, what="both documents")
    elapsed = time.monotonic() - started
    documents = [parse_notification(body) for _, body in received(subscriber)]
    assert [h[NOTIFICATION_ID_HEADER] for h, _ in received(subscriber)] == ids
    assert [len(d.changes) for d in documents] == [50_000, 10_000]
    assert documents[1].from_time == documents[0].until_time
    assert [c.loc for d in documents for c in d.changes] == [f"https://example.org/r/{i}" for i in range(60_000)]
    print(f"60,000 changes published and delivered in {elapsed:.2f}s")

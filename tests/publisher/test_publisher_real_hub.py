"""The publisher through the real hub: `rsnotify hub` as a subprocess (real Redis, one worker)
and a loopback subscriber that subscribes with the WebSub form and answers the verification
GET itself. Library, CLI, and a 60,000-change publish split into chained documents."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web

from rsnotify.publisher import Publisher
from rsnotify.websub import NOTIFICATION_ID_HEADER, links_by_rel, parse_link_header
from rsnotify.xml import parse_notification

RSNOTIFY = Path(sys.executable).with_name("rsnotify")
TOPIC = "https://example.org/dataset1/change/"
T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll `condition` (bounded); the hub and its worker are other processes, so there is no
    event to wait on."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
    except OSError:
        return 0, {}


@dataclass
class RealHub:
    url: str
    process: subprocess.Popen
    log: Path

    def health(self) -> dict:
        return get_json(self.url + "health")[1]


@pytest.fixture
def real_hub(redis_url: str, tmp_path: Path, unused_port: int) -> Iterator[RealHub]:
    """`rsnotify hub` with the test Redis and one worker, ready (GET /health is 200)."""
    log = tmp_path / "hub.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(RSNOTIFY), "hub", "--redis-url", redis_url, "--port", str(unused_port), "--workers", "1",
             "--data-dir", str(tmp_path / "hub-data"), "--retry-base", "0.2", "--log-level", "WARNING"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    hub = RealHub(f"http://127.0.0.1:{unused_port}/", process, log)
    try:
        wait_for(lambda: process.poll() is not None or get_json(hub.url + "health")[0] == 200, "the hub's /health")
        if process.poll() is not None:
            raise AssertionError(f"the hub exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        yield hub
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # the hub and the worker it started
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


@dataclass
class Subscriber:
    """A loopback WebSub subscriber: echoes the hub's challenge and records every delivery."""

    verifications: list[dict[str, str]] = field(default_factory=list)
    deliveries: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        if request.method == "GET":
            with self.lock:
                self.verifications.append(dict(request.query))
            return web.Response(text=request.query.get("hub.challenge", ""))
        body = await request.read()
        with self.lock:
            self.deliveries.append((dict(request.headers), body))
        return web.Response(status=204)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/callback", self.handle)
        return app

    def subscribe(self, hub: RealHub, topic: str) -> None:
        form = urllib.parse.urlencode({"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": self.url,
                                       "hub.lease_seconds": "3600"}).encode()
        request = urllib.request.Request(hub.url, data=form, method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 202
        wait_for(lambda: hub.health().get("subscriptions", 0) >= 1, "the subscription to be verified")
        assert self.verifications[0]["hub.mode"] == "subscribe" and self.verifications[0]["hub.topic"] == topic

    def received(self) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return list(self.deliveries)


@pytest.fixture
def subscriber(real_hub: RealHub, serve_in_thread) -> Subscriber:  # type: ignore[no-untyped-def]
    subscriber = Subscriber()
    server = serve_in_thread(subscriber.app()).start()
    subscriber.url = f"http://127.0.0.1:{server.port}/callback"
    subscriber.subscribe(real_hub, TOPIC)
    return subscriber


def test_library_publish_reaches_the_subscriber_through_the_real_hub(real_hub, subscriber):
    publisher = Publisher(real_hub.url, TOPIC, "https://example.org/dataset1/capabilitylist.xml")
    first = publisher.publish_blocking([("https://example.org/a", "created", T0), ("https://example.org/b", "updated", T0)])
    second = publisher.publish_blocking([("https://example.org/a", "deleted", T0 + timedelta(minutes=1))])
    wait_for(lambda: len(subscriber.received()) == 2, "two deliveries")
    (headers1, body1), (headers2, body2) = subscriber.received()
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
    done = subprocess.run(
        [str(RSNOTIFY), "publish", "--hub", real_hub.url, "--topic", TOPIC, "--updated", "https://example.org/a",
         "--state", str(tmp_path / "state.json")],
        check=False, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    notification_id = done.stdout.split()[0]
    wait_for(lambda: len(subscriber.received()) == 1, "the delivery")
    [(headers, body)] = subscriber.received()
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
    ids = publisher.publish_blocking(changes)
    assert len(ids) == 2
    wait_for(lambda: len(subscriber.received()) == 2, "both documents", timeout=60)
    elapsed = time.monotonic() - started
    documents = [parse_notification(body) for _, body in subscriber.received()]
    assert [h[NOTIFICATION_ID_HEADER] for h, _ in subscriber.received()] == ids
    assert [len(d.changes) for d in documents] == [50_000, 10_000]
    assert documents[1].from_time == documents[0].until_time
    assert [c.loc for d in documents for c in d.changes] == [f"https://example.org/r/{i}" for i in range(60_000)]
    print(f"60,000 changes published and delivered in {elapsed:.2f}s")

"""Hostile requests against a real `rsnotify hub` process, one test per finding of the security
review: each gets a clear 4xx (or is refused), nothing is stored, delivered or fetched, and the
hub still answers /health within a second afterwards."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest
import redis as redis_lib
from aiohttp import web

from rsnotify.hub.redis_server import RedisServer
from tests.support import cli
from tests.support.http import Response, fetch
from tests.support.hubproc import HubProcess, start_hub_on_emptied_redis
from tests.support.ports import free_port
from tests.support.servers import ThreadedServer
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import loaded, wait_until

FORM = "application/x-www-form-urlencoded"
TOPIC = "http://data.example.org/ds1/changes"
NOTIFICATION = (
    '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
    '<rs:md capability="change-notification" from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>'
    '<url><loc>{loc}</loc><rs:md change="updated" datetime="2013-01-03T00:05:00Z"/>{extra}</url></urlset>'
)
DEV_ZERO_ENTITY = (
    '<?xml version="1.0" encoding="UTF-16"?>\n'
    '<!DOCTYPE urlset [<!ENTITY % x SYSTEM "file:///dev/zero"> %x;]>\n'
    '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"/>'
)


def notification(loc: str = "http://data.example.org/res1", extra: str = "") -> bytes:
    return NOTIFICATION.format(loc=loc, extra=extra).encode()


# --- recording loopback servers (a callback, or an internal service an attacker aims at) -----


@pytest.fixture
def recorders() -> Iterator[Callable[..., RecordingSubscriber]]:
    """Factory: a recording subscriber served on `host` (deliveries answered 204)."""
    servers: list[ThreadedServer] = []

    def start(host: str = "127.0.0.1") -> RecordingSubscriber:
        recorder = RecordingSubscriber(default_status=204)
        servers.append(recorder.serve_in_thread(host))
        return recorder

    yield start
    for server in servers:
        server.stop()


def wait_for_requests(recorder: RecordingSubscriber, count: int) -> None:
    wait_until(lambda: len(recorder.requests) >= count, 60.0, f"{count} request(s) at {recorder.base}")


# --- plain HTTP, with every header under the test's control (tests/support's fetch) ----------


def form(hub_url: str, fields: dict[str, str] | str, headers: dict[str, str] | None = None) -> Response:
    body = fields if isinstance(fields, str) else urlencode(fields)
    return fetch(hub_url, "POST", body, {"Content-Type": FORM, **(headers or {})})


def publish(hub_url: str, body: bytes, topic: str = TOPIC, token: str | None = None,
            headers: dict[str, str] | None = None) -> Response:
    sent = {"Content-Type": "application/xml", "Link": f'<{topic}>; rel="self", <{hub_url}>; rel="hub"'}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    return fetch(hub_url, "POST", body, {**sent, **(headers or {})})


def subscribe(hub_url: str, callback: str, topic: str = TOPIC, headers: dict[str, str] | None = None,
              **extra: str) -> Response:
    return form(hub_url, {"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": callback, **extra}, headers)


def answer_within_a_second(url: str) -> Response:
    """GET `url`, answered within a second on a quiet machine: what a hostile request left behind
    is neither stuck nor busy. On a loaded one the second stretches with the load (`loaded`): at
    load 20 on 2 cores the hub and its Redis each get about a tenth of a core. A server that never
    answers still fails, after 60 s at most."""
    started = time.monotonic()
    answer = fetch(url, timeout=60.0)
    took = time.monotonic() - started
    assert took < loaded(1.0), f"{url} took {took:.2f} s (load {os.getloadavg()[0]:.1f})"
    return answer


def assert_healthy_within_a_second(hub_url: str) -> None:
    answer = answer_within_a_second(hub_url + "health")
    assert answer.status == 200, answer.text


def stored(redis: redis_lib.Redis) -> dict[str, int]:
    """What the hub keeps: topics, subscriptions, pending intents, notifications, jobs waiting for a worker."""
    return {
        "topics": redis.scard("rsnotify:topics"),
        "subscriptions": sum(1 for key in redis.scan_iter("rsnotify:sub:*") if key.count(b":") == 2),
        "intents": sum(1 for _ in redis.scan_iter("rsnotify:intent:*")),
        "notifications": sum(redis.xlen(key) for key in redis.scan_iter("rsnotify:topic:*:log")),
        "queued jobs": redis.llen("rq:queue:rsnotify"),
    }


NOTHING = {"topics": 0, "subscriptions": 0, "intents": 0, "notifications": 0, "queued jobs": 0}


@pytest.fixture
def start(hub_process, redis_url: str) -> Callable[..., HubProcess]:
    """A hub process on the test's Redis with one worker, for a test with options of its own."""

    def launch(*args: str, workers: int = 1) -> HubProcess:
        return hub_process(*args, redis_url=redis_url, workers=workers)

    return launch


@pytest.fixture(scope="module")
def intake_hub(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """One hub with default options and no workers for the tests of intake alone: each test's
    `redis` fixture empties the Redis first, and with no worker nothing it queued is taken."""
    hub = start_hub_on_emptied_redis(tmp_path_factory.mktemp("intake-hub"), redis_server.url, workers=0)
    yield hub
    hub.stop()


# --- 1. XML -------------------------------------------------------------------------------


def test_1_hostile_xml_is_refused_at_once_and_the_hub_stays_responsive(intake_hub, redis) -> None:
    hub = intake_hub
    crowd = " ".join(f'a{i}="1"' for i in range(100_000))
    for body, reason in (
        (DEV_ZERO_ENTITY.encode("utf-16"), "UTF-16 byte order mark; expected UTF-8"),
        (DEV_ZERO_ENTITY.replace("UTF-16", "UTF-8").encode(), "document has a DTD"),
        (notification(extra=f'<rs:ln rel="alternate" href="http://data.example.org/x" {crowd}/>'),
         "attributes; expected at most 64"),
    ):
        answer = publish(hub.url, body)
        assert answer.status == 400, answer.text
        assert reason in answer.text
        assert_healthy_within_a_second(hub.url)
    assert stored(redis) == NOTHING
    # the hub still works: a valid notification goes through
    assert publish(hub.url, notification()).status == 200


def serve_topic(body: bytes) -> ThreadedServer:
    """Serves `body` at every path, as a Source's topic URL would."""
    async def topic(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/xml")

    app = web.Application()
    app.router.add_get("/{tail:.*}", topic)
    return ThreadedServer(app).start()


def test_1_hostile_xml_relayed_by_a_thin_ping_leaves_rsnotify_subscribe_responsive(start, tmp_path: Path) -> None:
    source = serve_topic(DEV_ZERO_ENTITY.encode("utf-16"))
    topic = source.base + "/changes"
    hub = start()
    port = free_port()
    log = tmp_path / "subscribe.log"
    subscriber = cli.start("subscribe", "--hub", hub.url, "--topic", topic, "--listen", f"127.0.0.1:{port}",
                           "--no-secret", "--state-file", str(tmp_path / "subscriber.db"), log=log, cwd=tmp_path)
    try:
        wait_until(lambda: "subscribed to" in log.read_text(), 60, "the subscription", logs=log)
        answer = form(hub.url, {"hub.mode": "publish", "hub.url": topic})
        assert answer.status == 202, answer.text
        wait_until(lambda: "is not a valid change notification" in log.read_text(), 60,
                   "the subscriber's refusal", logs=log)
        assert "UTF-16 byte order mark; expected UTF-8" in log.read_text()
        assert answer_within_a_second(f"http://127.0.0.1:{port}/").status < 500  # the callback still answers
        assert subscriber.poll() is None
        assert_healthy_within_a_second(hub.url)
    finally:
        cli.stop(subscriber, signal.SIGINT)
        source.stop()


# --- 2. outbound requests -----------------------------------------------------------------


def test_2_a_hub_with_a_public_url_never_calls_loopback(start, redis, recorders) -> None:
    internal = recorders("127.0.0.1")
    control = recorders("127.0.0.2")
    hub = start("--public-url", "https://hub.example.org/", "--allow-network", "127.0.0.2/32",
                "--publish-token", "tok=http://data.example.org/")
    answer = subscribe(hub.url, internal.url("/admin/delete-everything"))
    assert answer.status == 400, answer.text
    assert "127.0.0.1" in answer.text and "--allow-network" in answer.text
    # a topic this hub does not carry is denied at once: no denial GET to the refused address
    answer = subscribe(hub.url, internal.url("/denied"), topic="http://elsewhere.example/t")
    assert answer.status == 400, answer.text
    assert_healthy_within_a_second(hub.url)
    # control: an allowed callback on 127.0.0.2 is verified through the same queue and worker
    assert subscribe(hub.url, control.url()).status == 202
    wait_for_requests(control, 1)
    assert internal.requests == []
    wait_until(lambda: stored(redis)["subscriptions"] == 1, what="the control subscription")


# --- 3. browsers: CSRF, DNS rebinding, stored XSS ----------------------------------------


def test_3_cross_site_requests_foreign_hosts_and_raw_bodies(start, redis, recorders) -> None:
    target = recorders()
    hub = start()
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}, {"Origin": "null"}):
        answer = form(hub.url, {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": target.url()}, headers)
        assert answer.status == 403, answer.text
        assert "cross-site" in answer.text or "Origin" in answer.text
        answer = form(hub.url, {"hub.mode": "publish", "hub.url": target.url("/internal")}, headers)
        assert answer.status == 403, answer.text
    # DNS rebinding: the right address under a foreign name
    answer = fetch(hub.url + "admin/overview", headers={"Host": "attacker.example"})
    assert answer.status == 421, answer.text
    # what needs no credential still answers under a service name (Prometheus scraping hub:8080)
    assert fetch(hub.url + "metrics", headers={"Host": "hub:8080"}).status == 200
    assert stored(redis) == NOTHING
    assert_healthy_within_a_second(hub.url)
    # a same-origin subscribe works; an admin mutation sent as a simple (form) request does not
    assert subscribe(hub.url, target.url()).status == 202
    wait_for_requests(target, 1)
    def subscriptions() -> list[dict]:
        return json.loads(fetch(hub.url + "admin/subscriptions").text)["subscriptions"]

    wait_until(subscriptions, what="the subscription to be verified")
    sid = subscriptions()[0]["sid"]
    answer = fetch(hub.url + f"admin/subscriptions/{sid}/pause", "POST", "", {"Content-Type": FORM})
    assert answer.status == 403, answer.text
    assert json.loads(fetch(hub.url + f"admin/subscriptions/{sid}").text)["state"] == "active"
    # a valid notification carrying a foreign script element is served as an inert attachment
    script = '<h:script xmlns:h="http://www.w3.org/1999/xhtml">fetch("/admin/overview")</h:script>'
    answer = publish(hub.url, notification(extra=script))
    assert answer.status == 200, answer.text
    tid = json.loads(fetch(hub.url + "admin/topics").text)["topics"][0]["tid"]
    raw = fetch(hub.url + f"admin/topics/{tid}/notifications/{json.loads(answer.text)['notification_id']}")
    assert raw.status == 200
    assert raw.headers["Content-Disposition"].startswith("attachment")
    assert raw.headers["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in raw.headers["Content-Security-Policy"]
    page = fetch(hub.url)
    assert page.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]


# --- 4. forms -----------------------------------------------------------------------------


def test_4_forms_are_bounded(intake_hub, redis, recorders) -> None:
    target = recorders()
    hub = intake_hub
    padding = "x" * (300 * 1024)
    answer = form(hub.url, {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": target.url(),
                            "padding": padding})
    assert answer.status == 413, answer.text
    assert "262144" in answer.text
    assert stored(redis) == NOTHING
    assert_healthy_within_a_second(hub.url)
    assert target.requests == []


# --- 5. token prefixes --------------------------------------------------------------------


TOKEN_CASES = [
    ("http://data.example.org/ds1x/changes", 403, "may not publish"),
    ("http://data.example.org/ds1/../ds2/changes", 400, "'.' or '..' path segments"),
    ("http://data.example.org/ds1/%2e%2e/ds2/changes", 400, "'.' or '..' path segments"),
    ("http://data.example.org/ds1/changes#x", 400, "fragment"),
]


def test_5_token_prefixes_match_whole_path_segments(start, redis) -> None:
    hub = start("--publish-token", "tok=http://data.example.org/ds1", workers=0)
    for topic, status, reason in TOKEN_CASES:
        answer = publish(hub.url, notification(), topic=topic, token="tok")
        assert answer.status == status, (topic, answer.text)
        assert reason in answer.text, topic
        assert stored(redis) == NOTHING, topic
        assert_healthy_within_a_second(hub.url)
    assert publish(hub.url, notification(), topic="http://data.example.org/ds1/changes", token="tok").status == 200


# --- 6. limits ----------------------------------------------------------------------------


def test_6_long_urls_rates_and_slow_clients_are_limited(start, redis, recorders) -> None:
    target = recorders()
    # the production layout: remote clients reach the hub through a proxy on this machine
    hub = start("--rate-subscribe-client", "5/minute", "--header-timeout", "2", "--trusted-proxy", "127.0.0.1/32")
    remote = {"X-Forwarded-For": "203.0.113.7"}
    answer = subscribe(hub.url, target.url("/" + "a" * 3000))
    assert answer.status == 400 and "at most 2048 characters" in answer.text, answer.text
    answer = form(hub.url, {"hub.mode": "publish", "hub.url": "http://data.example.org/" + "b" * 3000})
    assert answer.status == 400 and "at most 2048 characters" in answer.text, answer.text
    statuses = [subscribe(hub.url, target.url(f"/cb{i}"), headers=remote).status for i in range(5)]
    assert statuses == [202] * 5
    refused = subscribe(hub.url, target.url("/cb-too-many"), headers=remote)
    assert refused.status == 429, refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    wait_for_requests(target, 5)
    assert not any("/cb-too-many" in request.path for request in target.requests)
    wait_until(lambda: stored(redis)["subscriptions"] == 5, what="five subscriptions")
    # a client trickling its headers is cut off, and others are served meanwhile
    port = urlsplit(hub.url).port
    with socket.create_connection(("127.0.0.1", port), timeout=60) as slow:
        slow.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert_healthy_within_a_second(hub.url)
        reply = slow.recv(1024)  # the hub closes (or answers 408) once the header deadline passes
        assert reply == b"" or reply.startswith(b"HTTP/1.1 408"), reply
    assert_healthy_within_a_second(hub.url)


def test_6_callback_hosts_and_publish_tokens_are_rate_limited(start, redis, recorders) -> None:
    target = recorders()
    hub = start("--rate-subscribe-callback-host", "3/minute", "--rate-publish-token", "2/minute",
                "--publish-token", "tok=http://data.example.org/", "--trusted-proxy", "127.0.0.1/32")
    statuses = [subscribe(hub.url, target.url(f"/cb{i}"), headers={"X-Forwarded-For": f"203.0.113.{i}"}).status
                for i in range(4)]
    assert statuses == [202, 202, 202, 429]
    remote = {"X-Forwarded-For": "203.0.113.50"}
    statuses = [publish(hub.url, notification(), token="tok", headers=remote).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert stored(redis)["notifications"] == 2
    assert_healthy_within_a_second(hub.url)


# --- 7. malformed input -------------------------------------------------------------------


MALFORMED_FORMS = [
    ({"hub.lease_seconds": "²"}, "hub.lease_seconds must be a positive integer"),
    ({"hub.lease_seconds": "9" * 5000}, "at most 20 digits"),
    ({"hub.callback": "http://127.0.0.1\\@evil.example/cb"}, "must not contain '\\\\'"),
    ({"hub.callback": "http://127.0.0.1\x00.evil/cb"}, "must not contain '\\x00'"),
    ({"hub.callback": "http://127.0.0.1/cb\r\nX-Injected: 1"}, "must not contain '\\r'"),
    ({"hub.topic": "http://data.example.org/a b"}, "must not contain ' '"),
    ({"hub.topic": "http://data.example.org/<script>"}, "must not contain '<'"),
]


def test_7_malformed_forms_get_a_400_with_the_reason(intake_hub, redis, recorders) -> None:
    target = recorders()
    hub = intake_hub
    for fields, reason in MALFORMED_FORMS:
        answer = form(hub.url, {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": target.url(), **fields})
        assert answer.status == 400, (fields, answer.text)
        assert reason in answer.text, (reason, answer.text)
        assert stored(redis) == NOTHING
        assert_healthy_within_a_second(hub.url)
    assert "Traceback" not in hub.output()
    assert target.requests == []


def test_7_bad_charsets_get_a_400_and_logs_keep_callback_paths_out(intake_hub, redis, recorders) -> None:
    target = recorders()
    hub = intake_hub  # the web process's own log lines: intake is what this test is about
    earlier = len(hub.output())  # what the tests before this one made the shared hub say
    answer = fetch(hub.url, "POST", "hub.mode=subscribe", {"Content-Type": f"{FORM}; charset=x-bogus-9"})
    assert answer.status == 400, answer.text
    assert "x-bogus-9" in answer.text
    assert stored(redis) == NOTHING
    secret_path = "/cb/capability-3f9a7c"
    assert subscribe(hub.url, target.url(secret_path)).status == 202
    assert_healthy_within_a_second(hub.url)
    hub.wait_for_output(r"subscribe request for http://127\.0\.0\.1:\d+/… at ", since=earlier)
    assert "capability-3f9a7c" not in hub.output()
    assert "Traceback" not in hub.output()


# --- 8. whom to trust ---------------------------------------------------------------------


def test_8_forwarding_headers_make_a_client_remote_without_trusted_proxies(intake_hub, redis) -> None:
    hub = intake_hub
    for header in ("X-Client-IP", "CF-Connecting-IP", "True-Client-IP", "X-Forwarded-For"):
        answer = publish(hub.url, notification(), headers={header: "203.0.113.9"})
        assert answer.status == 403, (header, answer.text)
        answer = fetch(hub.url + "admin/overview", headers={header: "203.0.113.9"})
        assert answer.status == 403, (header, answer.text)
        assert stored(redis) == NOTHING
        assert_healthy_within_a_second(hub.url)


def test_8_a_trusted_proxy_names_the_client(start, redis) -> None:
    hub = start("--trusted-proxy", "127.0.0.0/8", workers=0)
    answer = publish(hub.url, notification(), headers={"X-Forwarded-For": "203.0.113.9"})
    assert answer.status == 403 and "203.0.113.9" in answer.text, answer.text
    assert stored(redis) == NOTHING
    # an address a header names never makes a client local, even through a trusted proxy
    answer = publish(hub.url, notification(), headers={"X-Forwarded-For": "127.0.0.1"})
    assert answer.status == 403 and "127.0.0.1" in answer.text, answer.text
    assert stored(redis) == NOTHING


def test_8_jobs_are_json_and_the_embedded_data_is_private(intake_hub, hub_process, redis, tmp_path: Path,
                                                          recorders) -> None:
    target = recorders()
    hub = intake_hub
    assert subscribe(hub.url, target.url()).status == 202
    jobs = [key for key in redis.scan_iter("rq:job:*") if key.count(b":") == 2]
    assert jobs
    for key in jobs:
        data = redis.hget(key, "data")
        json.loads(zlib.decompress(data))  # JSON, never pickle
    embedded = hub_process(data_dir=tmp_path / "hub-data", workers=0)
    assert_healthy_within_a_second(embedded.url)
    data_dir = tmp_path / "hub-data"
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    for path in data_dir.rglob("*"):
        if path.is_file() and not path.name.endswith((".lock", ".sock")):
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


# --- 9. <loc> -----------------------------------------------------------------------------


def test_9_a_loc_must_be_an_absolute_http_uri(start, redis, recorders) -> None:
    target = recorders()
    hub = start()
    assert subscribe(hub.url, target.url()).status == 202
    wait_for_requests(target, 1)
    for loc, reason in (("/res1", "is relative"), ("http://data.example.org/a b", "space"),
                        ("ftp://data.example.org/r", "scheme 'ftp'")):
        answer = publish(hub.url, notification(loc=loc))
        assert answer.status == 400, (loc, answer.text)
        assert reason in answer.text
        assert stored(redis)["notifications"] == 0
        assert_healthy_within_a_second(hub.url)
    assert [request.method for request in target.requests] == ["GET"]  # the verification, no delivery

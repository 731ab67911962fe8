"""The hub's remaining trust edges, each over HTTP against a real `rsnotify hub` process: a
rebinding request carrying a made-up Authorization header, an Idempotency-Key reused for
another body, rate limits rotated through one IPv6 /64 or one registrable domain, a forged
loopback address behind a trusted proxy, and a lease asked for "as long as possible"."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from urllib.parse import urlencode

import pytest
import redis as redis_lib

from tests.support.http import Response, fetch
from tests.support.hubproc import HubProcess
from tests.support.servers import ThreadedServer
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import wait_until

FORM = "application/x-www-form-urlencoded"
TOPIC = "http://data.example.org/ds1/changes"
NOTIFICATION = (
    '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
    '<rs:md capability="change-notification" from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>'
    '<url><loc>{loc}</loc><rs:md change="updated" datetime="2013-01-03T00:05:00Z"/></url></urlset>'
)


def notification(loc: str = "http://data.example.org/res1") -> bytes:
    return NOTIFICATION.format(loc=loc).encode()


@pytest.fixture
def recorder() -> Iterator[RecordingSubscriber]:
    """A callback on 127.0.0.1 that echoes challenges and answers deliveries 204."""
    recording = RecordingSubscriber(default_status=204)
    server: ThreadedServer = recording.serve_in_thread()
    yield recording
    server.stop()


@pytest.fixture
def start(hub_process, redis_url: str) -> Callable[..., HubProcess]:
    def launch(*args: str, workers: int = 0) -> HubProcess:
        return hub_process(*args, redis_url=redis_url, workers=workers)

    return launch


def subscribe(hub_url: str, callback: str, headers: dict[str, str] | None = None, **extra: str) -> Response:
    fields = {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": callback, **extra}
    return fetch(hub_url, "POST", urlencode(fields), {"Content-Type": FORM, **(headers or {})})


def publish(hub_url: str, body: bytes, token: str | None = None, headers: dict[str, str] | None = None) -> Response:
    sent = {"Content-Type": "application/xml", "Link": f'<{TOPIC}>; rel="self", <{hub_url}>; rel="hub"'}
    if token:
        sent["Authorization"] = f"Bearer {token}"
    return fetch(hub_url, "POST", body, {**sent, **(headers or {})})


def stored_bodies(redis: redis_lib.Redis) -> list[bytes]:
    return [fields[b"body"] for key in redis.scan_iter("rsnotify:topic:*:log") for _, fields in redis.xrange(key)]


def intents(redis: redis_lib.Redis) -> int:
    return sum(1 for _ in redis.scan_iter("rsnotify:intent:*"))


# --- 1. Host and Origin checks whatever the headers ----------------------------------------


def test_a_made_up_authorization_header_does_not_switch_the_browser_checks_off(start, redis, recorder) -> None:
    hub = start(workers=1)  # no tokens: loopback clients are operators
    assert subscribe(hub.url, recorder.url()).status == 202
    wait_until(lambda: json.loads(fetch(hub.url + "admin/subscriptions").text)["subscriptions"],
               what="the subscription to be verified")
    sid = json.loads(fetch(hub.url + "admin/subscriptions").text)["subscriptions"][0]["sid"]
    rebound = {"Host": "attacker.example", "Authorization": "Bearer x"}
    for method, path, body, headers in (
        ("GET", "admin/overview", "", rebound),
        ("POST", f"admin/subscriptions/{sid}/pause", "{}", {**rebound, "Content-Type": "application/json"}),
        ("POST", "", urlencode({"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": recorder.url("/cb2")}),
         {**rebound, "Content-Type": FORM}),
    ):
        answer = fetch(hub.url + path, method, body, headers)
        assert answer.status == 421, (path, answer.text)
        assert "attacker.example" in answer.text
    cross_site = {"Origin": "http://evil.example", "Authorization": "Bearer x", "Content-Type": "application/json"}
    answer = fetch(hub.url + f"admin/subscriptions/{sid}/pause", "POST", "{}", cross_site)
    assert answer.status == 403 and "evil.example" in answer.text, answer.text
    answer = subscribe(hub.url, recorder.url("/cb3"), {"Sec-Fetch-Site": "cross-site", "Authorization": "Bearer x"})
    assert answer.status == 403 and "cross-site" in answer.text, answer.text
    # nothing changed: still active, no new intent, no verification sent to the other callbacks
    assert json.loads(fetch(hub.url + f"admin/subscriptions/{sid}").text)["state"] == "active"
    assert intents(redis) == 0
    assert [r.path for r in recorder.verifications()] == ["/callback"]


def test_the_admin_token_itself_still_passes_under_another_name(start) -> None:
    hub = start("--admin-token", "adm1n")
    answer = fetch(hub.url + "admin/overview", headers={"Host": "hub.internal", "Authorization": "Bearer adm1n"})
    assert answer.status == 200, answer.text
    answer = fetch(hub.url + "admin/overview", headers={"Host": "hub.internal", "Authorization": "Bearer nope"})
    assert answer.status == 421, answer.text


# --- 2. Idempotency-Key: per credential and topic, bound to the body -------------------------


def test_a_reused_idempotency_key_with_another_body_is_refused_and_not_stored(start, redis) -> None:
    hub = start("--publish-token", "tokA=http://data.example.org/", "--publish-token",
                "tokB=http://data.example.org/")
    first, second = notification("http://data.example.org/a"), notification("http://data.example.org/b")
    key = {"Idempotency-Key": "publish-0001"}
    answer = publish(hub.url, first, "tokA", key)
    assert answer.status == 200, answer.text
    nid = json.loads(answer.text)["notification_id"]
    refused = publish(hub.url, second, "tokA", key)
    assert refused.status == 422, refused.text
    assert "another body" in refused.text and nid in refused.text
    assert stored_bodies(redis) == [first]
    # the same body again is the repeat the key is for
    again = publish(hub.url, first, "tokA", key)
    assert (again.status, again.headers["Idempotent-Replayed"]) == (200, "true")
    assert json.loads(again.text)["notification_id"] == nid
    # another publisher's key of the same name is its own
    other = publish(hub.url, second, "tokB", key)
    assert other.status == 200 and other.headers["Idempotent-Replayed"] is None, other.text
    assert sorted(stored_bodies(redis)) == sorted([first, second])
    for bad in ("k" * 201, "tab\there"):
        answer = publish(hub.url, notification("http://data.example.org/c"), "tokA", {"Idempotency-Key": bad})
        assert answer.status == 400 and "Idempotency-Key must be 1-200 visible ASCII" in answer.text, answer.text
    assert len(stored_bodies(redis)) == 2


def test_the_key_a_publish_without_one_gets_is_kept_only_past_its_own_retries(start, redis) -> None:
    """Every publish without an Idempotency-Key stores a key of the hub's: it guards the append's
    own retries (--redis-timeout), so it is kept ~1 minute, not the log's age (a busy hub would
    hold millions); a publisher's own key is kept as long as the log (--log-max-age)."""
    hub = start("--log-max-age", "7200")
    assert publish(hub.url, notification("http://data.example.org/own")).status == 200
    assert publish(hub.url, notification("http://data.example.org/given"), None,
                   {"Idempotency-Key": "publish-0002"}).status == 200
    ttls = sorted(redis.ttl(key) for key in redis.scan_iter("rsnotify:topic:*:idem:*"))
    assert len(ttls) == 2 and 0 < ttls[0] <= 60 and 7000 < ttls[1] <= 7200, ttls


# --- 4. rate-limit keys: IPv6 networks, registrable domains, resolved addresses -------------


def test_subscribes_from_one_ipv6_64_or_one_domain_share_their_limits(start, redis, recorder) -> None:
    hub = start("--trusted-proxy", "127.0.0.1/32", "--rate-subscribe-client", "30/minute",
                "--rate-subscribe-callback-host", "3/minute")
    statuses = [subscribe(hub.url, f"http://cb{i}.site{i}.test/cb",
                          {"X-Forwarded-For": f"2001:db8:7:7::{i + 1:x}"}).status for i in range(40)]
    assert statuses == [202] * 30 + [429] * 10
    assert intents(redis) == 30
    # another /64 has its own budget (the prefix, not the whole address space)
    assert subscribe(hub.url, "http://fresh.site99.test/cb", {"X-Forwarded-For": "2001:db8:7:8::1"}).status == 202

    def from_elsewhere(i: int) -> dict[str, str]:
        return {"X-Forwarded-For": f"2001:db8:{100 + i:x}::1"}

    # host names under one registrable domain (public-suffix aware) count together ...
    statuses = [subscribe(hub.url, f"http://h{i}.example.co.uk/cb", from_elsewhere(i)) for i in range(4)]
    assert [a.status for a in statuses] == [202, 202, 202, 429], statuses[-1].text
    assert "example.co.uk" in statuses[-1].text
    # ... while two sites under a public suffix (github.io) are two domains
    assert all(subscribe(hub.url, f"http://u{i}.github.io/cb", from_elsewhere(10 + i)).status == 202
               for i in range(4))
    # a name counts against the address it resolves to
    port = recorder.url().split(":")[2].split("/")[0]
    callbacks = [f"http://localhost:{port}/a", f"http://localhost:{port}/b", f"http://127.0.0.1:{port}/c",
                 f"http://127.0.0.1:{port}/d"]
    statuses = [subscribe(hub.url, cb, from_elsewhere(20 + i)) for i, cb in enumerate(callbacks)]
    assert [a.status for a in statuses] == [202, 202, 202, 429], statuses[-1].text


# --- 5. forwarding headers never make a client local ---------------------------------------


def test_a_forged_forwarded_loopback_behind_a_trusted_proxy_is_not_local(start, redis) -> None:
    hub = start("--trusted-proxy", "127.0.0.0/8", "--trusted-proxy", "10.0.0.0/8")
    for forged in ({"X-Forwarded-For": "127.0.0.1, 10.1.2.3"}, {"Forwarded": "for=127.0.0.1"},
                   {"X-Forwarded-For": "127.0.0.1"}):
        answer = fetch(hub.url + "admin/overview", headers=forged)
        assert answer.status == 403 and "127.0.0.1" in answer.text, (forged, answer.text)
        answer = publish(hub.url, notification(), headers=forged)
        assert answer.status == 403, (forged, answer.text)
    assert stored_bodies(redis) == []
    # a trusted proxy that names nobody is no operator either
    assert fetch(hub.url + "admin/overview").status == 403


# --- 7. a lease asked for "as long as possible" --------------------------------------------


def test_an_eleven_digit_lease_is_clamped_not_refused(start, redis, recorder) -> None:
    hub = start("--lease-max", "5000", "--lease-default", "3600", workers=1)
    answer = subscribe(hub.url, recorder.url(), **{"hub.lease_seconds": "10000000000"})
    assert answer.status == 202, answer.text
    wait_until(lambda: recorder.verifications(), what="the verification")
    assert recorder.verifications()[0].query["hub.lease_seconds"] == "5000"
    answer = subscribe(hub.url, recorder.url("/other"), **{"hub.lease_seconds": "1" * 21})
    assert answer.status == 400 and "at most 20 digits" in answer.text, answer.text

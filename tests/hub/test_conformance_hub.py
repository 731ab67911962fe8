"""WebSub hub requirements an outside conformance suite (websub.rocks-like, with the ResourceSync
Change Notification overlay) checks, item by item (shared/spec/websub-checklist.md), against
`rsnotify hub` as a user runs it: its own embedded Redis, its own workers, loopback callbacks.

Only what the rest of tests/hub does not already prove: each test names its checklist items."""
from __future__ import annotations

import hashlib
import hmac
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import pytest
import redis as redis_lib
from aiohttp import web

from rsnotify.hub import keys
from rsnotify.websub import (
    SEQUENCE_HEADER,
    SIGNATURE_HEADER,
    links_by_rel,
    parse_link_header,
)
from tests.support.http import http
from tests.support.hubproc import HubProcess, start_hub
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import wait_until

NOTIFICATION = (Path(__file__).resolve().parents[1] / "fixtures" / "change-notification-1.0.1"
                / "notification_ex_1.xml").read_bytes()
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """One `rsnotify hub` for the module (embedded Redis, two workers), retrying quickly."""
    workdir = tmp_path_factory.mktemp("conformance-hub")
    started = start_hub(workdir, workers=2, env={"RSNOTIFY_RETRY_BASE": "0.2", "RSNOTIFY_RETRY_CAP": "0.5",
                                                  "RSNOTIFY_LOG_LEVEL": "WARNING"})
    yield started
    started.stop()


@pytest.fixture(scope="module")
def redis(hub: HubProcess) -> Iterator[redis_lib.Redis]:
    """The hub's own Redis (its data dir's socket), to see when a subscription is active."""
    client = redis_lib.Redis.from_url(f"unix://{hub.data_dir / 'redis.sock'}", decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="module")
def sink() -> Iterator[RecordingSubscriber]:
    recorder = RecordingSubscriber()
    server = recorder.serve_in_thread()
    yield recorder
    server.stop()


def post_pairs(hub: HubProcess, pairs: list[tuple[str, str]]) -> tuple[int, bytes]:
    return http("POST", hub.url, urllib.parse.urlencode(pairs).encode(), FORM)


def subscribe(hub: HubProcess, topic: str, callback: str, **extra: str) -> None:
    pairs = [("hub.mode", "subscribe"), ("hub.topic", topic), ("hub.callback", callback),
             *((f"hub.{name}", value) for name, value in extra.items())]
    status, body = post_pairs(hub, pairs)
    assert status == 202, body


def subscription(redis: redis_lib.Redis, topic: str, callback: str) -> dict[str, str]:
    """The hub's record of (topic, callback): {} while there is none."""
    return redis.hgetall(keys.sub_key(keys.subscription_id(topic, callback)))


def wait_active(redis: redis_lib.Redis, topic: str, callback: str, lease_seconds: str) -> dict[str, str]:
    """Until the subscription holds `lease_seconds` (each step of a test asks for another lease,
    so this tells one verified request from the one before)."""
    wait_until(lambda: subscription(redis, topic, callback).get("lease_seconds") == lease_seconds, 30,
               f"the subscription with lease {lease_seconds}")
    return subscription(redis, topic, callback)


def publish(hub: HubProcess, topic: str, content_type: str = "application/xml") -> None:
    link = f'<{topic}>; rel="self", <{hub.url}>; rel="hub"'
    status, body = http("POST", hub.url, NOTIFICATION, {"Content-Type": content_type, "Link": link})
    assert status == 200, body


def echo_with(status: int = 200, body: str | None = None, *, before: str = "", after: str = "",
              headers: dict[str, str] | None = None):
    """A verification answer: `status` with the challenge (or `body`) between `before` and `after`."""
    def answer(request: web.Request) -> web.Response:
        text = request.query.get("hub.challenge", "") if body is None else body
        return web.Response(status=status, text=before + text + after, headers=headers)
    return answer


# --- H-14: hub.lease_seconds is ignored in unsubscription requests -------------------------------


def test_h14_an_unsubscribe_with_any_hub_lease_seconds_is_accepted_and_verified(hub, redis, sink) -> None:
    topic = "http://source.example.org/h14/changes"
    callback = sink.url("/h14")
    subscribe(hub, topic, callback, lease_seconds="1000")
    wait_active(redis, topic, callback, "1000")
    # a value no subscribe could carry, given twice with different values: neither is read
    status, body = post_pairs(hub, [("hub.mode", "unsubscribe"), ("hub.topic", topic), ("hub.callback", callback),
                                    ("hub.lease_seconds", "not a number"), ("hub.lease_seconds", "-5"),
                                    ("hub.secret", "x" * 300)])
    assert status == 202, body
    wait_until(lambda: subscription(redis, topic, callback) == {}, 30, "the unsubscription")
    unsubscribe = sink.verifications("/h14")[-1]
    assert unsubscribe.query["hub.mode"] == "unsubscribe" and unsubscribe.query["hub.topic"] == topic


# --- H-06 / H-25: parameters are decoded; the callback's own query string is kept ---------------


def test_h06_percent_encoded_parameters_are_decoded_and_h25_the_callback_query_kept(hub, redis, sink) -> None:
    topic = "http://source.example.org/h06/~data-set_1.x/changes?f=a%20b"
    callback = sink.url("/h06/~cb") + "?token=a%2Fb&hub.mode=mine"
    # every byte percent-encoded, unreserved ones (letters, ~ - . _) included
    body = "&".join(f"{''.join(f'%{b:02X}' for b in name.encode())}={''.join(f'%{b:02X}' for b in value.encode())}"
                    for name, value in (("hub.mode", "subscribe"), ("hub.topic", topic), ("hub.callback", callback),
                                        ("hub.lease_seconds", "1001")))
    status, answer = http("POST", hub.url, body.encode(), FORM)
    assert status == 202, answer
    record = wait_active(redis, topic, callback, "1001")
    assert record["topic"] == topic and record["callback"] == callback
    [verification] = sink.verifications("/h06/~cb")
    assert verification.raw_query.startswith("token=a%2Fb&hub.mode=mine&")      # kept byte for byte, first
    params = urllib.parse.parse_qsl(verification.raw_query)
    assert ("hub.mode", "mine") in params and ("hub.mode", "subscribe") in params  # not overwritten
    assert ("hub.topic", topic) in params
    publish(hub, topic)
    wait_until(lambda: sink.deliveries("/h06/~cb"), 30, "the delivery")
    assert sink.deliveries("/h06/~cb")[0].raw_query == "token=a%2Fb&hub.mode=mine"


# --- H-34, H-35, H-36: what every delivery carries, retries included ------------------------------


def test_h34_h35_h36_every_delivery_has_the_published_type_both_links_and_a_lower_hex_hmac(hub, redis, sink) -> None:
    topic = "http://source.example.org/h36/changes"
    callback = sink.url("/h36")
    secret = "s3cr\u00e9t \u2713"
    seen: list[tuple[str, list[str], str, bytes]] = []

    def record(request_headers, data: bytes) -> None:
        seen.append((request_headers.get("Content-Type", ""), request_headers.getall("Link", []),
                     request_headers.get(SIGNATURE_HEADER, ""), data))

    async def first_fails(request: web.Request) -> int:
        record(request.headers, await request.read())
        return 500 if len(seen) == 1 else 204       # the first attempt fails: its retry counts too

    sink.on("/h36", first_fails)
    subscribe(hub, topic, callback, secret=secret, lease_seconds="1002")
    wait_active(redis, topic, callback, "1002")
    types = ["application/xml", "application/xml; charset=UTF-8", "application/xml;charset=utf-8"]
    for content_type in types:
        publish(hub, topic, content_type)
    wait_until(lambda: len(seen) >= 4, 30, "three deliveries and one retry")
    time.sleep(0.5)                                  # nothing more comes: 2xx ended each one
    assert [t for t, *_ in seen] == [types[0], *types]  # H-34: the type exactly as published
    for _, links, signature, data in seen:
        assert data == NOTIFICATION
        parsed = parse_link_header(links)
        assert links_by_rel(parsed, "self") == [topic] and links_by_rel(parsed, "hub") == [hub.url]
        assert len(links) == 1                      # H-35 SHOULD: one combined Link header
        digest = hmac.new(secret.encode("utf-8"), data, hashlib.sha256).hexdigest()
        assert signature == f"sha256={digest}"      # H-36: method=lower-case hex of the exact body


# --- H-16, H-17: a renewal replaces the secret only once verified, and never duplicates -----------


class Publisher:
    """Publishes to `topic` every `every` s from a thread until stopped: a busy topic, whose
    subscriptions a worker keeps claimed between publishes."""

    def __init__(self, hub: HubProcess, topic: str, every: float = 0.05) -> None:
        self.hub, self.topic, self.every = hub, topic, every
        self.count = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            publish(self.hub, self.topic)
            self.count += 1

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(30)


def signed_with(recorded, secret: bytes | None) -> bool:
    header = recorded.headers.get(SIGNATURE_HEADER)
    if secret is None:
        return header is None
    return header == "sha256=" + hmac.new(secret, recorded.body, hashlib.sha256).hexdigest()


def test_h16_h17_a_renewal_changes_the_secret_only_when_verified_even_on_a_busy_topic(hub, redis, sink) -> None:
    topic = "http://source.example.org/h17/changes"
    callback = sink.url("/h17")
    subscribe(hub, topic, callback, secret="old secret", lease_seconds="1003")
    wait_active(redis, topic, callback, "1003")
    with Publisher(hub, topic) as publisher:
        wait_until(lambda: len(sink.deliveries("/h17")) >= 5, 30, "deliveries of the busy topic")
        # a renewal with a new secret whose verification fails: the subscription goes on as it was
        sink.on("/h17", echo_with(body="no"), method="GET")
        before = len(sink.verifications("/h17"))
        subscribe(hub, topic, callback, secret="new secret", lease_seconds="1004")
        wait_until(lambda: len(sink.verifications("/h17")) > before, 30, "the renewal's verification")
        refused_at = time.time()
        time.sleep(1.0)
        # a verified renewal without a secret: from then on deliveries come unsigned (H-37)
        del sink.answers[("/h17", "GET")]
        subscribe(hub, topic, callback, lease_seconds="1005")
        wait_active(redis, topic, callback, "1005")
        verified_at = time.time()
        # deliveries past the moment the renewal must have been applied by (a fixed 2.5 s before:
        # 1.75 s quiet, and a loaded machine's slow publishes no longer leave the window empty)
        wait_until(lambda: sum(d.at > verified_at + 1.5 for d in sink.deliveries("/h17")) >= 5, 30,
                   "deliveries after the renewal")
    wait_until(lambda: len(sink.deliveries("/h17")) >= publisher.count, 30, "every publish delivered")
    deliveries = sink.deliveries("/h17")
    sequences = [int(d.headers[SEQUENCE_HEADER]) for d in deliveries]
    assert sorted(sequences) == list(range(1, publisher.count + 1))   # each once (rocks 103): one subscription
    assert redis.scard(keys.topic_subs_key(keys.topic_id(topic))) == 1
    assert all(signed_with(d, b"old secret") for d in deliveries if d.at < refused_at + 1.0)
    # the hub applies a verified renewal within a moment (its workers' next look), not at their next claim
    late = [d for d in deliveries if d.at > verified_at + 1.5]
    assert late and all(signed_with(d, None) for d in late), [d.headers.get(SIGNATURE_HEADER) for d in late]


# --- H-27: only a 2xx whose body is exactly the challenge verifies --------------------------------


VERIFICATION_ANSWERS = {
    "created": (echo_with(201), True),              # any 2xx with the exact echo
    "non-authoritative": (echo_with(203), True),
    "leading-space": (echo_with(before=" "), False),
    "crlf": (echo_with(after="\r\n"), False),
    "quoted": (echo_with(before='"', after='"'), False),
    "no-content": (echo_with(204, body=""), False),
    "temporary-redirect": (echo_with(307, body="", headers={"Location": "/h27/echo"}), False),
    "permanent-redirect": (echo_with(308, body="", headers={"Location": "/h27/echo"}), False),
    "gone": (echo_with(410), False),                # the echo in a non-2xx answer
}


def test_h27_only_a_2xx_with_exactly_the_challenge_verifies(hub, redis, sink) -> None:
    topic = "http://source.example.org/h27/changes"
    for name, (answer, _) in VERIFICATION_ANSWERS.items():
        sink.on(f"/h27/{name}", answer, method="GET")
        subscribe(hub, topic, sink.url(f"/h27/{name}"), lease_seconds="1006")
    for name in VERIFICATION_ANSWERS:
        wait_until(lambda name=name: sink.verifications(f"/h27/{name}"), 30, f"the verification of {name}")
    wait_active(redis, topic, sink.url("/h27/created"), "1006")
    wait_active(redis, topic, sink.url("/h27/non-authoritative"), "1006")
    time.sleep(1.0)                                  # the refused ones had as long to be applied
    for name, (_, verifies) in VERIFICATION_ANSWERS.items():
        assert bool(subscription(redis, topic, sink.url(f"/h27/{name}"))) is verifies, name
    assert sink.seen("/h27/echo") == []               # a redirect is never followed


# --- H-18, H-23: a verified unsubscription ends the deliveries, busy topic or not -------------------


def test_h18_a_verified_unsubscription_stops_the_deliveries_of_a_busy_topic(hub, redis, sink) -> None:
    topic = "http://source.example.org/h18/changes"
    callback = sink.url("/h18")
    subscribe(hub, topic, callback, lease_seconds="1007")
    wait_active(redis, topic, callback, "1007")
    with Publisher(hub, topic):
        wait_until(lambda: len(sink.deliveries("/h18")) >= 5, 30, "deliveries of the busy topic")
        status, body = post_pairs(hub, [("hub.mode", "unsubscribe"), ("hub.topic", topic), ("hub.callback", callback)])
        assert status == 202, body
        wait_until(lambda: subscription(redis, topic, callback) == {}, 30, "the unsubscription")
        removed_at = time.time()
        time.sleep(2.5)
    assert [d for d in sink.deliveries("/h18") if d.at > removed_at + 1.5] == []


# --- H-02, H-09: a form in any spelling of its media type is a subscription request ----------------


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded; charset=UTF-8",
                                          "Application/X-WWW-Form-URLEncoded",
                                          "application/x-www-form-urlencoded;charset=utf-8"])
def test_h02_h09_a_form_typed_with_a_charset_or_in_capitals_gets_202(hub, redis, sink, content_type) -> None:
    topic = "http://source.example.org/h02/changes"
    callback = sink.url(f"/h02/{len(content_type)}-{content_type[0]}")
    form = urllib.parse.urlencode({"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": callback,
                                   "hub.lease_seconds": "1008"}).encode()
    status, body = http("POST", hub.url, form, {"Content-Type": content_type})
    assert status == 202, body
    wait_active(redis, topic, callback, "1008")

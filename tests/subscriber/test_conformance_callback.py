"""WebSub subscriber requirements an outside conformance suite (websub.rocks-like) checks at the
callback, item by item (shared/spec/websub-checklist.md), under each adapter and its real server
(aiohttp, ASGI under uvicorn, WSGI in a thread): the hub here is the loopback FakeHub, and the
odd requests are sent with http.client, so the test sees the callback's answer byte for byte.

Only what test_subscriber_callbacks.py and test_subscriber_adapters.py do not already prove."""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import urllib.parse
from collections.abc import Coroutine
from typing import Any

from rsnotify.websub import SIGNATURE_HEADER, build_link_header, sign
from tests.support.http import Response, fetch
from tests.support.subscribers import RecordingSubscriber

from . import test_subscriber_adapters as adapters
from .conftest import make_notification
from .test_subscriber_adapters import TOPIC, Harness, WSGIHarness

harness = adapters.harness      # the fixture: each adapter under its real server


async def on_subscriber_loop(h: Harness, coro: Coroutine[Any, Any, Any]) -> Any:
    """Run `coro` where the subscriber lives (the WSGI runner's own loop, else this one)."""
    if isinstance(h, WSGIHarness):
        return await asyncio.to_thread(h.runner.call, coro)
    return await coro


async def get(callback: str, **params: str) -> Response:
    query = urllib.parse.urlencode({f"hub.{k}": v for k, v in params.items()})
    return await asyncio.to_thread(fetch, f"{callback}?{query}")


async def post(callback: str, body: bytes, headers: dict[str, str]) -> Response:
    return await asyncio.to_thread(fetch, callback, "POST", body, {"Content-Type": "application/xml", **headers})


# --- S-13: the answer to a verification is the challenge, byte for byte ------------------------------


CHALLENGES = [
    "plain-token_123",
    " padded with spaces ",                      # kept: the hub compares without trimming
    "a+b=c&d/e?f%20g#h",                         # reserved characters, percent-encoded on the wire
    "\u00e9t\u00e9 \u2713 \U0001f600",           # non-ASCII: UTF-8 on the wire both ways
    "x" * 400,
]


async def test_s13_the_echo_is_the_challenge_byte_for_byte(harness, fake_hub) -> None:
    subscription = await harness.subscribe(fake_hub.url)
    await fake_hub.settle()
    for challenge in CHALLENGES:
        # a subscription the callback keeps: the hub may verify it again (S-13 allows a renewal it started)
        answer = await get(subscription.callback, mode="subscribe", topic=TOPIC, challenge=challenge,
                           lease_seconds="900")
        assert answer.status == 200, (challenge, answer.text)
        assert answer.body == challenge.encode("utf-8"), challenge
        assert answer.headers["Content-Type"].split(";")[0] == "text/plain"


# --- S-14: hub.lease_seconds is ignored when hub.mode=unsubscribe -----------------------------------


async def test_s14_an_unsubscribe_verification_ignores_hub_lease_seconds(harness, fake_hub) -> None:
    subscription = await harness.subscribe(fake_hub.url)
    await fake_hub.settle()
    store = harness.subscriber.store
    await on_subscriber_loop(harness, store.put(subscription.evolve(pending_mode="unsubscribe")))
    answer = await get(subscription.callback, mode="unsubscribe", topic=TOPIC, challenge="bye",
                       lease_seconds="not a number")
    assert (answer.status, answer.body) == (200, b"bye")
    ended = await on_subscriber_loop(harness, store.get(subscription.id))
    assert ended.status == "unsubscribed"


# --- S-15: a denial counts only for the topic subscribed to -----------------------------------------


async def test_s15_a_denial_of_another_topic_changes_nothing(harness, fake_hub) -> None:
    subscription = await harness.subscribe(fake_hub.url)
    await fake_hub.settle()
    store = harness.subscriber.store
    other = await get(subscription.callback, mode="denied", topic="http://example.com/elsewhere/", reason="no")
    assert other.status == 404
    assert (await on_subscriber_loop(harness, store.get(subscription.id))).status == "active"
    denied = await get(subscription.callback, mode="denied", topic=TOPIC, reason="closed for good")
    assert 200 <= denied.status < 300
    after = await on_subscriber_loop(harness, store.get(subscription.id))
    assert (after.status, after.denial_reason) == ("denied", "closed for good")


# --- S-19: the subscription is the callback's, whatever the Link header says ------------------------


async def test_s19_a_delivery_is_the_callbacks_subscription_whatever_its_link_header_names(harness, fake_hub) -> None:
    subscription = await harness.subscribe(fake_hub.url)
    await fake_hub.settle()
    body = make_notification()
    links = build_link_header([("http://example.com/moved/elsewhere/", "self"), ("http://hub.example.net/", "hub")])
    answer = await post(subscription.callback, body, {"Link": links, SIGNATURE_HEADER: sign(body, subscription.secret)})
    assert answer.status == 200, answer.text
    await harness.drain()
    [received] = harness.recorder.received
    assert (received.subscription_id, received.topic, received.hub) == (subscription.id, TOPIC, fake_hub.url)


# --- S-18, S-20: what is refused, what is taken, and how each is answered ----------------------------


async def test_s18_s20_a_signature_over_other_bytes_or_under_another_method_is_refused(harness, fake_hub) -> None:
    subscription = await harness.subscribe(fake_hub.url)
    await fake_hub.settle()
    body = make_notification()
    key = subscription.secret.encode("utf-8")
    sha256 = hmac.new(key, body, hashlib.sha256).hexdigest()
    refused = {
        "another body": "sha256=" + hmac.new(key, body + b" ", hashlib.sha256).hexdigest(),
        "another method's name": "sha1=" + sha256,
        "no method": sha256,
        "cut short": "sha256=" + sha256[:-2],
    }
    for why, signature in refused.items():
        answer = await post(subscription.callback, body, {SIGNATURE_HEADER: signature})
        assert answer.status == 403, why            # non-2xx: websub.rocks 301/302 expect it
    # hex in upper case is the same HMAC (S-20 advice: compare case-insensitively)
    answer = await post(subscription.callback, body, {SIGNATURE_HEADER: "sha256=" + sha256.upper()})
    assert answer.status == 200, answer.text
    await harness.drain()
    assert [r.body for r in harness.recorder.received] == [body]    # only the good one reached the app
    # a callback that never was, or no longer is, a subscription: 410, never a redirect
    unknown = subscription.callback.rsplit("/", 1)[0] + "/" + "n" * 43
    assert (await post(unknown, body, {SIGNATURE_HEADER: "sha256=" + sha256})).status == 410


# --- S-05, S-09, S-22: the subscription request on the wire -----------------------------------------


async def test_s05_s09_s22_requests_are_utf8_forms_with_the_required_fields(make_subscriber, aiohttp_server) -> None:
    hub = RecordingSubscriber(default_status=202)    # a hub that takes every request and verifies none
    server = await aiohttp_server(hub.app(), host="127.0.0.1")
    hub.base = str(server.make_url("")).rstrip("/")
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, hub.url("/hub"), lease_seconds=900, wait=False)
    await subscriber.unsubscribe(await subscriber.store.get(subscription.id) or subscription, wait=False)
    subscribe_post, unsubscribe_post = hub.deliveries("/hub")
    for sent in (subscribe_post, unsubscribe_post):
        assert sent.headers["Content-Type"].split(";")[0].strip() == "application/x-www-form-urlencoded"
        sent.body.decode("utf-8")                                      # UTF-8, not multipart
    form = dict(urllib.parse.parse_qsl(subscribe_post.body.decode("utf-8"), strict_parsing=True))
    assert form["hub.mode"] == "subscribe" and form["hub.topic"] == TOPIC
    assert form["hub.callback"] == subscription.callback and form["hub.lease_seconds"] == "900"
    assert 0 < len(form["hub.secret"].encode("utf-8")) < 200
    ended = dict(urllib.parse.parse_qsl(unsubscribe_post.body.decode("utf-8"), strict_parsing=True))
    assert ended == {"hub.mode": "unsubscribe", "hub.topic": TOPIC, "hub.callback": subscription.callback}

"""A callback whose path or query is in another script (`/rückruf?für=ü`) is verified and
delivered to, at the same percent-encoded UTF-8 bytes each time, by a subscriber on aiohttp.
Before, the verification GET put raw UTF-8 in its request line, which aiohttp's parser answers
400: such a subscription could never be verified (its deliveries were percent-encoded). The
rest of the callback keeps its exact bytes (`%41` stays `%41`). A real hub process and a real
aiohttp subscriber."""
from __future__ import annotations

import urllib.parse

from aiohttp import web

from tests.support.http import http as http_request
from tests.support.notifications import ONE_CHANGE, TOPIC
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import wait_until

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_a_non_ascii_callback_is_verified_and_delivered_to_at_the_same_bytes(hub_process) -> None:
    hub = hub_process()
    subscriber = RecordingSubscriber()
    server = subscriber.serve_in_thread()
    try:
        callback = subscriber.url("/rückruf?für=ü&keep=%41")
        form = urllib.parse.urlencode({"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": callback})
        status, body = http_request("POST", hub.url, form.encode(), FORM)
        assert status == 202, body
        hub.wait_for_output(r"subscription [0-9a-f]{32} (activated|not verified)|not verified", 30.0)
        [verification] = subscriber.verifications()
        assert verification.path == "/rückruf" and verification.query["für"] == "ü"
        assert verification.raw_query.startswith("f%C3%BCr=%C3%BC&keep=%41&hub.mode=subscribe"), verification.raw_query
        assert "activated" in hub.output()
        link = f'<{TOPIC}>; rel="self", <{hub.url}>; rel="hub"'
        status, body = http_request("POST", hub.url, ONE_CHANGE, {"Content-Type": "application/xml", "Link": link})
        assert status == 200, body
        wait_until(lambda: subscriber.deliveries(), 30.0, "the delivery")
        [delivery] = subscriber.deliveries()
        assert delivery.path == "/rückruf" and delivery.raw_query == "f%C3%BCr=%C3%BC&keep=%41", delivery.raw_query
        assert delivery.body == ONE_CHANGE
    finally:
        server.stop()


def test_a_thin_pings_topic_is_fetched_at_its_exact_bytes(hub_process) -> None:
    """yarl's quoting fetched `?sig=a%2Fb&x=%41` as `?sig=a/b&x=A` (another URL to a server that
    signs its URLs), and a non-ASCII path must go out percent-encoded."""
    hub = hub_process()
    source = RecordingSubscriber()

    async def topic(request: web.Request) -> web.Response:
        return web.Response(body=ONE_CHANGE, content_type="application/xml")
    source.on("/thémas/changes", topic, method="GET")
    server = source.serve_in_thread()
    try:
        topic_url = source.url("/thémas/changes?sig=a%2Fb&x=%41")
        form = urllib.parse.urlencode({"hub.mode": "publish", "hub.url": topic_url})
        status, body = http_request("POST", hub.url, form.encode(), FORM)
        assert status == 202, body
        wait_until(lambda: source.verifications("/thémas/changes"), 30.0, "the fetch")
        [fetch] = source.verifications("/thémas/changes")
        assert fetch.raw_query == "sig=a%2Fb&x=%41", fetch.raw_query
        hub.wait_for_output(r"fetched .* for a thin ping: notification", 30.0)
    finally:
        server.stop()


def test_a_non_ascii_topic_goes_out_percent_encoded_in_the_deliveries_link_header(hub_process) -> None:
    """A header carries URIs (RFC 8288): raw UTF-8 there reads as Latin-1 in a WSGI app (Flask,
    Django), so `tøpic` arrived as `tÃ¸pic`."""
    hub = hub_process()
    subscriber = RecordingSubscriber()
    server = subscriber.serve_in_thread()
    try:
        topic = "http://data.example.org/tøpic"
        form = urllib.parse.urlencode({"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": subscriber.url("/cb")})
        assert http_request("POST", hub.url, form.encode(), FORM)[0] == 202
        hub.wait_for_output(r"subscription [0-9a-f]{32} activated", 30.0)
        link = f'<{topic}>; rel="self", <{hub.url}>; rel="hub"'
        status, body = http_request("POST", hub.url, ONE_CHANGE, {"Content-Type": "application/xml",
                                                             "Link": link.encode().decode("latin-1")})
        assert status == 200, body
        wait_until(lambda: subscriber.deliveries("/cb"), 30.0, "the delivery")
        [delivery] = subscriber.deliveries("/cb")
        assert delivery.headers["Link"] == f'<http://data.example.org/t%C3%B8pic>; rel="self", <{hub.url}>; rel="hub"'
    finally:
        server.stop()

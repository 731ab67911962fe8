"""A subscribe/unsubscribe form (or any hub.mode) that repeats a field with different values is
refused with a 400 naming the field, and nothing is queued: which value counts would otherwise
depend on the parser, and a proxy in front of the hub may read another one. The same value
twice is harmless and accepted. A POST without Content-Type is told so in words."""
from __future__ import annotations

import http.client
import urllib.parse

import pytest

from tests.support.http import http as http_request
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import wait_until

TOPIC = "http://data.example.org/ds1/changes"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def post(hub_url: str, pairs: list[tuple[str, str]]) -> tuple[int, bytes]:
    return http_request("POST", hub_url, urllib.parse.urlencode(pairs).encode(), FORM, 10.0)


@pytest.mark.parametrize("field", ["hub.mode", "hub.topic", "hub.callback", "hub.lease_seconds", "hub.secret"])
def test_a_field_repeated_with_different_values_is_400_and_queues_nothing(hub_process, field) -> None:
    hub = hub_process()
    pairs = [("hub.mode", "subscribe"), ("hub.topic", TOPIC), ("hub.callback", "http://127.0.0.1:9/a"),
             ("hub.lease_seconds", "600"), ("hub.secret", "s3cret")]
    other = {"hub.mode": "publish", "hub.topic": TOPIC + "2", "hub.callback": "http://127.0.0.1:9/b",
             "hub.lease_seconds": "700", "hub.secret": "other"}[field]
    status, body = post(hub.url, [*pairs, (field, other)])
    assert status == 400, body
    assert f"{field} is given 2 times with different values".encode() in body
    assert "verification queued" not in hub.output()


def test_the_same_value_twice_is_accepted_and_verified(hub_process) -> None:
    hub = hub_process()
    subscriber = RecordingSubscriber()
    server = subscriber.serve_in_thread()
    try:
        callback = subscriber.url("/twice")
        status, body = post(hub.url, [("hub.mode", "subscribe"), ("hub.mode", "subscribe"), ("hub.topic", TOPIC),
                                      ("hub.callback", callback), ("hub.callback", callback)])
        assert status == 202, body
        wait_until(lambda: subscriber.verifications("/twice"), 30.0, "the verification")
        assert subscriber.verifications("/twice")[0].query["hub.mode"] == "subscribe"
    finally:
        server.stop()


def test_a_post_without_content_type_says_so(hub_process) -> None:
    hub = hub_process()
    connection = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    try:   # http.client sends no Content-Type unless told (urllib would add a form type)
        connection.request("POST", "/", body=b"", headers={"Content-Length": "0"})
        answer = connection.getresponse()
        status, body = answer.status, answer.read()
    finally:
        connection.close()
    assert status == 415, body
    assert body.decode().rstrip().endswith("got no Content-Type"), body

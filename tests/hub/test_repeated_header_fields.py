"""Header fields that mean one thing are refused when repeated (400 naming the field, like a
form's repeated fields: which one counts would depend on the reader), and a body in a content
coding the hub does not decode is 415 with the codings it does: before, `Content-Encoding:
x-foo` was stored as if it were identity, `gzip, gzip` got a 400 saying the body "looks like
UTF-16", and two Idempotency-Keys silently used the first. Nothing is stored for any of them.
A real hub process, requests written field by field with http.client."""
from __future__ import annotations

import gzip
import http.client
import itertools
import json
import zlib

import pytest

from tests.support.hubproc import start_hub
from tests.support.notifications import ONE_CHANGE

TOPICS = (f"http://data.example.org/ds{n}/changes" for n in itertools.count())

def send(port: int, fields: list[tuple[str, str]], body: bytes) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest("POST", "/")
        for name, value in [*fields, ("Content-Length", str(len(body)))]:
            connection.putheader(name, value)
        connection.endheaders(body)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def submission_fields(hub_url: str, topic: str) -> list[tuple[str, str]]:
    return [("Content-Type", "application/xml"), ("Link", f'<{topic}>; rel="self", <{hub_url}>; rel="hub"')]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = start_hub(tmp_path_factory.mktemp("hub"))
    yield hub
    hub.stop()


@pytest.fixture
def topic() -> str:
    return next(TOPICS)      # one of its own per test: "sequence 1" says nothing else was stored


@pytest.mark.parametrize(("name", "values"), [
    ("Idempotency-Key", ["key-1", "key-2"]),
    ("Authorization", ["Bearer one", "Bearer two"]),
    ("Content-Encoding", ["identity", "gzip"]),
    ("Origin", ["http://127.0.0.1", "http://evil.example"]),
    ("Sec-Fetch-Site", ["same-origin", "cross-site"]),
])
def test_a_single_valued_field_given_twice_is_400_and_stores_nothing(hub, topic, name, values) -> None:
    status, text = send(hub.port, [*submission_fields(hub.url, topic), *((name, value) for value in values)], ONE_CHANGE)
    assert status == 400, text
    assert text.strip() == f"the {name} header is given 2 times; send it once"
    status, text = send(hub.port, submission_fields(hub.url, topic), ONE_CHANGE)
    assert status == 200 and json.loads(text)["sequence"] == 1, text     # the refused one stored nothing


@pytest.mark.parametrize("coding", ["x-foo", "gzip, gzip", "compress", "gzip;q=1"])
def test_a_content_coding_the_hub_does_not_decode_is_415(hub, topic, coding) -> None:
    status, text = send(hub.port, [*submission_fields(hub.url, topic), ("Content-Encoding", coding)], ONE_CHANGE)
    assert status == 415, text
    assert "is not supported: send the body as it is (identity) or in one of gzip, deflate" in text
    form = [("Content-Type", "application/x-www-form-urlencoded"), ("Content-Encoding", coding)]
    status, text = send(hub.port, form, f"hub.mode=subscribe&hub.topic={topic}&hub.callback=http://127.0.0.1:9/c"
                        .encode())
    assert status == 415, text
    assert f"request for http://127.0.0.1:9/… at {topic} accepted" not in hub.output()
    status, text = send(hub.port, submission_fields(hub.url, topic), ONE_CHANGE)
    assert status == 200 and json.loads(text)["sequence"] == 1, text


def test_identity_and_gzip_bodies_are_still_taken(hub, topic) -> None:
    status, text = send(hub.port, [*submission_fields(hub.url, topic), ("Content-Encoding", "gzip")], gzip.compress(ONE_CHANGE))
    assert status == 200 and json.loads(text)["sequence"] == 1, text
    status, text = send(hub.port, [*submission_fields(hub.url, topic), ("Content-Encoding", "Identity")], ONE_CHANGE)
    assert status == 200 and json.loads(text)["sequence"] == 2, text
    status, text = send(hub.port, [*submission_fields(hub.url, topic), ("Idempotency-Key", "k"),
                                   ("Idempotency-Key", "k")], ONE_CHANGE)
    assert status == 400, text      # the same value twice too: one field, one value


@pytest.mark.parametrize("content_type", ["application/xml; charset=utf-8; charset=latin1",
                                          "application/xml; Charset=utf-8; charset=utf-8"])
def test_a_content_type_parameter_given_twice_is_400_and_stores_nothing(hub, topic, content_type) -> None:
    fields = [("Content-Type", content_type), ("Link", f'<{topic}>; rel="self", <{hub.url}>; rel="hub"')]
    status, text = send(hub.port, fields, ONE_CHANGE)
    assert status == 400, text
    assert text.strip() == "the Content-Type parameter charset is given 2 times; send it once"
    status, text = send(hub.port, submission_fields(hub.url, topic), ONE_CHANGE)
    assert status == 200 and json.loads(text)["sequence"] == 1, text


@pytest.mark.parametrize("transfer", ["gzip, chunked", "deflate, chunked"])
def test_a_transfer_coding_other_than_chunked_is_400_and_stores_nothing(hub, topic, transfer) -> None:
    """aiohttp reads "gzip, chunked" as chunked and leaves the gzip on: before, the body got
    a 400 saying it "looks like UTF-16"."""
    packed = gzip.compress(ONE_CHANGE) if transfer.startswith("gzip") else zlib.compress(ONE_CHANGE)
    connection = http.client.HTTPConnection("127.0.0.1", hub.port, timeout=10)
    try:
        connection.putrequest("POST", "/")
        for name, value in [*submission_fields(hub.url, topic), ("Transfer-Encoding", transfer)]:
            connection.putheader(name, value)
        connection.endheaders(b"%x\r\n" % len(packed) + packed + b"\r\n0\r\n\r\n")
        answer = connection.getresponse()
        status, text = answer.status, answer.read().decode()
    finally:
        connection.close()
    assert status == 400, text
    assert text.startswith(f"Transfer-Encoding {transfer!r} is not supported"), text
    status, text = send(hub.port, submission_fields(hub.url, topic), ONE_CHANGE)
    assert status == 200 and json.loads(text)["sequence"] == 1, text

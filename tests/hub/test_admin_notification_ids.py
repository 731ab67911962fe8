"""A notification id in an admin URL that is no Redis stream id (a part over 64 bits, a sign,
an underscore, another script's digits) is a 400 saying what an id looks like. Before,
int() took them and Redis refused the XRANGE: the hub answered 503 "storage unavailable" and
logged an ERROR, as in a real outage. A real hub process."""
from __future__ import annotations

import json
import urllib.parse

import pytest

from rsnotify.hub import keys
from tests.support.http import http as http_request
from tests.support.hubproc import start_hub
from tests.support.notifications import ONE_CHANGE, TOPIC

SID = "0" * 32
BAD_IDS = ["99999999999999999999999-0", "18446744073709551616-0", "1-18446744073709551616", "+1-0", "1_000-0",
           "\u0661-0", "1-", "-1", "1-2-3"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = start_hub(tmp_path_factory.mktemp("hub"))
    yield hub
    hub.stop()


def test_a_malformed_notification_id_is_400_on_every_admin_route(hub) -> None:
    link = f'<{TOPIC}>; rel="self", <{hub.url}>; rel="hub"'
    status, body = http_request("POST", hub.url, ONE_CHANGE, {"Content-Type": "application/xml", "Link": link})
    assert status == 200, body
    tid = keys.topic_id(TOPIC)
    for nid in BAD_IDS:
        quoted = urllib.parse.quote(nid)
        for method, path in (("GET", f"admin/topics/{tid}/notifications/{quoted}"),
                             ("GET", f"admin/subscriptions/{SID}/dead-letters/{quoted}"),
                             ("POST", f"admin/subscriptions/{SID}/dead-letters/{quoted}/resend")):
            status, text = http_request(method, hub.url + path, b"{}" if method == "POST" else None,
                                        {"Content-Type": "application/json"})
            assert status == 400, (nid, path, status, text)
            assert b"a notification id looks like 1700000000000-0" in text, text
    assert "storage unavailable" not in hub.output()


def test_well_formed_ids_still_reach_the_log(hub) -> None:
    tid = keys.topic_id(TOPIC)
    status, text = http_request("GET", hub.url + f"admin/topics/{tid}/notifications/18446744073709551615-0")
    assert status == 404 and b"no notification 18446744073709551615-0" in text, text
    status, text = http_request("GET", hub.url + f"admin/topics/{tid}/notifications/0")
    assert status == 404, text


def test_topics_by_url_counts_what_it_lists(hub) -> None:
    """?url= of a topic the hub never saw: total 0 (it said 1 beside an empty list)."""
    status, text = http_request("GET", hub.url + "admin/topics?url=" + urllib.parse.quote("http://never.example/x"))
    assert status == 200 and json.loads(text) == {"total": 0, "offset": 0, "topics": []}, text
    link = f'<{TOPIC}>; rel="self", <{hub.url}>; rel="hub"'
    assert http_request("POST", hub.url, ONE_CHANGE, {"Content-Type": "application/xml", "Link": link})[0] == 200
    status, text = http_request("GET", hub.url + "admin/topics?url=" + urllib.parse.quote(TOPIC))
    found = json.loads(text)
    assert status == 200 and found["total"] == 1 and [t["url"] for t in found["topics"]] == [TOPIC], text

"""A body sent with `Content-Encoding: gzip` that is not gzip (a submission or a subscription
form) is a 400 naming the problem, not a 500 with a traceback in the hub's log; real gzip is read."""
from __future__ import annotations

import gzip
import urllib.parse

from tests.support.http import get_json, http

TOPIC = "http://data.example.org/ds1/changes"
NOTIFICATION = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
<rs:md capability="changelist-notification" from="2026-01-01T00:00:00Z" until="2026-01-01T00:00:01Z"/>
<url><loc>http://data.example.org/ds1/a</loc><rs:md change="updated" datetime="2026-01-01T00:00:00Z"/></url>
</urlset>"""


def submit(hub_url: str, body: bytes, encoding: str) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/xml", "Content-Encoding": encoding,
               "Link": f'<{TOPIC}>; rel="self", <{hub_url}>; rel="hub"'}
    return http("POST", hub_url, body, headers)


def test_a_body_that_is_not_the_gzip_it_claims_is_400_and_stores_nothing(hub_process) -> None:
    hub = hub_process()
    status, body = submit(hub.url, NOTIFICATION, "gzip")
    assert status == 400, body
    assert b"cannot be read as sent" in body and b"gzip" in body, body
    form = urllib.parse.urlencode({"hub.mode": "subscribe", "hub.topic": TOPIC,
                                   "hub.callback": "http://127.0.0.1:9/cb"}).encode()
    status, body = http("POST", hub.url, form, {"Content-Type": "application/x-www-form-urlencoded",
                                                "Content-Encoding": "gzip"})
    assert status == 400 and b"the form cannot be read as sent" in body, body
    assert get_json(hub.url + "admin/topics")[1]["topics"] == []
    assert "Traceback" not in hub.output() and "internal error" not in hub.output()
    status, body = submit(hub.url, gzip.compress(NOTIFICATION), "gzip")
    assert status == 200, body
    assert len(get_json(hub.url + "admin/topics")[1]["topics"]) == 1

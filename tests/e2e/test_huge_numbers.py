"""Numbers of thousands of digits where a number is expected (int() refuses past 4,300 digits
with a ValueError) never escape as a 500 or a traceback: a `length` in a submission is a 400 at
the hub, and one in a hostile Source's Resource List is one line from `rsnotify sync` (exit 1). A length past
2**63 (what SQLite stores) is refused the same way. (The callback's side:
tests/subscriber/test_callback_reasons.py.) Digits are ASCII digits: a datetime in fullwidth
digits is refused too."""
from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from tests.support import cli
from tests.support.http import http
from tests.support.servers import ThreadedServer

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"'
TOPIC = "http://data.example.org/ds1/changes"


def notification(length: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>'
            '<rs:md capability="changelist-notification" from="2026-01-01T00:00:00Z" until="2026-01-01T00:00:01Z"/>'
            f'<url><loc>http://data.example.org/ds1/a</loc><rs:md change="updated" '
            f'datetime="2026-01-01T00:00:00Z" length="{length}"/></url></urlset>').encode()


@pytest.mark.parametrize("digits", [5000, 25])
def test_the_hub_refuses_a_length_of_many_digits_with_400(hub_process, digits) -> None:
    hub = hub_process()
    status, body = http("POST", hub.url, notification("9" * digits), {
        "Content-Type": "application/xml", "Link": f'<{TOPIC}>; rel="self", <{hub.url}>; rel="hub"'})
    assert status == 400, body
    assert b"expected a non-negative integer (bytes) below 2**63" in body and len(body) < 600, body
    assert "Traceback" not in hub.output()


def hostile_source(length: str) -> ThreadedServer:
    documents: dict[str, str] = {}

    async def handle(request: web.Request) -> web.Response:
        if request.path in documents:
            return web.Response(text=documents[request.path], content_type="application/xml")
        return web.Response(text="content")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    server = ThreadedServer(app).start()
    base = server.base
    documents["/capabilitylist.xml"] = (
        f'<urlset {NS}><rs:md capability="capabilitylist"/>'
        f'<url><loc>{base}/resourcelist.xml</loc><rs:md capability="resourcelist"/></url></urlset>')
    documents["/resourcelist.xml"] = (
        f'<urlset {NS}><rs:md capability="resourcelist" at="2026-01-01T00:00:00Z"/>'
        f'<url><loc>{base}/a</loc><rs:md length="{length}"/></url></urlset>')
    return server


def test_sync_reports_a_hostile_length_in_one_line(tmp_path: Path) -> None:
    server = hostile_source("9" * 5000)
    try:
        result = cli.run("sync", "--capability-list", server.base + "/capabilitylist.xml",
                         "--dir", str(tmp_path / "copy"), "--once")
    finally:
        server.stop()
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "expected a non-negative integer (bytes) below 2**63" in result.stderr, result.stderr



def test_the_hub_refuses_a_datetime_written_with_non_ascii_digits(hub_process) -> None:
    # Python's \d matched "２０２６" (fullwidth) and int() read it: stored and relayed to clients
    # whose XML Schema parsers refuse it
    hub = hub_process()
    body = notification("5").replace(b'datetime="2026-01-01T00:00:00Z"',
                                     'datetime="２０２６-01-01T00:00:00Z"'.encode())
    status, answer = http("POST", hub.url, body, {
        "Content-Type": "application/xml", "Link": f'<{TOPIC}>; rel="self", <{hub.url}>; rel="hub"'})
    assert status == 400, answer
    assert "expected a W3C datetime" in answer.decode(), answer

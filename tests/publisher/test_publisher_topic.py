"""The topic URI helpers answer HEAD/GET as spec §4.1 says, served for real: the aiohttp
handler in an aiohttp server, the WSGI app under wsgiref, the ASGI app under uvicorn."""
from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from aiohttp import web

from rsnotify.publisher import Publisher, Topic, add_topic_route, asgi_topic_app, wsgi_topic_app
from rsnotify.websub import links_by_rel, parse_link_header
from rsnotify.xml import parse_notification

TOPIC = "https://example.org/dataset1/change/"
HUBS = ["https://hub.example.org/websub/", "https://hub2.example.org/"]
CAPLIST = "https://example.org/dataset1/capabilitylist.xml"
BODY = b"""<?xml version='1.0' encoding='UTF-8'?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
<rs:md capability="change-notification" from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>
<url><loc>http://example.com/res1</loc><rs:md change="created" datetime="2013-01-03T00:07:22Z"/></url>
</urlset>"""


def request(url: str, method: str) -> tuple[int, dict[str, str], bytes]:
    """A plain urllib request: status, headers (lower-case names), body."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def assert_spec_answer(status: int, headers: dict[str, str], body: bytes, method: str, expected: bytes) -> None:
    assert status == 200
    assert headers["content-type"] == "application/xml"
    links = parse_link_header(headers["link"])
    assert links_by_rel(links, "self") == [TOPIC]
    assert links_by_rel(links, "hub") == HUBS
    assert int(headers["content-length"]) == len(expected)
    assert body == (b"" if method == "HEAD" else expected)


def check_server(url: str, topic: Topic) -> None:
    """Empty topic, then the latest notification; GET and HEAD; other methods get 405."""
    topic.update(None)
    for method in ("GET", "HEAD"):
        assert_spec_answer(*request(url, method), method, b"")
    topic.update(BODY)
    for method in ("GET", "HEAD"):
        assert_spec_answer(*request(url, method), method, BODY)
    status, headers, body = request(url, "POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert headers["content-type"].startswith("text/plain") and b"answers GET and HEAD, got POST" in body


@pytest.fixture
def topic() -> Topic:
    return Topic(TOPIC, HUBS)


async def test_aiohttp_handler_answers_head_and_get_as_the_spec_says(aiohttp_client, topic):
    app = web.Application()
    add_topic_route(app, "/dataset1/change/", topic)
    client = await aiohttp_client(app)
    for body in (None, BODY):
        topic.update(body)
        for method in ("GET", "HEAD"):
            response = await client.request(method, "/dataset1/change/")
            assert_spec_answer(response.status, {k.lower(): v for k, v in response.headers.items()},
                               await response.read(), method, body or b"")
    response = await client.post("/dataset1/change/", data=b"x")
    assert response.status == 405 and response.headers["Allow"] == "GET, HEAD"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:  # keep wsgiref's access log out of test output
        pass


def test_wsgi_app_under_wsgiref(topic):
    server = make_server("127.0.0.1", 0, wsgi_topic_app(topic), handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        check_server(f"http://127.0.0.1:{server.server_port}/dataset1/change/", topic)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def serve_asgi() -> Iterator[Callable[[object], str]]:
    """Serve an ASGI app with uvicorn in a thread; returns its base URL."""
    uvicorn = pytest.importorskip("uvicorn")
    servers = []

    def serve(app: object) -> str:
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 10
        while not server.started:  # bounded wait for uvicorn's own readiness flag
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def test_asgi_app_under_uvicorn(topic, serve_asgi):
    base = serve_asgi(asgi_topic_app(topic))
    check_server(f"{base}/dataset1/change/", topic)


def test_topic_can_serve_what_a_publisher_last_published(threaded_hub, serve_asgi):
    publisher = Publisher(threaded_hub.url, TOPIC, CAPLIST)
    topic = Topic.from_publisher(publisher)
    base = serve_asgi(asgi_topic_app(topic))
    status, headers, body = request(f"{base}/", "GET")
    assert (status, body, headers["content-length"]) == (200, b"", "0")
    publisher.publish_blocking([("https://example.org/a", "updated")])
    status, headers, body = request(f"{base}/", "GET")
    assert body == threaded_hub.received[0].body
    assert [c.loc for c in parse_notification(body).changes] == ["https://example.org/a"]
    assert links_by_rel(parse_link_header(headers["link"]), "hub") == [threaded_hub.url]
    assert links_by_rel(parse_link_header(headers["link"]), "resourcesync") == [CAPLIST]

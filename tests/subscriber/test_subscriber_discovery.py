"""Discovery against loopback topics and Sources: Link headers, HTML, Atom, RSS, priorities,
rel=self, redirects, /.well-known/resourcesync and Capability Lists."""
from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from rsnotify.websub import build_link_header
from rsnotify.subscriber.discovery import (
    discover_capability_list,
    discover_source,
    discover_topic,
)
from rsnotify.subscriber.errors import DiscoveryError

HUB = "http://hub.example.org/websub/"
OTHER_HUB = "http://other-hub.example.org/"
SELF = "http://example.com/dataset1/change/"

HTML = f"""<!DOCTYPE html><html><head><title>t</title>
<link rel="stylesheet" href="/s.css"><link rel="hub" href="{HUB}"><link rel="self" href="{SELF}">
</head><body><link rel="hub" href="{OTHER_HUB}"></body></html>"""
HTML_BODY_ONLY = f"""<!DOCTYPE html><html><head><title>t</title></head>
<body><link rel="hub" href="{HUB}"></body></html>"""
ATOM = f"""<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom"><title>f</title>
<link rel="hub" href="{HUB}"/><link rel="self" href="{SELF}"/>
<entry><link rel="hub" href="{OTHER_HUB}"/></entry></feed>"""
RSS = f"""<?xml version="1.0"?>
<rss version="2.0" xmlns:atom="http://www.w3.org/2005/Atom"><channel><title>r</title>
<atom:link rel="hub" href="{HUB}"/><atom:link rel="self" href="{SELF}"/></channel></rss>"""

CAPABILITY_LIST = """<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:ln rel="up" href="{base}/.well-known/resourcesync"/>
  <rs:md capability="capabilitylist"/>
  <url><loc>{base}/dataset1/resourcelist.xml</loc><rs:md capability="resourcelist"/></url>
  <url><loc>{base}/dataset1/change/</loc><rs:ln rel="hub" href="{hub}"/>
       <rs:md capability="change-notification"/></url>
</urlset>"""
SOURCE_DESCRIPTION = """<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:md capability="description"/>
  <url><loc>{base}/dataset1/capabilitylist.xml</loc><rs:md capability="capabilitylist"/></url>
</urlset>"""


def page(body: str = "", content_type: str = "text/html", links: list[tuple[str, str]] | None = None):
    async def handle(request: web.Request) -> web.Response:
        headers = {"Link": build_link_header(links)} if links else {}
        return web.Response(body=body.encode(), headers={**headers, "Content-Type": content_type})
    return handle


def redirect(status: int, to: str):
    async def handle(request: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": to})
    return handle


@pytest.fixture
async def topics(aiohttp_server):
    app = web.Application()
    routes = {
        "/header": page("", "application/xml", [(SELF, "self"), (HUB, "hub")]),
        "/header-relative": page("", "application/xml", [("/changes", "self"), ("/hub", "hub")]),
        "/html": page(HTML),
        "/html-body-only": page(HTML_BODY_ONLY),
        "/atom": page(ATOM, "application/atom+xml"),
        "/rss": page(RSS, "application/rss+xml"),
        "/priority": page(HTML.replace(HUB, OTHER_HUB), "text/html", [(HUB, "hub"), (SELF, "self")]),
        "/no-self": page(HTML.replace(f'<link rel="self" href="{SELF}">', "")),
        "/plain": page("nothing here", "text/plain"),
        "/moved-301": redirect(301, "/html"),
        "/moved-302": redirect(302, "/header"),
        "/missing": redirect(404, "/"),
    }
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        yield session, (lambda path: str(server.make_url(path)))


@pytest.mark.parametrize("path, found_in", [
    ("/header", "link-header"), ("/html", "html"), ("/atom", "atom"), ("/rss", "rss"),
])
async def test_hub_and_self_are_discovered(topics, path, found_in):
    session, url = topics
    found = await discover_topic(session, url(path))
    assert found.hubs == (HUB,)
    assert found.topic == SELF  # a different rel=self than the URL fetched: subscribe to self
    assert found.found_in == found_in


async def test_link_header_wins_over_links_in_the_body(topics):
    session, url = topics
    found = await discover_topic(session, url("/priority"))
    assert found.hubs == (HUB,) and found.found_in == "link-header"


async def test_html_links_count_only_in_the_head(topics):
    session, url = topics
    found = await discover_topic(session, url("/html"))
    assert OTHER_HUB not in found.hubs
    with pytest.raises(DiscoveryError, match="no hub advertised"):
        await discover_topic(session, url("/html-body-only"))


async def test_relative_links_resolve_against_the_topic(topics):
    session, url = topics
    found = await discover_topic(session, url("/header-relative"))
    assert found.topic == url("/changes") and found.hubs == (url("/hub"),)


async def test_without_rel_self_the_final_url_is_the_topic(topics):
    session, url = topics
    found = await discover_topic(session, url("/no-self"))
    assert found.topic == url("/no-self")


@pytest.mark.parametrize("path, final", [("/moved-301", "/html"), ("/moved-302", "/header")])
async def test_topic_redirects_are_followed(topics, path, final):
    session, url = topics
    found = await discover_topic(session, url(path))
    assert found.url == url(final)
    assert found.topic == SELF and found.hubs == (HUB,)


async def test_discovery_failures_say_what_was_wrong(topics):
    session, url = topics
    with pytest.raises(DiscoveryError, match="no hub advertised.*text/plain"):
        await discover_topic(session, url("/plain"))
    with pytest.raises(DiscoveryError, match="answered 404; expected 200"):
        await discover_topic(session, url("/missing"))
    with pytest.raises(DiscoveryError, match="cannot fetch"):
        await discover_topic(session, "http://127.0.0.1:9/closed")


@pytest.fixture
async def source(aiohttp_server):
    """A Source with /.well-known/resourcesync -> Capability List -> change-notification channel."""
    documents: dict[str, str] = {}

    async def serve(request: web.Request) -> web.Response:
        if request.path not in documents:
            return web.Response(status=404, text="not found")
        return web.Response(body=documents[request.path].encode(), content_type="application/xml")

    app = web.Application()
    app.router.add_get("/{path:.*}", serve)
    server = await aiohttp_server(app)
    base = str(server.make_url("")).rstrip("/")
    capability_list = CAPABILITY_LIST.format(base=base, hub=HUB)
    documents.update({
        "/.well-known/resourcesync": SOURCE_DESCRIPTION.format(base=base),
        "/dataset1/capabilitylist.xml": capability_list,
        "/lenient/capabilitylist.xml": capability_list.replace(
            f'<rs:ln rel="up" href="{base}/.well-known/resourcesync"/>', ""),
        "/nochannel/capabilitylist.xml": capability_list.split(f"<url><loc>{base}/dataset1/change/")[0] + "</urlset>",
    })
    async with aiohttp.ClientSession() as session:
        yield session, base


async def test_channel_is_found_from_the_source_base_url(source):
    session, base = source
    [channel] = await discover_source(session, base + "/")
    assert channel.topic == base + "/dataset1/change/"
    assert channel.hubs == (HUB,)
    assert channel.capability_list == base + "/dataset1/capabilitylist.xml"


async def test_channel_is_found_from_a_capability_list(source):
    session, base = source
    [channel] = await discover_capability_list(session, base + "/dataset1/capabilitylist.xml")
    assert channel.topic == base + "/dataset1/change/" and channel.hubs == (HUB,)


async def test_capability_list_breaking_an_unrelated_rule_still_names_its_channel(source):
    session, base = source
    [channel] = await discover_capability_list(session, base + "/lenient/capabilitylist.xml")
    assert channel.hubs == (HUB,)


async def test_capability_list_without_channel_is_reported(source):
    session, base = source
    with pytest.raises(DiscoveryError, match="advertises no change-notification channel"):
        await discover_capability_list(session, base + "/nochannel/capabilitylist.xml")
    with pytest.raises(DiscoveryError, match="cannot fetch Source Description at http://127.0.0.1:9/.well-known"):
        await discover_source(session, "http://127.0.0.1:9/some/path")

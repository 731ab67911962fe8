"""The publish path's shortcuts (issue 25) take nothing the full checks refuse and give the same
result: a usual <url> read in one go (rsnotify.xml's plain reading), a Link header's answer kept
per header value."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from lxml import etree

from rsnotify import xml
from rsnotify.hub.web import endpoint
from rsnotify.hub.web.appkeys import SETTINGS
from rsnotify.safexml import RS_NS, SITEMAP_NS
from rsnotify.websub import build_link_header

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTIFICATION = (FIXTURES / "change-notification-1.0.1" / "notification_ex_1.xml").read_bytes()
TOPIC = "http://publisher.example/dataset1/change/"

LOCS = ["http://example.org/a", "HTTPS://Example.org/a?b=c", "  http://example.org/padded  ", "http://example.org/a b",
        "http:///no-host", "http:/one-slash", "ftp://example.org/a", "relative/a", "", "http://ex\u00e4mple.org/\u00fc",
        "http://example.org/tab\there", "https://[::1]:8080/x"]
CHANGES = ["created", "updated", "deleted", "Created", "moved", None]
DATETIMES = ["2025-01-01T00:00:05Z", "2025-01-01T02:00:05+02:00", "2025-01-01", "2025-13-01T00:00:00Z",
             "2025-01-01 00:00:05Z", "", None]
HASHES = ["md5:1584abdf8ebdc9802ac0c6a7402c03b6", "md5:a sha-256:b", "md5", ":x", "", "  ", None]
LENGTHS = ["10", " 7 ", "0", "-1", "9223372036854775808", "12a", "\u0661\u0662", "", None]
EXTRAS = [{}, {"type": "text/html"}, {"foo": "bar"}, {f"{{{RS_NS}}}change": "created"}, {"{urn:x}y": "z"}]
SHAPES = ["loc md", "md loc", "loc md lastmod", "loc md ln", "loc", "md", "loc loc md", "loc md md", "loc md other"]


def make_url(rng: random.Random) -> etree._Element:
    """A <url> with a random mix of good and bad parts (good ones only, two times in five)."""
    good = rng.random() < 0.4

    def pick(values: list, good_ones: int) -> object:
        return rng.choice(values[:good_ones] + [None]) if good else rng.choice(values)

    url = etree.Element(f"{{{SITEMAP_NS}}}url", nsmap={None: SITEMAP_NS, "rs": RS_NS})
    for part in rng.choice(SHAPES[:2] if good else SHAPES).split():
        if part == "loc":
            etree.SubElement(url, f"{{{SITEMAP_NS}}}loc").text = rng.choice(LOCS[:3] if good else LOCS)
        elif part == "md":
            md = etree.SubElement(url, f"{{{RS_NS}}}md")
            md.set("change", rng.choice(CHANGES[:3]))
            for name, values, good_ones in (("change", CHANGES, 3), ("datetime", DATETIMES, 3), ("hash", HASHES, 2),
                                            ("length", LENGTHS, 3)):
                value = pick(values, good_ones)
                if value is not None:
                    md.set(name, value)
                elif name == "change" and not good:
                    del md.attrib["change"]
            for name, value in rng.choice(EXTRAS[:2] if good else EXTRAS).items():
                md.set(name, value)
        elif part == "lastmod":
            etree.SubElement(url, f"{{{SITEMAP_NS}}}lastmod").text = "2025-01-01T00:00:01Z"
        elif part == "ln":
            etree.SubElement(url, f"{{{RS_NS}}}ln", rel="describedby", href="http://example.org/meta")
        else:
            etree.SubElement(url, f"{{{SITEMAP_NS}}}priority").text = "0.5"
    return url


def test_a_usual_url_read_in_one_go_is_what_the_step_by_step_reading_gives(monkeypatch):
    rng = random.Random(25)
    urls = [make_url(rng) for _ in range(4000)]
    quick = [xml._read_plain_change(url) for url in urls]
    fast = [(xml.read_change(url, i, problems := []), problems) for i, url in enumerate(urls, 1)]
    monkeypatch.setattr(xml, "_read_plain_change", lambda url, locs=None: None)
    slow = [(xml.read_change(url, i, problems := []), problems) for i, url in enumerate(urls, 1)]
    assert fast == slow
    # both ways were taken, and the quick one only where the step-by-step reading found nothing wrong
    taken = [i for i, change in enumerate(quick) if change is not None]
    assert 1000 < len(taken) < len(urls) - 1000
    assert all(slow[i] == (quick[i], []) for i in taken)
    assert sum(1 for change, problems in slow if change is None and problems) > 1000


def test_a_whole_notification_reads_the_same_either_way(monkeypatch):
    fast = xml.parse_notification(NOTIFICATION)
    monkeypatch.setattr(xml, "_read_plain_notification", lambda root: None)
    assert xml.parse_notification(NOTIFICATION) == fast and fast.changes
    monkeypatch.setattr(xml, "_read_plain_change", lambda url, locs=None: None)
    assert xml.parse_notification(NOTIFICATION) == fast


async def test_a_kept_link_answer_never_lets_a_refused_header_through(hub_client):
    own = hub_client.server.app[SETTINGS].hub_url
    good = build_link_header([(TOPIC, "self"), (own, "hub")])
    other_hub = build_link_header([(TOPIC, "self"), ("http://other-hub.example/", "hub")])
    answers = []
    for link in (other_hub, good, other_hub, good):
        response = await hub_client.post("/", data=NOTIFICATION, headers={"Content-Type": "application/xml", "Link": link})
        answers.append((response.status, await response.text()))
    assert [status for status, _ in answers] == [400, 200, 400, 200]
    assert answers[0] == answers[2] and "must name this hub" in answers[0][1]
    assert answers[1][1] != answers[3][1]      # two notifications stored, each with its own id


@pytest.mark.parametrize("order", ["loc md", "md loc"])
def test_the_quick_reading_takes_both_child_orders(order):
    url = etree.Element(f"{{{SITEMAP_NS}}}url")
    for part in order.split():
        if part == "loc":
            etree.SubElement(url, f"{{{SITEMAP_NS}}}loc").text = "http://example.org/r"
        else:
            etree.SubElement(url, f"{{{RS_NS}}}md", change="updated", datetime="2025-01-01T00:00:00Z", length="3")
    change = xml._read_plain_change(url)
    assert change is not None and (change.loc, change.length) == ("http://example.org/r", 3)


async def test_only_short_link_headers_are_kept(hub_client):
    # the Link header is read before the publisher is known: a long one is answered, never kept
    own = hub_client.server.app[SETTINGS].hub_url
    short = build_link_header([(TOPIC, "self"), (own, "hub")])
    long = build_link_header([(TOPIC, "self"), (own, "hub"), ("http://example.org/" + "x" * 3000, "describedby")])
    endpoint._kept_links_of.cache_clear()
    for link in (long, long, short, short):
        response = await hub_client.post("/", data=NOTIFICATION, headers={"Content-Type": "application/xml", "Link": link})
        assert response.status == 200, await response.text()
    kept = endpoint._kept_links_of.cache_info()
    assert (kept.currsize, kept.hits) == (1, 1)

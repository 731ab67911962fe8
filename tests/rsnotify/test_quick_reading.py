"""The quick readings of the publish path (issue 25) take nothing the full reading refuses and give
the same result: a usual datetime read by datetime.fromisoformat, a usual notification read in one
pass over the tree, models built without re-checking what the reader checked."""
from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from rsnotify import datetimes, xml
from rsnotify.datetimes import parse_w3c_datetime
from rsnotify.errors import DatetimeError, NotificationParseError, ValidationError
from rsnotify.notification import (
    ChangeNotification,
    ResourceChange,
    prechecked_change,
    prechecked_notification,
)
from rsnotify.safexml import RS_NS, SITEMAP_NS, has_loc_problem, loc_problem

from .strategies import notifications, resource_changes

MANY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# whole notifications are slow to draw: as many as the round-trip property test draws
SOME = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# the usual shape with any digits in it, and near misses of it
USUAL_SHAPED = st.from_regex(r"\A\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z\Z")
NEAR_MISSES = st.builds(lambda text, at, char: text[:at] + char + text[at + 1:], USUAL_SHAPED,
                        st.integers(0, 19), st.sampled_from(list("0159-:TZ+ .\u0661x")))


def outcome(parse, text):
    try:
        return parse(text)
    except DatetimeError as exc:
        return ("refused", str(exc))


@MANY
@given(st.one_of(USUAL_SHAPED, NEAR_MISSES, st.text(max_size=24)))
def test_a_usual_datetime_reads_as_the_grammar_reads_it(text: str) -> None:
    assert outcome(parse_w3c_datetime, text) == outcome(datetimes._parse_any, text)


@pytest.mark.parametrize("text", ["2025-02-29T00:00:00Z", "2025-01-01T24:00:00Z", "2025-01-01T23:60:00Z",
                                  "2025-01-01T23:59:60Z", "0000-01-01T00:00:00Z"])
def test_a_usual_looking_datetime_out_of_range_is_refused_with_the_grammars_words(text: str) -> None:
    with pytest.raises(DatetimeError, match="is not a valid W3C datetime"):
        parse_w3c_datetime(text)


@MANY
@given(resource_changes(st.none() | st.datetimes(timezones=st.just(datetimes.timezone.utc))))
def test_a_prechecked_change_is_the_checked_one(change: ResourceChange) -> None:
    args = (change.loc, change.change, change.changed_at, change.hashes, change.length, change.media_type)
    built = prechecked_change(*args)
    assert built == ResourceChange(*args[:3], None, *args[3:]) and type(built) is ResourceChange
    assert built.links == built.extra == () and built.lastmod is None


@SOME
@given(notifications())
def test_a_prechecked_notification_is_the_checked_one(notification: ChangeNotification) -> None:
    n = notification
    assert prechecked_notification(n.from_time, n.until_time, n.changes, n.up, n.links, n.capability) == n


# -- a whole document read in one pass -------------------------------------------------------

START = datetime(2025, 1, 1)
TIMES = [f"2025-01-01T00:00:0{second}Z" for second in range(6)] + ["2025-01-01T01:00:03+01:00", "2025-01-01",
                                                                     "2025-01-01T00:00:09Z", "2025-13-01", ""]
LOCS = ["http://example.org/a", "https://example.org/b?c=d", "  http://example.org/padded ", "HTTP://EXAMPLE.ORG/C",
        "http://example.org/a b", "ftp://example.org/a", "relative", "", "http://ex\u00e4mple.org/\u00fc",
        "http://example.org/a\nhttp://example.org/b"]
HASHES = ["md5:1584abdf8ebdc9802ac0c6a7402c03b6", "md5:a sha-256:b", " md5:x ", "md5", ":x", "", "md5:\u00e9",
          "md5:a\tb"]
LENGTHS = ["10", "0", "123456789012345678", "9223372036854775807", "9223372036854775808", " 7", "-1", "",
           "\u0661"]
TYPES = ["text/html", "text/plain; charset=utf-8", "text/\u00e9", "text/\x85html", ""]
ROOT_LINKS = [{"rel": "up", "href": "http://example.org/cl.xml"}, {"href": "http://example.org/cl.xml", "rel": "up"},
              {"rel": " up ", "href": " http://example.org/cl.xml "}, {"rel": "describedby", "href": "http://e.org/d"},
              {"rel": "up", "href": "http://example.org/cl.xml", "type": "application/xml"}, {"rel": "up"},
              {"rel": "up", "href": " "}, {"rel": "up", "href": "http://e.org/x", "length": "-3"}]


def make_md(rng: random.Random, good: bool) -> dict[str, str]:
    attrs = {"change": rng.choice(["created", "updated", "deleted"] if good else ["created", "moved", ""]),
             "datetime": rng.choice(TIMES[:6] if good else TIMES), "hash": rng.choice(HASHES[:1] if good else HASHES),
             "length": rng.choice(LENGTHS[:3] if good else LENGTHS), "type": rng.choice(TYPES[:2] if good else TYPES)}
    dropped = rng.sample(sorted(attrs), rng.randint(0, 2) if rng.random() < 0.3 else 0)
    attrs = {name: value for name, value in attrs.items() if name not in dropped}
    if rng.random() < 0.2:          # another order than to_xml's
        attrs = dict(rng.sample(sorted(attrs.items()), len(attrs)))
    if not good and rng.random() < 0.2:
        attrs[rng.choice(["foo", f"{{{RS_NS}}}change", "{urn:x}y"])] = "z"
    return attrs


def add_url(root: etree._Element, rng: random.Random, good: bool) -> None:
    url = etree.SubElement(root, f"{{{SITEMAP_NS}}}url")
    shape = ["loc", "md"] if good and rng.random() < 0.8 else rng.choice(
        [["md", "loc"], ["loc"], ["loc", "md", "md"], ["loc", "loc", "md"], ["loc", "md", "ln"], ["loc", "md", "lastmod"]])
    for part in shape:
        if part == "loc":
            etree.SubElement(url, f"{{{SITEMAP_NS}}}loc").text = rng.choice(LOCS[:3] if good else LOCS)
        elif part == "md":
            etree.SubElement(url, f"{{{RS_NS}}}md", make_md(rng, good))
        elif part == "ln":
            etree.SubElement(url, f"{{{RS_NS}}}ln", rel="describedby", href="http://example.org/meta")
        else:
            etree.SubElement(url, f"{{{SITEMAP_NS}}}lastmod").text = rng.choice(TIMES)


def make_document(rng: random.Random) -> bytes:
    """A change notification with a random mix of good and bad parts (good ones only, half the time)."""
    good = rng.random() < 0.5
    root = etree.Element(f"{{{SITEMAP_NS}}}urlset", nsmap={None: SITEMAP_NS, "rs": RS_NS})
    for attrs in rng.sample(ROOT_LINKS[:4] if good else ROOT_LINKS, rng.randint(0, 2)):
        etree.SubElement(root, f"{{{RS_NS}}}ln", attrs)
    mds = 1 if good else rng.choice([0, 1, 1, 2])
    for _ in range(mds):
        md = {"capability": rng.choice(["change-notification", "changelist-notification"] if good
                                       else ["change-notification", "resourcelist", ""]),
              "from": rng.choice(TIMES[:1] if good else TIMES), "until": rng.choice(TIMES[5:6] if good else TIMES)}
        for name in ([] if good else rng.sample(sorted(md), rng.randint(0, 1))):
            del md[name]
        etree.SubElement(root, f"{{{RS_NS}}}md", md)
    entries = [rng.random() < 0.9 or not good for _ in range(rng.randint(0, 6))]
    for entry_good in entries:
        add_url(root, rng, good and entry_good)
    if not good and rng.random() < 0.1:
        etree.SubElement(root, f"{{{SITEMAP_NS}}}priority").text = "0.5"
    if good:            # forward chronological order, as a good document has it
        dated = [md for md in root.iter(f"{{{RS_NS}}}md") if "datetime" in md.attrib]
        for md, when in zip(dated, sorted(md.get("datetime") for md in dated)):
            md.set("datetime", when)
        if rng.random() < 0.4:
            near_miss(root, rng)
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8")


ENTRY_VALUES = {"loc": LOCS, "datetime": TIMES, "hash": HASHES, "length": LENGTHS, "type": TYPES,
               "change": ["created", "moved", ""]}


def near_miss(root: etree._Element, rng: random.Random) -> None:
    """One value of one entry of a good document set to any value, good or bad."""
    urls = root.findall(f"{{{SITEMAP_NS}}}url")
    if not urls:
        return
    url, name = rng.choice(urls), rng.choice(sorted(ENTRY_VALUES))
    element = url.find(f"{{{SITEMAP_NS}}}loc" if name == "loc" else f"{{{RS_NS}}}md")
    if element is None:
        return
    if name == "loc":
        element.text = rng.choice(ENTRY_VALUES[name])
    else:
        element.set(name, rng.choice(ENTRY_VALUES[name]))


def parse_outcome(body: bytes) -> object:
    try:
        return xml.parse_notification(body)
    except (ValidationError, NotificationParseError) as exc:
        return (type(exc).__name__, str(exc))


def test_a_notification_read_in_one_pass_is_what_the_step_by_step_reading_gives(monkeypatch) -> None:
    rng = random.Random(2525)
    bodies = [make_document(rng) for _ in range(3000)]
    roots = [etree.fromstring(body) for body in bodies]
    quick = [xml._read_plain_notification(root) for root in roots]
    fast = [parse_outcome(body) for body in bodies]
    monkeypatch.setattr(xml, "_read_plain_notification", lambda root: None)
    monkeypatch.setattr(xml, "scan_notification", lambda data, max_bytes=None: None)
    slow = [parse_outcome(body) for body in bodies]
    assert fast == slow
    # the one pass read a good share, only where the step-by-step reading found nothing wrong, and
    # both readings met many refusals
    taken = [i for i, notification in enumerate(quick) if notification is not None]
    assert 500 < len(taken) < len(bodies) - 500
    assert all(slow[i] == quick[i] for i in taken)
    assert sum(1 for result in slow if isinstance(result, tuple)) > 700


def test_the_one_pass_reads_what_to_xml_writes() -> None:
    changes = tuple(ResourceChange(f"http://example.org/{n}", "updated", START.replace(tzinfo=datetimes.timezone.utc)
                                   + timedelta(seconds=n), hashes=(("md5", "ab"),), length=n, media_type="text/html")
                    for n in range(5))
    notification = ChangeNotification(changes[0].changed_at, changes[-1].changed_at, changes, up="http://example.org/cl")
    quick = xml._read_plain_notification(etree.fromstring(xml.to_xml(notification)))
    assert quick == notification


@pytest.mark.parametrize("locs", [[], ["http://example.org/a"], ["http://example.org/a", "HTTPS://b.example/c?d"],
                                  ["http://example.org/a\nhttp://example.org/b"], ["http://example.org/a", ""],
                                  ["http://example.org/a", "http://example.org/a b"], ["ftp://example.org/a"],
                                  ["http://ex\u00e4mple.org/", "http://example.org/\u202e"], ["http://", "https:///x"]])
def test_locs_checked_together_are_refused_when_one_alone_is(locs: list[str]) -> None:
    assert has_loc_problem(locs) == any(loc_problem(loc) for loc in locs)

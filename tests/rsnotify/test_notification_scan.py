"""A usual change notification read from its bytes (rsnotify.notification_scan) gives what the
parse gives, and nothing else passes: every document the scan takes reads the same through lxml,
and every document lxml refuses, or reads otherwise, the scan leaves to it."""
from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import pytest

from rsnotify import datetimes, xml
from rsnotify.notification import ChangeNotification, Link, ResourceChange
from rsnotify.notification_scan import scan_notification
from rsnotify.safexml import RS_NS, SITEMAP_NS

from .test_quick_reading import START, make_document, parse_outcome

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def both_ways(monkeypatch: pytest.MonkeyPatch, bodies: list[bytes]) -> tuple[list[object], list[object]]:
    """parse_notification's outcome for each body with the scan, then without it."""
    scanned = [parse_outcome(body) for body in bodies]
    with monkeypatch.context() as patched:
        patched.setattr(xml, "scan_notification", lambda data, max_bytes=None: None)
        parsed = [parse_outcome(body) for body in bodies]
    return scanned, parsed


def taken(bodies: list[bytes]) -> int:
    return sum(1 for body in bodies if (found := scan_notification(body)) and xml._scanned_notification(*found))


def test_generated_notifications_read_the_same_with_and_without_the_scan(monkeypatch) -> None:
    rng = random.Random(1225)
    bodies = [make_document(rng) for _ in range(3000)]
    scanned, parsed = both_ways(monkeypatch, bodies)
    assert scanned == parsed
    # the scan read a good share of them (lxml writes the usual shape), and refusals were many
    assert 300 < taken(bodies) < len(bodies) - 500
    assert sum(1 for result in parsed if isinstance(result, tuple)) > 700


# bytes that mean something to an XML parser, or that it refuses, rewrites or normalizes
SNIPPETS = ["<!-- c -->", "&amp;", "&#65;", "&#x9;", "&lt;", "&quot;", "<![CDATA[x]]>", "]]>", "<?pi x?>",
            "<!DOCTYPE urlset>", "\t", "\r", "\n", "\r\n", " ", "\x00", "\x01", "\x1f", "\x7f", "\x85", "\ufffe",
            "\uffff", "\ufeff", "\u2028", "\U0001f600", ">", "<", '"', "'", "=", "/", "<url>", "</url>", "<loc>",
            "</loc>", "<rs:md/>", "</urlset>", "<urlset>", ' xmlns:rs="urn:x"', ' xmlns="urn:y"', ' rel="up"',
            ' change="deleted"', ' hash="md5:ab"', " change='created'", "rs:", "x", "0", "Z", "+01:00"]
BAD_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"]


def mutate(body: bytes, rng: random.Random) -> bytes:
    """`body` with one to three random edits: a snippet or a bad byte put in, a span cut or doubled."""
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(body) + 1)
        kind = rng.random()
        if kind < 0.55:
            body = body[:at] + rng.choice(SNIPPETS).encode() + body[at:]
        elif kind < 0.65:
            body = body[:at] + rng.choice(BAD_BYTES) + body[at:]
        elif kind < 0.85:
            body = body[:at] + body[at + rng.randint(1, 12):]
        else:
            end = at + rng.randint(1, 40)
            body = body[:end] + body[at:end] + body[end:]
    return body


def usual_body(rng: random.Random, entries: int) -> bytes:
    changes = tuple(ResourceChange(f"http://example.org/{rng.randrange(99)}/{n}", rng.choice(["created", "updated", "deleted"]),
                                   START.replace(tzinfo=datetimes.timezone.utc) + timedelta(seconds=n),
                                   hashes=(("md5", f"{n:032x}"),) if rng.random() < 0.7 else (),
                                   length=n if rng.random() < 0.7 else None,
                                   media_type="text/html" if rng.random() < 0.7 else None)
                    for n in range(entries))
    until = START.replace(tzinfo=datetimes.timezone.utc) + timedelta(seconds=entries)
    return xml.to_xml(ChangeNotification(until - timedelta(seconds=entries), until, changes,
                                         up="http://example.org/capabilitylist.xml",
                                         links=(Link("describedby", "http://example.org/about"),)))


def test_mutated_notifications_read_the_same_with_and_without_the_scan(monkeypatch) -> None:
    rng = random.Random(2611)
    sources = [usual_body(rng, rng.randint(0, 5)) for _ in range(40)]
    assert taken(sources) == len(sources)       # what to_xml writes, the scan reads
    bodies = [mutate(rng.choice(sources), rng) for _ in range(6000)]
    scanned, parsed = both_ways(monkeypatch, bodies)
    mismatches = [(body, a, b) for body, a, b in zip(bodies, scanned, parsed) if a != b]
    assert not mismatches, mismatches[:3]
    # a mutated document is still taken now and then (whitespace, a value changed), refused often
    assert 100 < taken(bodies) < len(bodies) - 1000


@pytest.mark.parametrize("edit", [
    lambda b: b.replace(b"<?xml version='1.0' encoding='UTF-8'?>", b'<?xml version="1.0" encoding="UTF-8"?>'),
    lambda b: b.replace(b"<?xml version='1.0' encoding='UTF-8'?>\n", b""),
    lambda b: b.replace(b"><", b">\n  <"),
    lambda b: b.replace(b"/>", b" />"),
    lambda b: b.replace(f'xmlns="{SITEMAP_NS}" xmlns:rs="{RS_NS}"'.encode(), f'xmlns:rs="{RS_NS}" xmlns="{SITEMAP_NS}"'.encode()),
])
def test_usual_variants_of_the_shape_are_scanned_and_read_as_parsed(monkeypatch, edit) -> None:
    body = edit(usual_body(random.Random(7), 3))
    assert taken([body]) == 1
    scanned, parsed = both_ways(monkeypatch, [body])
    assert scanned == parsed and isinstance(scanned[0], ChangeNotification)


@pytest.mark.parametrize("edit", [
    lambda b: b"\xef\xbb\xbf" + b,                                          # a BOM
    lambda b: b.replace(b"<url>", b"<url>\n<lastmod>2025-01-01T00:00:00Z</lastmod>", 1),
    lambda b: b.replace(b"http://example.org/about", b"http://example.org/?a=1&amp;b=2"),
    lambda b: b.replace(b'"', b"'").replace(b"<?xml version='1.0' encoding='UTF-8'?>", b""),   # single quotes
    lambda b: b.replace(b"rs:", b"r:").replace(b"xmlns:rs=", b"xmlns:r="),   # another prefix, same namespace
    lambda b: b.replace(b"</urlset>", b"</urlset><!-- end -->"),
])
def test_other_forms_are_left_to_the_parse_which_reads_them(monkeypatch, edit) -> None:
    body = edit(usual_body(random.Random(7), 3))
    assert scan_notification(body) is None
    scanned, parsed = both_ways(monkeypatch, [body])
    assert scanned == parsed and isinstance(parsed[0], ChangeNotification)


def test_a_value_past_libxml2s_cap_is_refused_as_the_parse_refuses_it(monkeypatch) -> None:
    body = usual_body(random.Random(3), 2).replace(b'type="text/html"', b'type="' + b"a" * 10_000_001 + b'"', 1)
    assert b"a" * 1000 in body
    scanned, parsed = both_ways(monkeypatch, [body])
    assert scanned == parsed and isinstance(parsed[0], tuple)
    long_loc = usual_body(random.Random(3), 1).replace(b"http://example.org/", b"http://example.org/" + b"p" * 20_000, 1)
    assert scan_notification(long_loc) is None and isinstance(xml.parse_notification(long_loc), ChangeNotification)


def test_the_specs_examples_read_the_same_with_and_without_the_scan(monkeypatch) -> None:
    bodies = [path.read_bytes() for path in sorted(FIXTURES.glob("change-notification-*/*.xml"))]
    assert bodies
    scanned, parsed = both_ways(monkeypatch, bodies)
    assert scanned == parsed

"""Link headers, signatures and the subscription form, as every role uses them."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from rsnotify.errors import WireError
from rsnotify.websub import (
    build_link_header, check_url, links_by_rel, normalize_url, parse_link_header,
    parse_subscription_form, sign, verify_signature,
)


def test_spec_example_link_header_parses():
    value = ('<http://example.com/dataset1/change/> ; rel="self",\n'
             ' <http://hub.example.org/websub/> ; rel="hub",\n'
             ' <http://www.example.com/dataset1/capabilitylist.xml> ; rel="resourcesync"')
    links = parse_link_header(value)
    assert links_by_rel(links, "self") == ["http://example.com/dataset1/change/"]
    assert links_by_rel(links, "hub") == ["http://hub.example.org/websub/"]
    assert links_by_rel(links, "resourcesync") == ["http://www.example.com/dataset1/capabilitylist.xml"]


def test_several_headers_quoted_params_and_multiple_rels():
    links = parse_link_header(['<http://a/>; rel="self hub"; title="x, y; z"', "<http://b/>;rel=hub"])
    assert links_by_rel(links, "hub") == ["http://a/", "http://b/"]
    assert links[0].param("title") == "x, y; z"


def test_malformed_link_header_is_refused():
    with pytest.raises(WireError, match="Link header"):
        parse_link_header("http://no-brackets; rel=self")


uris = st.from_regex(r"https?://[a-z]{1,10}\.example/[a-z0-9/._~%-]{0,20}", fullmatch=True)
rels = st.sampled_from(["self", "hub", "resourcesync", "up", "alternate"])


@given(st.lists(st.tuples(uris, rels), min_size=1, max_size=6))
def test_link_header_round_trip(pairs):
    parsed = parse_link_header(build_link_header(pairs))
    assert [(link.href, link.rels[0]) for link in parsed] == pairs


@pytest.mark.parametrize("algorithm", ["sha1", "sha256", "sha384", "sha512"])
def test_signature_verifies_with_each_algorithm(algorithm):
    header = sign(b"<urlset/>", "s3cret", algorithm)
    assert header.startswith(f"{algorithm}=") and header == header.lower()
    assert verify_signature(b"<urlset/>", "s3cret", header)
    assert not verify_signature(b"<urlset/> ", "s3cret", header)
    assert not verify_signature(b"<urlset/>", "other", header)


@pytest.mark.parametrize("header", [None, "", "sha256", "md5=abc", "sha256=zz"])
def test_bad_signature_headers_are_invalid(header):
    assert not verify_signature(b"x", "k", header)


def test_subscription_form_reports_every_problem_at_once():
    with pytest.raises(WireError) as info:
        parse_subscription_form({"hub.mode": "subscribe", "hub.topic": "ftp://x/",
                                 "hub.callback": "/relative", "hub.lease_seconds": "-5",
                                 "hub.secret": "é" * 100})
    problems = info.value.problems
    assert len(problems) == 4
    assert "hub.lease_seconds must be a positive integer, got '-5'" in problems
    assert any("200 bytes" in p and "got 200 bytes" in p for p in problems)


def test_subscription_form_ignores_unknown_parameters():
    request = parse_subscription_form({"hub.mode": "subscribe", "hub.topic": "http://t/",
                                       "hub.callback": "http://c/?x=1", "foo": "bar", "hub.foo": "x",
                                       "hub.secret": "a" * 199})
    assert request.callback == "http://c/?x=1" and request.lease_seconds is None


def test_normalize_url():
    assert normalize_url("HTTP://Hub.Example.ORG:80") == "http://hub.example.org/"
    assert normalize_url("https://h:8443/x?q") == "https://h:8443/x?q"


@pytest.mark.parametrize(("given", "taken"), [
    ("http://bücher.example/x?q=ü", "http://xn--bcher-kva.example/x?q=ü"),       # only the host changes
    ("https://user:pw@BÜCHER.Example:8443/a", "https://user:pw@xn--bcher-kva.example:8443/a"),
    ("http://例え。テスト/", "http://xn--r8jz45g.xn--zckzah/"),                     # the ideographic full stop
    ("http://straße.de/", "http://xn--strae-oqa.de/"),                            # IDNA 2008: no ss mapping
    ("http://xn--bcher-kva.example/", "http://xn--bcher-kva.example/"),
])
def test_check_url_takes_an_idn_host_in_its_idna_form(given, taken):
    assert check_url("hub.topic", given) == taken
    assert normalize_url(given) == normalize_url(taken)


@pytest.mark.parametrize(("url", "reason"), [
    ("http://😀.example/", r"U\+1F600"), ("http://bücher..example/", "Empty Label"),
    ("http://bücher-.example/", "hyphen"), ("http://" + "ü" * 64 + ".example/", "too long"),
])
def test_check_url_refuses_a_malformed_idn_host_saying_why(url, reason):
    with pytest.raises(WireError, match=f"hub.callback has an invalid internationalized host name .*{reason}"):
        check_url("hub.callback", url)

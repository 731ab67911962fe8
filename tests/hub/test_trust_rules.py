"""Whom the hub believes (forwarding headers, trusted proxies) and what a token's prefix covers:
the pure rules behind the web guards, case by case."""
from __future__ import annotations

import ipaddress

import pytest
from multidict import CIMultiDict

from rsnotify.hub.web.auth import is_under
from rsnotify.hub.web.clients import judge
from rsnotify.websub import normalize_url

LOCAL_PROXY = (ipaddress.ip_network("127.0.0.1/32"),)
PROXIES = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("127.0.0.1/32"))


@pytest.mark.parametrize(
    "peer, headers, trusted, address, is_local",
    [
        ("127.0.0.1", {}, (), "127.0.0.1", True),
        ("::ffff:127.0.0.1", {}, (), "::ffff:127.0.0.1", True),
        ("203.0.113.9", {}, (), "203.0.113.9", False),
        # without trusted proxies any relay header makes the client remote, whatever it claims
        ("127.0.0.1", {"X-Client-IP": "127.0.0.1"}, (), "127.0.0.1", False),
        ("127.0.0.1", {"CF-Connecting-IP": "203.0.113.9"}, (), "127.0.0.1", False),
        ("127.0.0.1", {"Via": "1.1 proxy"}, (), "127.0.0.1", False),
        # through a trusted proxy: the right-most address that is not a trusted proxy
        ("127.0.0.1", {"X-Forwarded-For": "203.0.113.9"}, LOCAL_PROXY, "203.0.113.9", False),
        ("127.0.0.1", {"X-Forwarded-For": "127.0.0.5, 203.0.113.9"}, LOCAL_PROXY, "203.0.113.9", False),
        ("127.0.0.1", {"X-Forwarded-For": "203.0.113.9, 10.1.2.3"}, PROXIES, "203.0.113.9", False),
        # "local" is the socket peer's alone: an address a header names never makes a client local
        ("127.0.0.1", {"X-Forwarded-For": "127.0.0.1"}, LOCAL_PROXY, "127.0.0.1", False),
        ("10.0.0.2", {"X-Forwarded-For": "127.0.0.1, 10.1.2.3"}, PROXIES, "127.0.0.1", False),
        ("10.0.0.2", {"Forwarded": 'for=192.0.2.60;proto=http, for="[2001:db8::1]:4711"'}, PROXIES,
         "2001:db8::1", False),
        ("10.0.0.2", {"Forwarded": "for=203.0.113.9", "X-Forwarded-For": "198.51.100.7"}, PROXIES,
         "198.51.100.7", False),
        ("127.0.0.1", {"X-Forwarded-For": "not-an-address"}, LOCAL_PROXY, "not-an-address", False),
        # a trusted proxy that names nobody: unknown, so remote
        ("127.0.0.1", {}, LOCAL_PROXY, "127.0.0.1", False),
        # a forged header from an untrusted peer is not believed
        ("203.0.113.9", {"X-Forwarded-For": "127.0.0.1"}, LOCAL_PROXY, "203.0.113.9", False),
    ],
)
def test_who_the_client_is(peer: str, headers: dict[str, str], trusted, address: str, is_local: bool) -> None:
    client = judge(peer, CIMultiDict(headers), trusted)
    assert (client.address, client.is_local) == (address, is_local)


@pytest.mark.parametrize(
    "topic, prefix, covered",
    [
        ("http://e.org/x", "http://e.org/x", True),
        ("http://e.org/x/y", "http://e.org/x", True),
        ("http://e.org/x?page=2", "http://e.org/x", True),
        ("http://e.org/xy", "http://e.org/x", False),
        ("http://e.org/x-1/y", "http://e.org/x", False),
        ("http://e.org/ds1/a", "http://e.org/ds1/", True),
        ("http://e.org/ds10/a", "http://e.org/ds1/", False),
        ("http://E.ORG:80/ds1/a", "http://e.org/ds1/", True),
        ("https://e.org/ds1/a", "http://e.org/ds1/", False),
        ("http://e.org.evil/ds1/a", "http://e.org", False),
    ],
)
def test_a_token_prefix_covers_whole_path_segments(topic: str, prefix: str, covered: bool) -> None:
    assert is_under(normalize_url(topic), normalize_url(prefix)) is covered

"""Who sent a request: the client's address, and whether it is this machine's own.

Forwarding headers are believed only from a peer inside --trusted-proxy, and then only to name
the client's address (rate limits, messages). "Local" is decided by the socket peer alone: a
loopback peer that carries no forwarding header (a proxy's, or one a client made up). No I/O here.
"""
from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Headers some proxy, CDN or load balancer uses to name the client: their presence shows a relay.
FORWARDING_HEADERS = (
    "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-IP", "X-Client-IP",
    "CF-Connecting-IP", "True-Client-IP", "Fastly-Client-IP", "X-Cluster-Client-IP", "Client-IP",
    "X-Original-Forwarded-For", "Via",
)


@dataclass(frozen=True, slots=True)
class Client:
    """The sender of a request as the hub judges it."""

    address: str         # the client's address (the peer's when no trusted proxy names another)
    is_local: bool       # this machine's own client: loopback, not relayed (or relayed by a trusted proxy for one)
    relayed_by: str = ""  # the forwarding header that made an untrusted relay visible, for messages


@functools.lru_cache(maxsize=4096)
def parse_address(text: str | None) -> Address | None:
    """The IP address `text` names (an IPv4-mapped IPv6 one as IPv4), or None. Cached: a hub
    hears from few peers, and parsing one cost more than the rest of identifying a client."""
    try:
        ip = ipaddress.ip_address((text or "").strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _inside(ip: Address | None, networks: Iterable[Network]) -> bool:
    return ip is not None and any(ip.version == net.version and ip in net for net in networks)


def identify(request: web.Request, trusted: tuple[Network, ...]) -> Client:
    """The client of `request` (see judge)."""
    return judge(request.remote or "", request.headers, trusted)


def judge(peer_text: str, headers: CIMultiDictProxy[str] | CIMultiDict[str], trusted: tuple[Network, ...]) -> Client:
    """The client behind peer address `peer_text`, believing forwarding headers only from a peer
    inside `trusted`.

    Through trusted proxies the client is the right-most hop of X-Forwarded-For (or, without
    one, of Forwarded) that is not itself a trusted proxy: hops to its left were written by the
    client and prove nothing. Whether the client is local is decided by the socket peer alone:
    a loopback peer carrying no forwarding header. A relayed request is never local, whatever
    address a header names, so no header can make a client an operator.
    """
    peer = parse_address(peer_text)
    relayed = next((name for name in FORWARDING_HEADERS if name in headers), "")
    if not _inside(peer, trusted):
        return Client(peer_text, bool(peer and peer.is_loopback) and not relayed, relayed)
    header, hops = forwarded_hops(headers)
    for hop in reversed(hops):
        ip = parse_address(hop)
        if ip is None:
            return Client(hop[:64], False, header)
        if not _inside(ip, trusted):
            return Client(str(ip), False, header)
    if hops:  # every hop is a trusted proxy: the left-most one is where the request began
        return Client(hops[0][:64], False, header)
    return Client(peer_text, False, relayed or "a trusted proxy that names no client")


def forwarded_hops(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> tuple[str, list[str]]:
    """(header name, client-to-proxy hops) of X-Forwarded-For, else of Forwarded's `for=` values.

    X-Forwarded-For wins when both are there: it is what common proxies (nginx, HAProxy, Caddy,
    Traefik, Envoy) write, while they pass a client's own Forwarded header through untouched.
    """
    hops = [hop.strip() for value in headers.getall("X-Forwarded-For", []) for hop in value.split(",")]
    if hops:
        return "X-Forwarded-For", [hop for hop in hops if hop]
    found: list[str] = []
    for value in headers.getall("Forwarded", []):
        for element in value.split(","):
            for pair in element.split(";"):
                name, _, given = pair.strip().partition("=")
                if name.strip().lower() == "for":
                    found.append(_forwarded_node(given.strip().strip('"')))
    return ("Forwarded" if found else ""), found


def _forwarded_node(node: str) -> str:
    """The address of an RFC 7239 node: `[2001:db8::1]:4711` -> 2001:db8::1, `192.0.2.1:80` -> 192.0.2.1."""
    if node.startswith("["):
        return node[1:node.find("]")] if "]" in node else node
    return node.partition(":")[0] if node.count(":") == 1 else node

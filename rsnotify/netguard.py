"""The outbound-address guard both serving roles use: the hub for every verification,
denial, thin-ping fetch and delivery, the Destination for every list and resource fetch made
on a Source's word.

The check sits in the connector's socket factory, so it judges the very address the socket
then connects to (no second DNS lookup can swap it), for host names and IP literals alike.
Each role passes its own error type and the hint its users act on (the option that allows a
network); the policy itself is written once, here.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# What a role raises for a refused address: its own error type, called with the message.
Refusal = Callable[[str], BaseException]


def is_allowed_address(address: Address | str, allowed: Iterable[Network] = ()) -> bool:
    """True for a public unicast address, or one inside an explicitly allowed network.

    Private, loopback, link-local, multicast, reserved, unspecified and other non-global
    addresses are refused; an IPv4-mapped IPv6 address is judged as its IPv4 address.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0]) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip.version == net.version and ip in net for net in allowed):
        return True
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


def refusal_message(address: str, hint: str) -> str:
    return f"outbound connection to {address} refused: not a public address ({hint})"


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (or single addresses) as networks; ValueError naming the bad one."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"--allow-network must be a CIDR such as 10.0.0.0/8 or an IP address, got {value!r}") from None
    return tuple(networks)


async def private_networks_of(url: str) -> tuple[Network, ...]:
    """The non-public addresses `url`'s host resolves to (each as a one-address network)."""
    host = urlsplit(url).hostname
    if not host:
        return ()
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return ()
    networks = []
    for info in infos:
        address = str(info[4][0]).split("%", 1)[0]
        if not is_allowed_address(address):
            networks.append(ipaddress.ip_network(address))
    return tuple(dict.fromkeys(networks))


def guarded_socket_factory(allowed: Iterable[Network], refused: Refusal, hint: str) -> Any:
    """A socket factory for aiohttp.TCPConnector that raises `refused(message)` for a disallowed target."""
    networks = tuple(allowed)

    def factory(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        address = str(sockaddr[0])
        if not is_allowed_address(address, networks):
            raise refused(refusal_message(address, hint))
        sock = socket.socket(family=family, type=type_, proto=proto)
        sock.setblocking(False)
        return sock

    return factory


def make_session(allowed: Iterable[Network] | None, refused: Refusal, hint: str, *,
                 timeout: aiohttp.ClientTimeout | None = None, limit: int = 100, limit_per_host: int = 0,
                 headers: dict[str, str] | None = None, auto_decompress: bool = True,
                 middlewares: Sequence[aiohttp.ClientMiddlewareType] = ()) -> aiohttp.ClientSession:
    """A keep-alive ClientSession whose connections reach only allowed addresses (`allowed=None`:
    any address, for library users who fetch from their own network); no proxies from the
    environment, no cookies kept. Use it with `allow_redirects=False` or a redirect check.
    Without `timeout`, aiohttp's default applies (callers then bound each request)."""
    guard = {"socket_factory": guarded_socket_factory(allowed, refused, hint)} if allowed is not None else {}
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit_per_host, ttl_dns_cache=60, **guard)
    return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
                                 timeout=timeout or aiohttp.client.DEFAULT_TIMEOUT, headers=headers,
                                 auto_decompress=auto_decompress, middlewares=tuple(middlewares))

"""The Destination's outbound-address guard: resource and list fetches made on a Source's word
go only to public addresses, to the Source's own addresses, or to networks allowed explicitly.

The check sits in the connector's socket factory, so it judges the very address the socket
connects to (no second DNS lookup can swap it). Same policy as the hub's guard; roles share no
code, so the Destination keeps its own copy of these few lines.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class OutboundRefusedError(aiohttp.ClientConnectionError):
    """A connection to an address the guard does not allow (a ClientError, so fetch code
    handles it like any other connection failure)."""


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (or single addresses) as networks; ValueError naming the bad one."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"--allow-network must be a CIDR such as 10.0.0.0/8 or an IP address, got {value!r}") from None
    return tuple(networks)


def is_allowed_address(address: str, allowed: Iterable[Network] = ()) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip.version == net.version and ip in net for net in allowed):
        return True
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


async def source_networks(url: str) -> tuple[Network, ...]:
    """The non-public addresses the Source's host resolves to: allowed, since the user chose
    that Source (a Source on a LAN or loopback may serve its own resources)."""
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


def guarded_socket_factory(allowed: Iterable[Network]) -> Any:
    networks = tuple(allowed)

    def factory(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        address = str(sockaddr[0])
        if not is_allowed_address(address, networks):
            raise OutboundRefusedError(f"connection to {address} refused: not a public address and not the "
                                       "Source's own (allow it with --allow-network CIDR)")
        sock = socket.socket(family=family, type=type_, proto=proto)
        sock.setblocking(False)
        return sock

    return factory


def make_session(allowed: Iterable[Network] | None, *, limit: int, limit_per_host: int, timeout: float,
                 user_agent: str, middlewares: Sequence[aiohttp.ClientMiddlewareType] = ()) -> aiohttp.ClientSession:
    """A keep-alive session whose connections only reach allowed addresses (`allowed=None`: any
    address, for library users who fetch from their own network); no proxies, no cookies.
    `middlewares`: e.g. the Source's own headers (sync/headers.py)."""
    guard = {"socket_factory": guarded_socket_factory(allowed)} if allowed is not None else {}
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit_per_host, ttl_dns_cache=60, **guard)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout),
        cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
        headers={"User-Agent": user_agent}, middlewares=tuple(middlewares),
    )

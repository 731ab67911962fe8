"""The outbound-address guard: every request the hub makes (verification, denial, thin-ping
fetch, delivery) goes through a connector that refuses non-public addresses.

The check sits in the connector's socket factory, so it sees the very address the socket
then connects to (no second DNS lookup can swap it), for host names and IP literals alike.
"""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from .errors import OutboundRefusedError
from .settings import HubSettings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_allowed_address(address: Address | str, allowed: Iterable[Network] = ()) -> bool:
    """True for a public unicast address, or one inside an explicitly allowed network.

    Private, loopback, link-local, multicast, reserved, unspecified and other non-global
    addresses are refused; an IPv4-mapped IPv6 address is judged as its IPv4 address.
    """
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip.version == net.version and ip in net for net in allowed):
        return True
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


def check_address(address: str, allowed: Iterable[Network] = ()) -> None:
    """Raise OutboundRefusedError unless `address` may be connected to."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        raise OutboundRefusedError(f"outbound address must be an IP address, got {address!r}") from None
    if not is_allowed_address(ip, allowed):
        raise OutboundRefusedError(
            f"outbound connection to {address} refused: not a public address "
            "(allow its network with --allow-network CIDR)")


def literal_refusal(url: str, allowed: Iterable[Network] = ()) -> str | None:
    """Why `url` names a refused address by itself (an IP literal, or localhost), else None.

    Lets intake refuse such a URL at once with a 400, before anything is stored or queued; host
    names that resolve to a refused address are still stopped by the connector at connect time.
    """
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    address = "127.0.0.1" if host == "localhost" or host.endswith(".localhost") else host
    try:
        ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None  # a DNS name: judged when it is resolved, on connecting
    try:
        check_address(address, allowed)
    except OutboundRefusedError as exc:
        return str(exc)
    return None


def guarded_socket_factory(allowed: Iterable[Network]) -> Any:
    """A socket factory for aiohttp.TCPConnector that refuses disallowed target addresses."""
    networks = tuple(allowed)

    def factory(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        check_address(str(sockaddr[0]), networks)
        sock = socket.socket(family=family, type=type_, proto=proto)
        sock.setblocking(False)
        return sock

    return factory


def make_connector(settings: HubSettings, *, limit: int = 100, limit_per_host: int = 0) -> aiohttp.TCPConnector:
    """A TCPConnector for outbound requests that only connects to allowed addresses.

    Use it with `allow_redirects=False` on every request and a ClientTimeout.
    """
    return aiohttp.TCPConnector(
        socket_factory=guarded_socket_factory(settings.allowed_networks),
        limit=limit, limit_per_host=limit_per_host, ttl_dns_cache=60,
    )


def make_session(settings: HubSettings, *, limit: int = 100) -> aiohttp.ClientSession:
    """A ClientSession on the guarded connector: no proxies from the environment, no cookies kept."""
    return aiohttp.ClientSession(
        connector=make_connector(settings, limit=limit),
        timeout=aiohttp.ClientTimeout(total=settings.fetch_timeout, sock_connect=settings.connect_timeout),
        cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, auto_decompress=True,
    )


def describe_refusal(exc: BaseException) -> str | None:
    """The guard's message when `exc` (an aiohttp error) came from a refused address, else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OutboundRefusedError):
            return str(current)
        inner = getattr(current, "os_error", None)
        if isinstance(inner, OutboundRefusedError):
            return str(inner)
        for sub in getattr(current, "exceptions", ()) or ():
            found = describe_refusal(sub)
            if found:
                return found
        current = current.__cause__ or current.__context__
    return None


class ResponseTooLargeError(Exception):
    """A response body went past the size bound; nothing of it is used."""


async def read_limited(response: aiohttp.ClientResponse, limit: int, *, strict: bool = False) -> bytes:
    """At most `limit` bytes of a response body (the rest is not read).

    With `strict`, a body longer than `limit` raises ResponseTooLargeError instead.
    """
    if strict and response.content_length is not None and response.content_length > limit:
        raise ResponseTooLargeError(f"response of {response.content_length} bytes is over the limit of {limit}")
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await response.content.read(min(65536, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    if strict:
        raise ResponseTooLargeError(f"response is over the limit of {limit} bytes")
    return b"".join(chunks)[:limit]

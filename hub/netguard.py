"""The hub's side of the outbound-address guard (the policy is rsnotify.netguard): every
request the hub makes is judged on the address it connects to, thin-ping fetches by a
connector that refuses non-public addresses with OutboundRefusedError, deliveries,
verifications and denials by rsnotify/outbound.py with the same HINT; intake refuses an IP-literal
URL at once. Also the bounded reading of an answer's body.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from rsnotify import netguard
from rsnotify.netguard import Network, is_allowed_address

from .errors import OutboundRefusedError
from .settings import HubSettings

__all__ = ["Network", "ResponseTooLargeError", "check_address", "describe_refusal", "is_allowed_address",
           "literal_refusal", "make_session", "read_limited"]

HINT = "allow its network with --allow-network CIDR"


def check_address(address: str, allowed: Iterable[Network] = ()) -> None:
    """Raise OutboundRefusedError unless `address` may be connected to."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        raise OutboundRefusedError(f"outbound address must be an IP address, got {address!r}") from None
    if not is_allowed_address(ip, allowed):
        raise OutboundRefusedError(netguard.refusal_message(address, HINT))


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


def make_session(settings: HubSettings, *, limit: int = 100, timeout: aiohttp.ClientTimeout | None = None,
                 **options: Any) -> aiohttp.ClientSession:
    """A ClientSession on the guarded connector (rsnotify.netguard.make_session); `timeout`
    defaults to the settings' fetch and connect timeouts."""
    timeout = timeout or aiohttp.ClientTimeout(total=settings.fetch_timeout, sock_connect=settings.connect_timeout)
    return netguard.make_session(settings.allowed_networks, OutboundRefusedError, HINT, limit=limit,
                                 timeout=timeout, **options)


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

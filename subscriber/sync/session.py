"""The guarded HTTP session for a Source's lists and resources (the policy is rsnotify.netguard):
only public addresses, the Source's own, or networks allowed explicitly. The list reader builds
on it; the fetcher's client (rsnotify/outbound.py) refuses with the same HINT."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import aiohttp

from rsnotify import netguard
from rsnotify.netguard import Network
from rsnotify.netguard import private_networks_of as source_networks

__all__ = ["HINT", "OutboundRefusedError", "make_session", "source_networks"]

# What a refusal adds, on the list session and the fetcher's client alike
HINT = "not the Source's own either; allow it with --allow-network CIDR"


class OutboundRefusedError(aiohttp.ClientConnectionError):
    """A connection to an address the outbound guard does not allow (an aiohttp connection error,
    so fetch code handles it like any other connection failure)."""


def make_session(allowed: Iterable[Network] | None, *, limit: int, limit_per_host: int, timeout: float,
                 user_agent: str, middlewares: Sequence[aiohttp.ClientMiddlewareType] = ()) -> aiohttp.ClientSession:
    """The guarded keep-alive session for a Source's lists and resources. A Source's own
    non-public addresses (`source_networks`) are allowed since the user chose that Source.
    `middlewares`: e.g. the Source's own headers (sync/headers.py), the rate limit."""
    return netguard.make_session(
        allowed, OutboundRefusedError, HINT,
        limit=limit, limit_per_host=limit_per_host, headers={"User-Agent": user_agent},
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout), middlewares=middlewares)

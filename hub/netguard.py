"""The hub's side of the outbound-address guard (the policy is rsnotify.netguard): every
request the hub makes (deliveries, verifications, denials, thin-ping fetches, diagnostics links)
goes through an rsnotify/outbound.py client made by `outbound_client`, judged on the address it
connects to; intake refuses an IP-literal URL at once.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from rsnotify import netguard
from rsnotify.netguard import Network, is_allowed_address
from rsnotify.outbound import OutboundClient

from .errors import OutboundRefusedError
from .settings import HubSettings

__all__ = ["HINT", "USER_AGENT", "Network", "check_address", "is_allowed_address", "literal_refusal",
           "outbound_client"]

HINT = "allow its network with --allow-network CIDR"
USER_AGENT = "rsnotify-hub (+https://github.com/rsnotify)"


def outbound_client(settings: HubSettings, *, limit: int, max_idle: int, keep_headers: bool = False) -> OutboundClient:
    """A client for the hub's outbound requests, guarded by `settings`' allowed networks, naming
    the hub as its User-Agent; `keep_headers` for one whose answers' header fields are read."""
    return OutboundClient(allowed=settings.allowed_networks, hint=HINT, limit=limit, max_idle=max_idle,
                          user_agent=USER_AGENT, keep_headers=keep_headers)


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

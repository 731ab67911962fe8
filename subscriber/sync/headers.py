"""Request headers a harvester sends to a protected Source (`rsnotify sync/audit --header`), and
only to it: an aiohttp client middleware adds them to each request, redirect hops included, whose
origin (scheme, host, port) is the Source's, so a token never reaches another host, whether a
resource lives there or a redirect leads there. No I/O here.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import urlsplit

from aiohttp import (
    ClientHandlerType,
    ClientMiddlewareType,
    ClientRequest,
    ClientResponse,
)

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")   # RFC 9110 field-name characters
_RESERVED = frozenset({"host", "content-length", "transfer-encoding", "connection"})

Header = tuple[str, str]


def parse_header(text: str) -> Header:
    """`Name: value` as (name, value); ValueError with the reason otherwise."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not name:
        raise ValueError(f"expected 'Name: value', got {text[:40]!r}")
    if not _TOKEN.match(name):
        raise ValueError(f"{name[:40]!r} is not a header name (letters, digits and !#$%&'*+.^_`|~-)")
    if name.lower() in _RESERVED:
        raise ValueError(f"{name} is set by the HTTP client itself; it cannot be given")
    if any(c in value for c in "\r\n\x00"):
        raise ValueError(f"the value of {name} holds a line break or NUL")
    return name, value


_DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int | None]


def origin(url: str) -> Origin:
    """(scheme, host, port) with the scheme's default port filled in (None for a scheme other
    than http and https); ValueError for a bad port. The fetcher's trust rules use it too."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def source_header_middleware(source_url: str, headers: Sequence[Header]) -> ClientMiddlewareType:
    """A client middleware adding `headers` to requests to `source_url`'s origin, and to no other."""
    allowed = origin(source_url)
    chosen = tuple(headers)

    async def add_source_headers(request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        if origin(str(request.url)) == allowed:
            for name, value in chosen:
                request.headers[name] = value
        return await handler(request)

    return add_source_headers


__all__ = ["Header", "Origin", "origin", "parse_header", "source_header_middleware"]

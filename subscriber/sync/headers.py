"""Request headers a harvester sends to a protected Source (`rsnotify sync/audit --header`), and
only to it: added to each request, redirect hops included, whose origin (scheme, host, port) is
the Source's, so a token never reaches another host, whether a resource lives there or a
redirect leads there. No I/O here.

A rule like this one is a `RequestRule`: one definition that both HTTP paths of a sync apply, the
aiohttp session of the Source's lists (as a client middleware) and the lean client of its
resources (sync/fetcher.py calls `apply` before each GET).
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import MutableMapping, Sequence
from urllib.parse import urlsplit

from aiohttp import (
    ClientHandlerType,
    ClientRequest,
    ClientResponse,
)

from rsnotify.errors import WireError
from rsnotify.websub import idna_host

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
    host = (parts.hostname or "").lower()
    if not host.isascii():      # one spelling for an IDN host: the ASCII one discovery records
        try:
            host = idna_host("a URL", host, url)
        except WireError:
            pass                # no valid IDN: it equals no origin but its own spelling
    return scheme, host, parts.port or _DEFAULT_PORTS.get(scheme)


class RequestRule(ABC):
    """What a sync does to each of its requests before sending it: `apply` may add header
    fields or wait. An instance is also an aiohttp client middleware doing the same, so the
    session of the Source's lists and the fetcher's lean client follow one definition."""

    @abstractmethod
    async def apply(self, url: str, headers: MutableMapping[str, str]) -> None:
        """Add header fields to, or wait before, a request to `url`."""

    async def __call__(self, request: ClientRequest, handler: ClientHandlerType) -> ClientResponse:
        await self.apply(str(request.url), request.headers)
        return await handler(request)


class SourceHeaders(RequestRule):
    """Adds `headers` to requests to `source_url`'s origin, and to no other."""

    def __init__(self, source_url: str, headers: Sequence[Header]) -> None:
        self.origin = origin(source_url)
        self.headers = tuple(headers)

    def __repr__(self) -> str:
        return f"SourceHeaders({self.origin!r}, {len(self.headers)} fields)"   # never the values: tokens

    async def apply(self, url: str, headers: MutableMapping[str, str]) -> None:
        if origin(url) == self.origin:
            for name, value in self.headers:
                headers[name] = value


__all__ = ["Header", "Origin", "RequestRule", "SourceHeaders", "origin", "parse_header"]

"""Short words for a failed HTTP request, for messages that already name the URL: aiohttp's own
texts repeat the host ("Cannot connect to host 127.0.0.1:1 ssl:default [Connect call failed
('127.0.0.1', 1)]") and differ by version. The hub's status page says the same things from stored texts
(hub/web/reports.py `short_error`). No I/O here.
"""
from __future__ import annotations

import socket
import ssl

import aiohttp


def describe_client_error(exc: BaseException) -> str:
    """A few words for `exc` (an aiohttp client error, a timeout or an OSError), no host in them."""
    if isinstance(exc, aiohttp.TooManyRedirects):
        return "too many redirects"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError | ssl.SSLError):
        return "TLS failed"
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "no answer in time"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "connection closed without an answer"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return _os_words(exc.os_error)
    if isinstance(exc, OSError):
        return _os_words(exc)
    return _first_line(str(exc) or type(exc).__name__)


def _os_words(error: OSError) -> str:
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return "host name not found"
    if isinstance(error, ConnectionResetError):
        return "connection closed without an answer"
    if isinstance(error, TimeoutError):
        return "no answer in time"
    return (error.strerror or _first_line(str(error))).rstrip(".").lower()


def _first_line(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else "error"
    return first if len(first) <= 120 else first[:119] + "…"


__all__ = ["describe_client_error"]

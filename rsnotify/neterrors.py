"""Short words for a failed HTTP request, for messages that already name the URL: aiohttp's own
texts repeat the host ("Cannot connect to host 127.0.0.1:1 ssl:default [Connect call failed
('127.0.0.1', 1)]") and differ by version. The hub's status page says the same things from stored texts
(hub/web/reports.py `short_error`). No I/O here.
"""
from __future__ import annotations

import logging
import socket
import ssl

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError


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


# --- malformed requests reaching our servers ------------------------------------------------

SERVER_LOGGER = "aiohttp.server"   # where aiohttp logs a request it could not parse, with a traceback


class MalformedRequestFilter(logging.Filter):
    """Turns aiohttp's ERROR-with-traceback for a request it could not parse (a header line
    too long, a bad Content-Length, chunked and Content-Length together, ...) or whose body it
    could not decode (`Content-Encoding: gzip` on bytes that are not: raised again when aiohttp
    drains the rest after our 400) into one INFO line: the client already got its 400, and a
    stranger must not be able to fill our logs with tracebacks. Other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError | RequestPayloadError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "a client"
            text = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
            reason = " ".join(str(text or type(exc).__name__).split()).removeprefix("400, message:").strip()
            record.msg, record.args = "refused a malformed request from %s with 400: %s", (peer, _cut(reason))
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)  # it passed as an ERROR
        return True


def quiet_malformed_requests() -> None:
    """Install MalformedRequestFilter on aiohttp's server logger (once) in a process that serves HTTP."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, MalformedRequestFilter) for f in logger.filters):
        logger.addFilter(MalformedRequestFilter())


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


__all__ = ["MalformedRequestFilter", "describe_client_error", "quiet_malformed_requests"]

"""One blocking HTTP request for sync tests (a hub subprocess, a server thread): never raises
for an HTTP status, so a test asserts the status it expects. `http` gives (status, body);
`fetch` gives the headers too and sends only what the test names."""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message
from http.client import HTTPConnection
from typing import Any

FORM = "application/x-www-form-urlencoded"


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answers (connection refused, reset, timeout)."""
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


def get_json(url: str, timeout: float = 10.0) -> tuple[int, Any]:
    """(status, parsed JSON body or None when the body is not JSON)."""
    status, body = http("GET", url, timeout=timeout)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def post_form(url: str, form: dict[str, str], timeout: float = 10.0) -> tuple[int, bytes]:
    return http("POST", url, urllib.parse.urlencode(form).encode(), {"Content-Type": FORM}, timeout)


@dataclass(frozen=True)
class Response:
    status: int
    headers: Message            # case-insensitive lookup, as HTTP names headers
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


def fetch(url: str, method: str = "GET", body: bytes | str = b"", headers: dict[str, str] | None = None,
          timeout: float = 10.0) -> Response:
    """One request through http.client: no redirect followed, and nothing added to the headers
    the test gives but Host (unless given), Accept-Encoding: identity and Content-Length, so a
    test controls what a hostile or odd client sends. A connection that fails or times out
    raises OSError: nothing answered."""
    parts = urllib.parse.urlsplit(url)
    connection = HTTPConnection(parts.netloc, timeout=timeout)
    try:
        data = body.encode() if isinstance(body, str) else body
        connection.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=data,
                           headers=headers or {})
        response = connection.getresponse()
        return Response(response.status, response.headers, response.read())
    finally:
        connection.close()

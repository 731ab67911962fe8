"""One blocking HTTP request for sync tests (a hub subprocess, a server thread): never raises
for an HTTP status, so a test asserts the status it expects."""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
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

"""The URLs the hub requests at a subscriber's callback, kept byte for byte as the subscriber
sent them: verification, denial and diagnostics GETs add their parameters to its own query
string; deliveries POST to the exact callback."""
from __future__ import annotations

from urllib.parse import urlencode

from yarl import URL


def callback_url(callback: str, params: dict[str, str]) -> URL:
    """The callback with `params` appended to its own query string (kept byte for byte)."""
    base = callback.split("#", 1)[0]
    separator = "&" if "?" in base else "?"
    if base.endswith(("?", "&")):
        separator = ""
    return URL(base + separator + urlencode(params), encoded=True)


def delivery_url(callback: str) -> URL:
    """The exact callback, query string included: no re-quoting of what the subscriber sent."""
    return URL(callback, encoded=True) if callback.isascii() else URL(callback)

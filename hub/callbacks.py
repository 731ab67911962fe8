"""The URLs the hub requests at a subscriber's callback (and a thin ping's topics), kept byte for
byte as the subscriber (or publisher) sent them: verification, denial and diagnostics GETs add
their parameters to its own query string; deliveries POST to the exact callback. Non-ASCII characters (a path or query in another
script: intake made the host ASCII already) go out as percent-encoded UTF-8 (RFC 3987, 3.1),
the same bytes in every request: raw UTF-8 in a request line is no HTTP, and aiohttp's parser
(rsnotify's own callback adapter among others) answers it 400."""
from __future__ import annotations

import re
from urllib.parse import quote, urlencode

from yarl import URL

_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def as_uri(url: str) -> str:
    """`url` with only its non-ASCII characters percent-encoded; everything else as it was."""
    return url if url.isascii() else _NON_ASCII.sub(lambda found: quote(found.group(), safe=""), url)


def callback_url(callback: str, params: dict[str, str]) -> URL:
    """The callback with `params` appended to its own query string (kept byte for byte)."""
    base = as_uri(callback.split("#", 1)[0])
    separator = "&" if "?" in base else "?"
    if base.endswith(("?", "&")):
        separator = ""
    return URL(base + separator + urlencode(params), encoded=True)


def delivery_url(callback: str) -> URL:
    """The exact callback, query string included: no re-quoting of what the subscriber sent."""
    return exact_url(callback)


def exact_url(url: str) -> URL:
    """`url` to request as it was given (a callback, or a topic a thin ping names): yarl's own
    quoting would rewrite escapes (`%41` as `A`, `%2F` in a query as `/`), another resource to a
    server that reads them, or whose signed URLs include them."""
    return URL(as_uri(url), encoded=True)

"""WebSub wire details shared by hub, publisher and subscriber.

RFC 8288 `Link` headers, `X-Hub-Signature` HMACs, and the subscription form's fields with
their validation. Pure functions; no I/O.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import idna

from .errors import Problems, WireError

SIGNATURE_HEADER = "X-Hub-Signature"
SIGNATURE_ALGORITHMS = ("sha1", "sha256", "sha384", "sha512")
MAX_SECRET_BYTES = 200  # hub.secret MUST be less than 200 bytes (WebSub §5.1)
MODES = ("subscribe", "unsubscribe")
# hub.lease_seconds: a hub clamps any well-formed lease to its own bounds (a subscriber asking for "as
# long as possible" sends a huge number); 20 digits hold every 64-bit value and keep int() cheap.
MAX_LEASE_DIGITS = 20

# Headers rsnotify's hub adds to every content distribution (documented in the README):
NOTIFICATION_ID_HEADER = "X-RSNotify-Id"         # stable id of the notification (same on every retry)
SEQUENCE_HEADER = "X-RSNotify-Sequence"          # the notification's position in its topic log: 1, 2, 3...
# rsnotify hub extension to the subscribe form: deliver from this sequence on (a returning
# Destination asks for what it missed; other hubs ignore unknown fields, WebSub §5.1).
REPLAY_FIELD = "rsnotify.replay_from"


# --- Link headers (RFC 8288) -------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class HeaderLink:
    """One link of a `Link` header: target and parameters (`rel` may hold several types)."""

    href: str
    params: tuple[tuple[str, str], ...] = ()

    @property
    def rels(self) -> list[str]:
        return [r.lower() for name, v in self.params if name == "rel" for r in v.split()]

    def param(self, name: str) -> str | None:
        return next((v for n, v in self.params if n == name), None)


def parse_sequence(value: str | None) -> int | None:
    """An X-RSNotify-Sequence value as its number; None when absent or not a whole number (a
    delivery is never refused for it: the sequence only serves to see gaps)."""
    text = (value or "").strip()
    # ASCII and at most 18 digits: int() fails past 4,300 digits, and the stores keep it in SQLite
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def missing_sequences(last: int, sequence: int) -> str:
    """The sequences a jump from `last` to `sequence` skipped: "5", or "5..9"."""
    return f"{last + 1}" if sequence == last + 2 else f"{last + 1}..{sequence - 1}"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def build_link_header(links: Iterable[tuple[str, str]] | Mapping[str, str]) -> str:
    """One combined header value from (href, rel) pairs: `<a>; rel="self", <b>; rel="hub"`."""
    pairs = links.items() if isinstance(links, Mapping) else links
    pairs = [(href, rel) for href, rel in pairs]
    for href, _ in pairs:
        if any(c in href for c in "<>\r\n"):
            raise WireError(f"a Link target must not contain <, > or line breaks, got {href!r}")
    return ", ".join(f"<{href}>; rel={_quote(rel)}" for href, rel in pairs)


_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_LINK_START = re.compile(r"\s*<([^>]*)>\s*")
_ESCAPE = re.compile(r"\\(.)")  # a quoted-pair in a quoted-string
_PARAM = re.compile(rf"\s*;\s*({_TOKEN})\s*(?:=\s*(\"(?:[^\"\\]|\\.)*\"|{_TOKEN}))?\s*")


def parse_link_header(values: str | Iterable[str]) -> list[HeaderLink]:
    """Every link in one or several `Link` header values, in order.

    Raises WireError for a value that is not a list of `<uri>; param=value` links.
    """
    if isinstance(values, str):
        values = [values]
    links: list[HeaderLink] = []
    for value in values:
        pos = 0
        text = value.strip()
        while pos < len(text):
            start = _LINK_START.match(text, pos)
            if not start:
                raise WireError(f"Link header must be '<uri>; rel=...' links, got {value!r}")
            href, pos = start.group(1).strip(), start.end()
            params: list[tuple[str, str]] = []
            while (param := _PARAM.match(text, pos)) is not None:
                name, raw = param.group(1).lower(), param.group(2) or ""
                if raw.startswith('"'):
                    raw = raw[1:-1]
                    if "\\" in raw:
                        raw = _ESCAPE.sub(r"\1", raw)
                params.append((name, raw))
                pos = param.end()
            links.append(HeaderLink(href, tuple(params)))
            rest = text[pos:].lstrip()
            if rest and not rest.startswith(","):
                raise WireError(f"Link header has stray text {rest[:40]!r} in {value!r}")
            pos = len(text) - len(rest) + (1 if rest else 0)
    return links


def links_by_rel(links: Iterable[HeaderLink], rel: str) -> list[str]:
    """The targets of every link carrying relation type `rel` (case-insensitive)."""
    return [link.href for link in links if rel.lower() in link.rels]


# --- X-Hub-Signature -----------------------------------------------------------------------

def sign(body: bytes, secret: str | bytes, algorithm: str = "sha256") -> str:
    """The `X-Hub-Signature` value for `body`: `<algorithm>=<lower-case hex HMAC>`."""
    if algorithm not in SIGNATURE_ALGORITHMS:
        raise WireError(f"signature algorithm must be one of {', '.join(SIGNATURE_ALGORITHMS)}, got {algorithm!r}")
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    return f"{algorithm}={hmac.new(key, body, getattr(hashlib, algorithm)).hexdigest()}"


def verify_signature(body: bytes, secret: str | bytes, header: str | None) -> bool:
    """True when `header` is a valid `X-Hub-Signature` of `body` under `secret`.

    Accepts sha1/sha256/sha384/sha512, hex in either case; compares in constant time. A
    missing, malformed or unknown-algorithm header is simply not valid.
    """
    if not header or "=" not in header:
        return False
    algorithm, _, digest = header.strip().partition("=")
    algorithm = algorithm.strip().lower()
    if algorithm not in SIGNATURE_ALGORITHMS:
        return False
    expected = sign(body, secret, algorithm).partition("=")[2]
    return hmac.compare_digest(expected, digest.strip().lower())


# --- The subscription form ---------------------------------------------------------------

MAX_URL_LENGTH = 2048  # characters; longer topic or callback URLs are refused (request lines, logs, keys)
_URL_FORBIDDEN = re.compile(r'[\x00-\x20\x7f<>"{}|\\^`]')  # controls, space and what RFC 3986 never allows
_HOST = re.compile(r"[A-Za-z0-9._~-]+|\[[0-9A-Fa-f:.]+\]")
# WHATWG URL: a host whose last label is a number is an IPv4 address, and clients read
# "2852039166", "0251.0376.0251.0376" or "0xa9fea9fe" as 169.254.169.254.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
_DOT_SEGMENT = re.compile(r"^(?:\.|%2e){1,2}$", re.IGNORECASE)


def check_url(name: str, value: str | None) -> str:
    """`value` (outer whitespace stripped) when it is an absolute http(s) URL with a host; else
    WireError naming `name`.

    Refused too: more than MAX_URL_LENGTH characters, control characters, spaces and characters
    URIs never hold (`<`, `"`, a backslash...), a fragment, a host that is not a DNS name (labels
    of 1-63 characters, 253 in all) or an IP literal, port 0, and dot segments (`/../`, `/%2e%2e/`), so a URL means one resource however it
    is resolved and a prefix comparison cannot be walked around.
    """
    if not value:
        raise WireError(f"{name} is required, got nothing")
    text = value.strip()
    if len(text) > MAX_URL_LENGTH:
        raise WireError(f"{name} must be at most {MAX_URL_LENGTH} characters, got {len(text)}")
    try:
        parts = urlsplit(text)
        hostname = parts.hostname
    except ValueError:  # an unbalanced IPv6 bracket, for instance
        raise WireError(f"{name} has an invalid host, got {text!r}") from None
    if parts.scheme.lower() not in ("http", "https") or not hostname:
        raise WireError(f"{name} must be an absolute http or https URL, got {text!r}")
    forbidden = _URL_FORBIDDEN.search(text)
    if forbidden:
        raise WireError(f"{name} must not contain {forbidden.group()!r} (spaces and control characters "
                        f"must be percent-encoded), got {text!r}")
    if "#" in text:
        raise WireError(f"{name} must not have a fragment (#...), got {text!r}")
    host = parts.netloc.rpartition("@")[2]
    host = host[: host.find("]") + 1] if host.startswith("[") else host.partition(":")[0]
    if not host.isascii():
        ascii_host = idna_host(name, host, text)
        # the host in the URL replaced where it stands (right after "scheme://userinfo@"), so
        # the rest of the URL keeps its exact spelling
        start = len(parts.scheme) + 3 + len(parts.netloc) - len(parts.netloc.rpartition("@")[2])
        text = text[:start] + ascii_host + text[start + len(host):]
        parts, host = urlsplit(text), ascii_host
        if len(text) > MAX_URL_LENGTH:
            raise WireError(f"{name} must be at most {MAX_URL_LENGTH} characters with its host in IDNA form, "
                            f"got {len(text)}")
    if not _HOST.fullmatch(host):
        raise WireError(f"{name} has an invalid host, got {text!r}")
    if not host.startswith("[") and not _is_dns_name(host):
        # a resolver refuses such a name outright: refused here, it never reaches a worker's lookup
        raise WireError(f"{name} has an invalid host name (labels of 1-63 characters, 253 in all), got {text!r}")
    if _NUMERIC_LABEL.fullmatch(host.rstrip(".").rpartition(".")[2]) and not _is_dotted_quad(host):
        # one address, one spelling: the address guards and prefix comparisons see what a client reaches
        raise WireError(f"{name} has a numeric host that is not an IPv4 address in dotted decimal "
                        f"(a.b.c.d, no leading zeros), got {text!r}")
    try:
        port = parts.port
    except ValueError:
        raise WireError(f"{name} has an invalid port, got {text!r}") from None
    if port == 0:      # nothing listens there: no request to it could ever be answered
        raise WireError(f"{name} has an invalid port, got {text!r}")
    if any(_DOT_SEGMENT.match(segment) for segment in parts.path.split("/")):
        raise WireError(f"{name} must not have '.' or '..' path segments, got {text!r}")
    return text


def idna_host(name: str, host: str, url: str) -> str:
    """A non-ASCII host name in its ASCII (IDNA, punycode) form: mapped as UTS #46 says (case,
    width, the ideographic full stop) and encoded by IDNA 2008. Done once, where a URL comes
    in, so every later check (the address guard, topic prefixes), comparison and Redis key sees
    the one spelling DNS resolves. WireError naming `name` for a host that is no valid IDN."""
    try:
        return idna.encode(host, uts46=True).decode("ascii")
    except (idna.IDNAError, UnicodeError) as exc:
        raise WireError(f"{name} has an invalid internationalized host name {host!r} ({exc}), "
                        f"got {url!r}") from None


def _is_dns_name(host: str) -> bool:
    """True when `host` (ASCII, one trailing dot allowed) has no empty label, no label over 63
    characters and at most 253 in all: what DNS (and getaddrinfo) can carry."""
    name = host.removesuffix(".")
    return 0 < len(name) <= 253 and all(0 < len(label) <= 63 for label in name.split("."))


def _is_dotted_quad(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)   # four decimal parts, no leading zeros (Python >= 3.9.5)
    except ValueError:
        return False
    return True


def normalize_url(url: str) -> str:
    """URL for comparison: scheme and host lower-cased, default port dropped, empty path = '/'."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if not host.isascii():       # the same host however it is spelt: as check_url stores it
        try:
            host = idna_host("host", host, url)
        except WireError:
            pass                # no valid IDN: compared as written (check_url refuses it anyway)
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    netloc = host if port is None or (scheme, port) in (("http", 80), ("https", 443)) else f"{host}:{port}"
    if parts.username:
        netloc = f"{parts.username}{':' + parts.password if parts.password else ''}@{netloc}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


@dataclass(frozen=True, slots=True)
class SubscriptionRequest:
    """A validated `hub.mode=subscribe|unsubscribe` form."""

    mode: str
    topic: str
    callback: str
    lease_seconds: int | None = None
    secret: str | None = field(default=None, repr=False)

    def to_form(self) -> dict[str, str]:
        """The form fields, wire names, for a POST to a hub."""
        form = {"hub.mode": self.mode, "hub.topic": self.topic, "hub.callback": self.callback}
        if self.lease_seconds is not None and self.mode == "subscribe":
            form["hub.lease_seconds"] = str(self.lease_seconds)
        if self.secret is not None and self.mode == "subscribe":
            form["hub.secret"] = self.secret
        return form


def check_lease_seconds(value: str | int | None) -> int | None:
    """A positive integer lease, or None when absent; WireError otherwise."""
    if value is None or value == "":
        return None
    text = str(value).strip()
    # ASCII digits only ('²'.isdigit() is true) and few enough that int() stays cheap
    if len(text) > MAX_LEASE_DIGITS:
        raise WireError(f"hub.lease_seconds must have at most {MAX_LEASE_DIGITS} digits, got {len(text)} characters")
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        raise WireError(f"hub.lease_seconds must be a positive integer, got {value!r}")
    return int(text)


def check_secret(value: str | None) -> str | None:
    """The secret when shorter than 200 bytes in UTF-8; WireError otherwise."""
    if value is None:
        return None
    size = len(value.encode("utf-8"))
    if size >= MAX_SECRET_BYTES:
        raise WireError(f"hub.secret must be less than {MAX_SECRET_BYTES} bytes in UTF-8, got {size} bytes")
    if size == 0:
        raise WireError("hub.secret must not be empty when given")
    return value


SUBSCRIPTION_FIELDS = ("hub.mode", "hub.topic", "hub.callback", "hub.lease_seconds", "hub.secret")
# what an unsubscription reads: its hub.lease_seconds and hub.secret are ignored (WebSub 5.1), so
# not even a repeat of them is a reason to refuse it
UNSUBSCRIPTION_FIELDS = SUBSCRIPTION_FIELDS[:3]


def repeated_field_problem(name: str, values: Sequence[str]) -> str | None:
    """The problem of a form or query field given more than once with different values (None:
    once, or always the same): which one counts would depend on the parser (aiohttp reads the
    first, Django and a dict of parse_qsl the last), and a proxy in front may read another one."""
    if len(set(values)) > 1:
        return f"{name} is given {len(values)} times with different values; send it once"
    return None


def _check_single_values(form: Mapping[str, str], problems: Problems, names: tuple[str, ...]) -> None:
    """Each of `names` repeated with different values in a multidict form is a problem."""
    getall = getattr(form, "getall", None)
    if getall is None:
        return
    for name in names:
        if problem := repeated_field_problem(name, getall(name, [])):
            problems.add(problem)


def parse_subscription_form(form: Mapping[str, str]) -> SubscriptionRequest:
    """Validate a subscribe/unsubscribe form completely; raise one WireError with every problem.

    Unknown parameters are ignored (WebSub §5.1). `hub.lease_seconds` and `hub.secret` are
    ignored for unsubscriptions.
    """
    problems = Problems()
    mode = form.get("hub.mode")
    _check_single_values(form, problems, SUBSCRIPTION_FIELDS if mode == "subscribe" else UNSUBSCRIPTION_FIELDS)
    if mode not in MODES:
        problems.add(f"hub.mode must be subscribe or unsubscribe, got {mode!r}")
    topic = problems.check(check_url, "hub.topic", form.get("hub.topic"))
    callback = problems.check(check_url, "hub.callback", form.get("hub.callback"))
    lease = secret = None
    if mode == "subscribe":
        lease = problems.check(check_lease_seconds, form.get("hub.lease_seconds"))
        secret = problems.check(check_secret, form.get("hub.secret"))
    problems.raise_if_any(WireError)
    return SubscriptionRequest(
        mode=str(mode), topic=str(topic), callback=str(callback),
        lease_seconds=lease, secret=secret,
    )

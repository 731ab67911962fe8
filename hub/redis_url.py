"""The hub's Redis connection URL, read and checked: redis://, rediss://, unix://, and the
Sentinel forms redis+sentinel:// and rediss+sentinel://. Pure parsing: no Redis client is
imported here, so settings (and `rsnotify hub --help`) stay light; hub/redis_clients.py builds
the clients from what this returns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from .errors import SettingsError

PLAIN_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
TLS_SCHEMES = ("rediss", "rediss+sentinel")
SENTINEL_PORT = 26379
REDIS_PORT = 6379
CERT_REQS = ("none", "optional", "required")
# the query arguments the hub passes on (as redis-py's from_url spells them); anything else is
# refused, because redis-py would turn an unknown one into a TypeError at the first connection
QUERY_ARGUMENTS = ("db", "ssl_cert_reqs", "ssl_check_hostname", "client_name")
TLS_ONLY_ARGUMENTS = ("ssl_cert_reqs", "ssl_check_hostname")


@dataclass(frozen=True)
class RedisAddress:
    """A parsed --redis-url. For Sentinel URLs `sentinels` holds the Sentinels' (host, port) and
    `service` the monitored primary's name; the user and password are the data nodes'."""

    url: str = field(repr=False)
    scheme: str
    host: tuple[str, int] | None = None            # redis:// and rediss:// only
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    options: tuple[tuple[str, str], ...] = ()      # the checked query arguments

    @property
    def is_sentinel(self) -> bool:
        return self.scheme in SENTINEL_SCHEMES

    @property
    def is_tls(self) -> bool:
        return self.scheme in TLS_SCHEMES

    @property
    def shown(self) -> str:
        """The URL with its password hidden, for logs, messages and /health."""
        return redacted(self.url)


def redacted(url: str) -> str:
    """`url` with any password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    creds, at, tail = rest.rpartition("@")
    if not at or ":" not in creds:
        return url
    user = creds.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{tail}"


def parse_redis_url(url: str) -> RedisAddress:
    """Read --redis-url; SettingsError with one line naming what is wrong."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme in SENTINEL_SCHEMES:
        return _parse_sentinel(url, scheme)
    if scheme in PLAIN_SCHEMES:
        return _parse_plain(url, scheme)
    raise SettingsError(f"redis_url must start with redis://, rediss://, unix://, redis+sentinel:// or "
                        f"rediss+sentinel://, got {redacted(url)!r}")


def _parse_plain(url: str, scheme: str) -> RedisAddress:
    parts = urlsplit(url)
    options = _options(url, parts.query, scheme)
    db = _db(url, dict(options).get("db", "0"))
    if scheme == "unix":
        if not parts.path:
            raise SettingsError(f"redis_url {redacted(url)!r} names no socket path (unix:///path/to/redis.sock)")
        return RedisAddress(url, scheme, db=db, username=_unquote(parts.username), password=_unquote(parts.password),
                            options=options)
    host = _host_port(url, parts.netloc.rpartition("@")[2], REDIS_PORT)
    path = parts.path.strip("/")
    if path:
        db = _db(url, path)
    return RedisAddress(url, scheme, host=host, db=db, username=_unquote(parts.username),
                        password=_unquote(parts.password), options=options)


def _parse_sentinel(url: str, scheme: str) -> RedisAddress:
    # urlsplit cannot read a comma-separated host list with ports: split it by hand
    rest = url.split("://", 1)[1]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    creds, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = creds.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    if not hosts:
        raise SettingsError(f"redis_url {redacted(url)!r} names no Sentinel: expected "
                            f"{scheme}://HOST:PORT,HOST:PORT/SERVICE_NAME")
    sentinels = tuple(_host_port(url, h, SENTINEL_PORT) for h in hosts.split(","))
    segments = [s for s in path.split("/") if s]
    if not segments:
        raise SettingsError(f"redis_url {redacted(url)!r} names no service: expected "
                            f"{scheme}://HOST:PORT,HOST:PORT/SERVICE_NAME[/DB] (the name the Sentinels monitor)")
    if len(segments) > 2:
        raise SettingsError(f"redis_url {redacted(url)!r} has a path of {len(segments)} parts; expected "
                            "/SERVICE_NAME or /SERVICE_NAME/DB")
    options = _options(url, query, scheme)
    db = _db(url, segments[1] if len(segments) == 2 else dict(options).get("db", "0"))
    return RedisAddress(url, scheme, sentinels=sentinels, service=unquote(segments[0]), db=db,
                        username=username, password=password, options=options)


def _host_port(url: str, text: str, default_port: int) -> tuple[str, int]:
    host, port_text = text, ""
    if text.startswith("["):                      # [::1]:26379
        host, _, tail = text[1:].partition("]")
        port_text = tail.removeprefix(":")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if not host:
        raise SettingsError(f"redis_url {redacted(url)!r} has an empty hostname in {text!r}")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise SettingsError(f"redis_url {redacted(url)!r} has a bad address {text!r} (expected HOST:PORT, PORT a number 1-65535)")
    return host, int(port_text)


def _db(url: str, text: str) -> int:
    if not text.isdigit():
        raise SettingsError(f"redis_url {redacted(url)!r} names database {text!r}; expected a number such as 0")
    return int(text)


def _options(url: str, query: str, scheme: str) -> tuple[tuple[str, str], ...]:
    pairs = parse_qsl(query, keep_blank_values=True)
    for name, value in pairs:
        if name not in QUERY_ARGUMENTS:
            raise SettingsError(f"redis_url {redacted(url)!r} has an unknown argument {name!r}; the hub takes "
                                f"{', '.join(QUERY_ARGUMENTS)}")
        if name in TLS_ONLY_ARGUMENTS and scheme not in TLS_SCHEMES:
            raise SettingsError(f"redis_url {redacted(url)!r} sets {name} without TLS: use rediss:// "
                                "or rediss+sentinel://")
        if name == "ssl_cert_reqs" and value.lower() not in CERT_REQS:
            raise SettingsError(f"redis_url {redacted(url)!r} has ssl_cert_reqs={value!r}; expected "
                                f"{', '.join(CERT_REQS)}")
    return tuple(pairs)


def _unquote(text: str | None) -> str | None:
    return unquote(text) if text else None

"""The hub's settings: one frozen dataclass, filled from options, then RSNOTIFY_* variables, then defaults.

Each field's `help` metadata is the configuration reference; `hub.cli` turns every field into
a `--option` with its `RSNOTIFY_*` variable. Nothing here reads `os.environ` by itself.
"""
from __future__ import annotations

import functools
import ipaddress
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rsnotify.websub import SIGNATURE_ALGORITHMS, normalize_url

from .errors import SettingsError

LOOPBACK_NETWORKS = ("127.0.0.0/8", "::1/128")
ENV_PREFIX = "RSNOTIFY_"
MAX_FUTURE_SKEW = 100 * 365.25 * 86400   # s: no clock drifts this far, and far later limits overflow a datetime


def _opt(default: Any, help: str, *, env: str | None = None, repr: bool = True, like: Any = None) -> Any:
    # `like`: a value of the field's type, for a field whose default (None) does not show it
    return field(default=default, repr=repr, metadata={"help": help, "env": env, "like": like})


@dataclass(frozen=True)
class HubSettings:
    """Everything a hub web process or worker needs. Units: seconds, bytes, counts."""

    # -- serving
    host: str = _opt("127.0.0.1", "Address to listen on.")
    port: int = _opt(8080, "Port to listen on.")
    public_url: str | None = _opt(
        None, "The hub URL advertised as rel=\"hub\" and required in publishers' Link headers "
              "[default: http://HOST:PORT/].")
    redis_url: str | None = _opt(
        None, "A shared Redis: redis://, rediss:// (TLS), unix://, or Sentinels as "
              "redis+sentinel://[USER:PASSWORD@]HOST:PORT,HOST:PORT/SERVICE[/DB] (rediss+sentinel:// for TLS). "
              "Without it the hub runs its own redis-server on a Unix socket in --data-dir, with AOF.")
    data_dir: str = _opt("./rsnotify-data", "Folder for the embedded Redis data and the generated secret key.")
    workers: int = _opt(2, "Worker processes to start as children; 0 for none (run `rsnotify worker` elsewhere).")
    # -- leases (seconds)
    lease_default: int = _opt(864000, "Lease granted when a subscriber asks for none (seconds).")
    lease_min: int = _opt(300, "Shortest lease granted; shorter requests are raised to it (seconds).")
    lease_max: int = _opt(2678400, "Longest lease granted; longer requests are cut to it (seconds).")
    intent_ttl: int = _opt(86400, "How long a subscription request waits for its verification (seconds).")
    # -- publishing
    max_body: int = _opt(50 * 1024 * 1024, "Largest submission body accepted (bytes); 413 beyond.")
    future_skew: float = _opt(
        300.0, "How far a submission's until and change datetimes may lie ahead of the hub's clock (seconds): "
               "a Source's clock may run this much fast. Later ones are refused with 400: they would put every "
               "later notification of the topic before them.")
    publish_tokens: tuple[tuple[str, str], ...] = _opt(
        (), "Publisher bearer token bound to a topic URL prefix, as TOKEN=PREFIX (repeatable). "
            "With no tokens, only loopback clients may publish.", env="RSNOTIFY_PUBLISH_TOKEN", repr=False)
    tokens_file: str | None = _opt(
        None, "File of publisher tokens, one 'TOKEN PREFIX' (or TOKEN=PREFIX) per line; # comments.")
    # -- outbound requests
    allow_networks: tuple[str, ...] = _opt(
        (), "Private/reserved network (CIDR) that callbacks and topics may resolve to (repeatable). "
            "Loopback is allowed automatically only when the public URL itself is on loopback.",
        env="RSNOTIFY_ALLOW_NETWORK")
    secret_key: str | None = _opt(
        None, "Fernet key encrypting subscription secrets at rest [default: generated into "
              "DATA_DIR/secret.key]. Every process of one hub needs the same key.", repr=False)
    signature_algorithm: str = _opt("sha256", "X-Hub-Signature algorithm: sha1, sha256, sha384 or sha512.")
    connect_timeout: float = _opt(5.0, "Connect timeout of outbound requests (seconds).")
    fetch_timeout: float = _opt(10.0, "Total time for a verification, denial or thin-ping fetch (seconds).")
    fetch_max_bytes: int = _opt(50 * 1024 * 1024, "Largest topic body a thin-ping fetch reads (bytes).")
    # -- delivery (fan-out)
    retry_base: float = _opt(2.0, "First retry delay of a failed delivery (seconds); doubles per attempt.")
    retry_cap: float = _opt(3600.0, "Longest delay between two delivery attempts (seconds).")
    max_attempts: int = _opt(40, "Delivery attempts before a notification becomes a dead letter.")
    delivery_concurrency: int = _opt(200, "Subscriptions served at once by one worker for new notifications.")
    retry_concurrency: int = _opt(100, "Subscriptions served at once by one worker for due retries, re-sends and "
                                       "resumes (a lane apart from new notifications).")
    verify_concurrency: int = _opt(100, "Verification requests one worker has in flight at once.")
    host_concurrency: int = _opt(64, "Requests (deliveries and verifications) one worker sends to one callback "
                                     "host (host:port) at once; the others wait without taking a slot.")
    delivery_timeout: float = _opt(15.0, "Total time of one delivery POST (seconds).")
    max_response_bytes: int = _opt(64 * 1024, "Most of a subscriber's response body read, then ignored (bytes).")
    log_max_len: int = _opt(100_000, "Entries kept per topic log.")
    log_max_age: int = _opt(7 * 86400, "Age after which log entries are trimmed (seconds).")
    lock_ttl: int = _opt(60, "Lifetime of a worker's claim on a subscription unless renewed (seconds); a dead "
                             "worker's claims move on sooner, after heartbeat_ttl.")
    heartbeat_ttl: float = _opt(3.0, "A worker whose heartbeat is older than this is dead: another worker takes "
                                     "its subscriptions and verifications over (seconds).")
    lane_lag: float = _opt(30.0, "Age of a lane's oldest waiting item (verification, retry, fan-out) from which "
                                 "/health reports the lane as behind (seconds).")
    redis_connections: int = _opt(256, "Redis connections per process; a request for one more waits for a free "
                                       "one (up to 30 s) instead of failing.")
    reconcile_interval: float = _opt(5.0, "How often workers look for lagging subscriptions (seconds).")
    sweep_interval: float = _opt(60.0, "How often workers remove expired subscriptions (seconds).")
    follow_seconds: float = _opt(5.0, "How long a worker keeps watching a topic's log after a fan-out, "
                                      "delivering new notifications without a queued job (seconds; 0: never).")
    queue_name: str = _opt("rsnotify", "RQ queue name.")
    # -- intake limits (hub/web/): what one client may send, and how fast
    trusted_proxies: tuple[str, ...] = _opt(
        (), "Network (CIDR) of a reverse proxy whose X-Forwarded-For names the client (repeatable). "
            "Without it, a request carrying any forwarding header counts as remote.",
        env="RSNOTIFY_TRUSTED_PROXY")
    max_form: int = _opt(256 * 1024, "Largest form (subscribe, unsubscribe, thin ping) accepted (bytes); 413 beyond.")
    header_timeout: float = _opt(15.0, "Time a client has to send a request's headers, and that an idle "
                                       "keep-alive connection stays open (seconds).")
    body_timeout: float = _opt(60.0, "Time a client has to send a request's body (seconds); 408 beyond.")
    rate_subscribe_client: str = _opt(
        "60/minute", "Subscribe/unsubscribe requests per client address, e.g. 60/minute or 1000/hour "
                     "(empty: no limit); 429 with Retry-After beyond.")
    rate_subscribe_callback_host: str = _opt(
        "30/minute", "Subscribe/unsubscribe requests per callback host (empty: no limit); 429 beyond.")
    rate_publish_token: str = _opt(
        "600/minute", "Submissions and thin pings per publisher token, or per client address on a hub "
                      "without tokens (empty: no limit); 429 beyond.")
    # -- operations (hub/admin.py, hub/logs.py)
    admin_token: str | None = _opt(
        None, "Bearer token for the admin API (/admin/) and the status page's data. Without it, "
              "only loopback clients not behind a proxy may use them.", repr=False)
    log_format: str = _opt("text", "Log line format: text, or json (one object per line, for log shippers).")
    # -- abuse bounds of the intake (hub/web/ratelimit.py, hub/worker/verification.py)
    rate_ipv6_prefix: int = _opt(
        64, "IPv6 clients are rate-limited per network of this prefix length (one /64 is what one "
            "subscriber line gets, so counting single addresses would let it rotate freely).")
    replay_max: int = _opt(
        -1, "Most log entries re-sent to one subscription for rsnotify.replay_from, counted over its "
            "lifetime (-1: the whole retained log; 0: the extension is off).")
    dormant_after: float = _opt(86_400.0, "A subscription whose callback has refused every delivery for this long "
                                          "shows on the status page as dormant, apart from live trouble (seconds).")
    # -- Redis high availability (hub/redis_url.py, hub/redis_clients.py): Sentinel, TLS, replica waits
    sentinel_password: str | None = _opt(
        None, "Password of the Sentinels named in a redis+sentinel:// URL (the URL's own password is the data "
              "nodes').", repr=False)
    redis_ca_file: str | None = _opt(None, "CA certificates (PEM) that a rediss:// server's certificate must chain to.")
    redis_cert_file: str | None = _opt(None, "Client certificate (PEM) for a rediss:// server that asks for one.")
    redis_key_file: str | None = _opt(None, "Private key (PEM) of --redis-cert-file.", repr=False)
    redis_timeout: float = _opt(5.0, "A Redis command of a web request that has not answered within this fails, "
                                     "and the request is answered 503 + Retry-After (seconds); also the connect "
                                     "timeout of every process.")
    min_replicas: int | None = _opt(
        None, "Replicas that must hold a publish before it is answered 200 (Redis WAIT); 503 when fewer "
              "acknowledge within --replica-timeout [default: 1 on a Sentinel URL, else 0].", like=0)
    replica_timeout: float = _opt(1.0, "How long a publish waits for --min-replicas (seconds); below --redis-timeout.")

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port must be 0-65535, got {self.port}")
        for name in ("lease_min", "lease_default", "lease_max", "intent_ttl", "max_body",
                     "fetch_max_bytes", "max_attempts", "delivery_concurrency", "log_max_len",
                     "lock_ttl", "max_response_bytes", "retry_concurrency", "verify_concurrency",
                     "host_concurrency", "heartbeat_ttl", "lane_lag", "redis_connections"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be a positive number, got {getattr(self, name)}")
        if not 0 <= self.future_skew <= MAX_FUTURE_SKEW:   # a later limit is past the last datetime there is
            problems.append(f"future_skew must be 0-{MAX_FUTURE_SKEW:.0f} seconds (100 years), got {self.future_skew}")
        if self.workers < 0:
            problems.append(f"workers must be 0 or more, got {self.workers}")
        if not self.lease_min <= self.lease_default <= self.lease_max:
            problems.append(f"leases must satisfy lease_min <= lease_default <= lease_max, got "
                            f"{self.lease_min} <= {self.lease_default} <= {self.lease_max}")
        if self.log_format not in ("text", "json"):
            problems.append(f"log_format must be text or json, got {self.log_format!r}")
        if self.signature_algorithm not in SIGNATURE_ALGORITHMS:
            problems.append(f"signature_algorithm must be one of {', '.join(SIGNATURE_ALGORITHMS)}, "
                            f"got {self.signature_algorithm!r}")
        for name in ("allow_networks", "trusted_proxies"):
            for cidr in getattr(self, name):
                try:
                    ipaddress.ip_network(cidr, strict=False)
                except ValueError:
                    problems.append(f"{name} must hold CIDRs like 10.0.0.0/8, got {cidr!r}")
        for name in ("max_form", "header_timeout", "body_timeout", "dormant_after", "connect_timeout",
                     "fetch_timeout", "retry_base", "retry_cap", "delivery_timeout", "reconcile_interval",
                     "sweep_interval"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be a positive number, got {getattr(self, name)}")
        for spec in fields(self):   # nan passes every "<= 0" test above, and inf never ends a wait
            value = getattr(self, spec.name)
            if isinstance(value, float) and not math.isfinite(value):
                problems.append(f"{spec.name} must be a finite number, got {value}")
        for name in ("rate_subscribe_client", "rate_subscribe_callback_host", "rate_publish_token"):
            problem = rate_problem(getattr(self, name))
            if problem:
                problems.append(f"{name} {problem}")
        for token, prefix in self.publish_tokens:
            if not token or not prefix.startswith(("http://", "https://")):
                problems.append("publish tokens must be TOKEN=PREFIX with an http(s) URL prefix, "
                                f"got a token for {prefix!r}")
        if self.public_url is not None and not self.public_url.startswith(("http://", "https://")):
            problems.append(f"public_url must be an http or https URL, got {self.public_url!r}")
        problems += self._bound_problems()
        problems.extend(self.redis_problems())
        if problems:
            raise SettingsError(problems)

    def _bound_problems(self) -> list[str]:
        problems = []
        if not 1 <= self.rate_ipv6_prefix <= 128:
            problems.append(f"rate_ipv6_prefix must be 1-128, got {self.rate_ipv6_prefix}")
        if self.replay_max < -1:
            problems.append(f"replay_max must be -1 (the whole log), 0 (off) or more, got {self.replay_max}")
        return problems

    # -- derived values (the settings are frozen, so the costly ones are computed once per object:
    # the web process asks for them on every request)

    @functools.cached_property
    def hub_url(self) -> str:
        """The hub's own URL, normalized: --public-url, else http://HOST:PORT/."""
        if self.public_url:
            return normalize_url(self.public_url)
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return normalize_url(f"http://{host}:{self.port}/")

    @functools.cached_property
    def hub_path(self) -> str:
        """The path of the hub's own URL ("/" when it has none): the hub endpoint answers there too."""
        return urlsplit(self.hub_url).path or "/"

    @functools.cached_property
    def is_public_url_loopback(self) -> bool:
        """Is the advertised hub URL itself on loopback (a hub for this machine only)?

        Listening on loopback says nothing: behind a local reverse proxy every remote client
        arrives from 127.0.0.1, so loopback targets are allowed only for a loopback public URL.
        """
        host = (urlsplit(self.hub_url).hostname or "").lower()
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    @functools.cached_property
    def trusted_proxy_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(c, strict=False) for c in self.trusted_proxies)

    @property
    def is_embedded(self) -> bool:
        return self.redis_url is None

    @functools.cached_property
    def allowed_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """Non-public networks outbound requests may reach: --allow-network, plus loopback when the
        public URL is on loopback."""
        cidrs = list(self.allow_networks) + (list(LOOPBACK_NETWORKS) if self.is_public_url_loopback else [])
        return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser().resolve()

    def all_publish_tokens(self) -> tuple[tuple[str, str], ...]:
        """--publish-token pairs plus the tokens file's (read now). Raises SettingsError on a bad file."""
        if not self.tokens_file:
            return self.publish_tokens
        return self.publish_tokens + read_tokens_file(self.tokens_file)

    # -- environment

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> HubSettings:
        """Settings from RSNOTIFY_* variables in `environ` (tests pass a dict), then `overrides`."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = env_name(f.name)
            if name in environ and environ[name] != "":
                like = f.default if f.metadata.get("like") is None else f.metadata["like"]
                values[f.name] = _cast(f.name, name, environ[name], like)
        values.update(overrides)
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """RSNOTIFY_* variables that rebuild these settings with from_env (for child workers)."""
        env: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == ():
                continue
            if f.name == "publish_tokens":
                env[env_name(f.name)] = " ".join(f"{t}={p}" for t, p in value)
            elif isinstance(value, tuple):
                env[env_name(f.name)] = " ".join(value)
            else:
                env[env_name(f.name)] = str(value)
        return env

    def with_values(self, **changes: Any) -> HubSettings:
        return replace(self, **changes)

    # -- Redis high availability

    def redis_problems(self) -> list[str]:
        """What is wrong with --redis-url and its companions (one line each; none: fine)."""
        from .redis_url import parse_redis_url

        problems: list[str] = []
        address = None
        if self.redis_url is not None:
            try:
                address = parse_redis_url(self.redis_url)
            except SettingsError as exc:
                problems.extend(exc.problems)
        if self.redis_timeout <= 0:
            problems.append(f"redis_timeout must be a positive number, got {self.redis_timeout}")
        if self.min_replicas is not None and self.min_replicas < 0:
            problems.append(f"min_replicas must be 0 or more, got {self.min_replicas}")
        if not 0 < self.replica_timeout < self.redis_timeout:
            problems.append(f"replica_timeout must be above 0 and below redis_timeout ({self.redis_timeout}), "
                            f"got {self.replica_timeout}")
        for name in ("redis_ca_file", "redis_cert_file", "redis_key_file"):
            path = getattr(self, name)
            if path is None:
                continue
            if address is not None and not address.is_tls:
                problems.append(f"{name} needs a rediss:// or rediss+sentinel:// redis_url, got "
                                f"{address.shown!r}")
            elif not Path(path).expanduser().is_file():
                problems.append(f"{name} {path!r} is not a readable file")
        if (self.redis_cert_file is None) != (self.redis_key_file is None):
            problems.append("redis_cert_file and redis_key_file go together: give both or neither")
        return problems

    @property
    def is_sentinel(self) -> bool:
        """Does --redis-url name Sentinels (redis+sentinel:// or rediss+sentinel://)?"""
        return bool(self.redis_url) and str(self.redis_url).lower().startswith(("redis+sentinel://",
                                                                                 "rediss+sentinel://"))

    @property
    def replicas_to_wait_for(self) -> int:
        """--min-replicas, or its default: 1 on a Sentinel URL (there are replicas), else 0."""
        if self.min_replicas is not None:
            return self.min_replicas
        return 1 if self.is_sentinel else 0


def rate_problem(text: str) -> str | None:
    """Why `text` is not a rate such as 60/minute (None when it is one, or empty: no limit)."""
    if not text.strip():
        return None
    # the notation of the package that enforces the rates, loaded here (like Redis and RQ
    # elsewhere) so that `rsnotify hub --help` works without the [hub] extra
    from limits import parse as parse_rate

    try:
        parse_rate(text)
    except ValueError:
        return f"must be a rate such as 60/minute, 5/second or 1000/hour (empty: no limit), got {text!r}"
    return None


def env_name(field_name: str) -> str:
    """The RSNOTIFY_* variable of a settings field."""
    for f in fields(HubSettings):
        if f.name == field_name and f.metadata.get("env"):
            return str(f.metadata["env"])
    return ENV_PREFIX + field_name.upper()


def parse_token(text: str) -> tuple[str, str]:
    """'TOKEN=PREFIX' -> (token, prefix); SettingsError naming what is wrong."""
    token, sep, prefix = text.strip().partition("=")
    if not sep or not token.strip() or not prefix.strip().startswith(("http://", "https://")):
        raise SettingsError(f"a publish token must be TOKEN=PREFIX with an http(s) URL prefix, "
                            f"got {_mask(text)!r}")
    return token.strip(), prefix.strip()


def parse_tokens(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    return tuple(parse_token(t) for t in texts)


def read_tokens_file(path: str) -> tuple[tuple[str, str], ...]:
    """Tokens from a file: one 'TOKEN PREFIX' or 'TOKEN=PREFIX' per line; blank lines and # comments skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot read tokens file {path}: {exc.strerror}") from exc
    pairs = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        try:
            pairs.append(parse_token(line if len(parts) == 1 else f"{parts[0]}={parts[1]}"))
        except SettingsError:
            raise SettingsError(f"{path}:{number}: expected 'TOKEN PREFIX' with an http(s) URL prefix, "
                                f"got {_mask(line)!r}") from None
    return tuple(pairs)


def _mask(text: str) -> str:
    """A token-bearing text with the token hidden, for error messages."""
    token, sep, rest = text.replace(" ", "=", 1).partition("=")
    return f"***{sep}{rest}" if token else text


def _cast(field_name: str, var: str, raw: str, default: Any) -> Any:
    if field_name == "publish_tokens":
        return parse_tokens(raw.split())
    try:
        if field_name in ("allow_networks", "trusted_proxies"):
            return tuple(raw.split())
        if isinstance(default, bool):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        kind = "an integer" if isinstance(default, int) else "a number"
        raise SettingsError(f"{var} must be {kind}, got {raw!r}") from None
    return raw

"""SubscriberSettings: every knob of the subscriber toolkit, with its default and unit.

Filled from command-line options, then RSNOTIFY_SUBSCRIBER_* environment variables, then
the defaults below. This file is the configuration reference. No I/O here.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from rsnotify.notification import FUTURE_SKEW

from .errors import SettingsError

ENV_PREFIX = "RSNOTIFY_SUBSCRIBER_"
CALLBACK_PATH = "/websub"  # where the CLI serves callbacks when --callback-url is not given


@dataclass(frozen=True)
class SubscriberSettings:
    # Where `rsnotify subscribe` binds its callback server (host and TCP port; 0 = any free port).
    listen_host: str = "127.0.0.1"
    listen_port: int = 8081
    # Base URL under which each subscription gets its own callback URL (base + "/" + token).
    # None: http://<listen_host>:<listen_port>/websub.
    callback_url: str | None = None
    # JSON file holding subscriptions, secrets and leases across restarts.
    state_file: str = "rsnotify-subscriber.json"
    # Lease asked of the hub, in seconds; None lets the hub choose. The hub may grant another.
    lease_seconds: int | None = None
    # Ask for signed deliveries with a fresh random secret per subscription (WebSub §8.2).
    use_secret: bool = True
    # Largest delivery body accepted, in bytes (a Sitemap document is at most 50 MiB).
    max_body_bytes: int = 52_428_800
    # Seconds a delivered notification's datetimes (a change's datetime, `until`) may lie ahead of
    # this machine's clock (clocks drift); later ones are refused (400) and the hub delivers again.
    future_skew: float = FUTURE_SKEW
    # Timeout of each request to a hub or a Source, in seconds.
    request_timeout: float = 30.0
    # How long subscribe()/unsubscribe() wait for the hub's verification GET, in seconds.
    verification_timeout: float = 30.0
    # Renewal happens at a random point between these fractions of the granted lease.
    renew_after_min: float = 0.75
    renew_after_max: float = 0.90
    # Delay before retrying a renewal the hub refused or did not answer, in seconds.
    renew_retry_seconds: float = 60.0
    # Longest pause of the renewal loop between checks, in seconds.
    renew_check_seconds: float = 30.0
    # Notification ids remembered per subscription to drop repeats.
    remembered_ids: int = 1000
    # Unsubscribed, denied or failed subscriptions are forgotten after this many seconds.
    forget_after_seconds: float = 86_400.0

    def __post_init__(self) -> None:
        problems = []
        if not 0 <= self.listen_port <= 65535:
            problems.append(f"listen_port must be 0..65535, got {self.listen_port}")
        if self.lease_seconds is not None and self.lease_seconds <= 0:
            problems.append(f"lease_seconds must be a positive integer, got {self.lease_seconds}")
        if self.max_body_bytes <= 0:
            problems.append(f"max_body_bytes must be positive, got {self.max_body_bytes}")
        if not 0 < self.renew_after_min <= self.renew_after_max < 1:
            problems.append(
                "renew_after_min and renew_after_max must satisfy 0 < min <= max < 1, "
                f"got {self.renew_after_min} and {self.renew_after_max}"
            )
        if not 0 <= self.future_skew < math.inf:
            problems.append(f"future_skew must be a number of seconds >= 0, got {self.future_skew}")
        for name in ("request_timeout", "verification_timeout", "renew_retry_seconds", "renew_check_seconds"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        if problems:
            raise SettingsError("\n".join(problems))

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> SubscriberSettings:
        """Settings from RSNOTIFY_SUBSCRIBER_<FIELD> variables, then `overrides` (non-None) on top."""
        values: dict[str, Any] = {}
        for field in fields(cls):
            name = ENV_PREFIX + field.name.upper()
            if name in environ:
                values[field.name] = _cast(name, environ[name], field.default)
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


def _cast(name: str, text: str, default: Any) -> Any:
    """`text` converted to the type of the field's default; SettingsError naming the variable."""
    text = text.strip()
    try:
        if isinstance(default, bool):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int) or name.endswith("LEASE_SECONDS"):
            return int(text) if text else None
        if isinstance(default, float):
            return float(text)
    except ValueError:
        expected = "true or false" if isinstance(default, bool) else "a number"
        raise SettingsError(f"{name} must be {expected}, got {text!r}") from None
    return text or None


def parse_listen(value: str) -> tuple[str, int]:
    """('host', port) from 'HOST:PORT' (IPv6 as '[::1]:PORT'); SettingsError otherwise."""
    host, sep, port = value.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise SettingsError(f"--listen must be HOST:PORT, e.g. 127.0.0.1:8081, got {value!r}")
    return host, int(port)

"""PublisherSettings: every knob of the publisher, its default, unit and environment variable.

This file is the publisher's configuration reference. Nothing else reads `os.environ`: the
CLI's options carry the same `RSNOTIFY_*` names, and library users pass values as arguments.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rsnotify.notification import FUTURE_SKEW

from .errors import SettingsError


@dataclass(frozen=True)
class PublisherSettings:
    """Settings of a Publisher; `from_env` fills them from `RSNOTIFY_*` variables."""

    hub_urls: tuple[str, ...] = ()          # RSNOTIFY_HUB_URL: the hub(s) to POST to; several: space/comma-separated
    topic_url: str | None = None             # RSNOTIFY_TOPIC_URL: the topic URI (the channel)
    capability_list_url: str | None = None   # RSNOTIFY_CAPABILITY_LIST_URL: sent as Link rel=resourcesync, and rel=up in documents
    token: str | None = field(default=None, repr=False)  # RSNOTIFY_HUB_TOKEN: bearer token for the hub
    timeout: float = 30.0                    # RSNOTIFY_PUBLISH_TIMEOUT: seconds for one POST, connect to last byte
    max_attempts: int = 5                    # RSNOTIFY_PUBLISH_ATTEMPTS: tries per document and hub for 5xx / connection errors
    retry_delay: float = 0.5                 # RSNOTIFY_PUBLISH_RETRY_DELAY: seconds before the first retry; doubles each time
    max_retry_delay: float = 30.0            # RSNOTIFY_PUBLISH_MAX_RETRY_DELAY: cap on one backoff (and on a hub's Retry-After)
    state_path: str | None = None            # RSNOTIFY_PUBLISH_STATE: change memory file (SQLite): the from/until chain and every change
    max_entries: int = 50_000                # RSNOTIFY_MAX_ENTRIES: resource changes per document (Sitemap limit)
    max_bytes: int = 50_000_000              # RSNOTIFY_MAX_BYTES: bytes per document (Sitemap limit, 50 MB)
    future_skew: float = FUTURE_SKEW         # RSNOTIFY_FUTURE_SKEW: seconds a change's datetime may lie ahead of the clock

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> PublisherSettings:
        """Settings from `environ` (pass `os.environ` or a dict); `overrides` win over both.

        Raises SettingsError naming the variable and the value when one cannot be read.
        """
        values: dict[str, Any] = {}
        for name, (variable, cast) in _VARIABLES.items():
            raw = environ.get(variable)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[name] = cast(raw.strip())
            except ValueError:
                raise SettingsError(f"{variable} must be {_EXPECTED[cast]}, got {raw!r}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise SettingsError(f"unknown publisher setting(s): {', '.join(sorted(unknown))}")
        return cls(**values)


def split_urls(text: str) -> tuple[str, ...]:
    """`"http://a/hub http://b/hub"` or comma-separated -> ("http://a/hub", "http://b/hub")."""
    return tuple(part for part in re.split(r"[\s,]+", text) if part)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(text)
    return value


_EXPECTED: dict[Callable[[str], Any], str] = {
    str: "a text",
    split_urls: "one or more URLs",
    _positive_int: "a positive integer",
    _positive_float: "a positive number",
    _non_negative_float: "a number >= 0",
}

_VARIABLES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "hub_urls": ("RSNOTIFY_HUB_URL", split_urls),
    "topic_url": ("RSNOTIFY_TOPIC_URL", str),
    "capability_list_url": ("RSNOTIFY_CAPABILITY_LIST_URL", str),
    "token": ("RSNOTIFY_HUB_TOKEN", str),
    "timeout": ("RSNOTIFY_PUBLISH_TIMEOUT", _positive_float),
    "max_attempts": ("RSNOTIFY_PUBLISH_ATTEMPTS", _positive_int),
    "retry_delay": ("RSNOTIFY_PUBLISH_RETRY_DELAY", _non_negative_float),
    "max_retry_delay": ("RSNOTIFY_PUBLISH_MAX_RETRY_DELAY", _non_negative_float),
    "state_path": ("RSNOTIFY_PUBLISH_STATE", str),
    "max_entries": ("RSNOTIFY_MAX_ENTRIES", _positive_int),
    "max_bytes": ("RSNOTIFY_MAX_BYTES", _positive_int),
    "future_skew": ("RSNOTIFY_FUTURE_SKEW", _non_negative_float),
}

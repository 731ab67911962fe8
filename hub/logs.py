"""Log line formats of the hub's processes: text for people, JSON (one object per line) for log shippers.

Only entry points (hub/cli.py) call configure_logging; modules just log with %-style arguments,
and a JSON line keeps the message template (`event`) and its values (`args`) apart, so a shipper
can group lines by event and still read each id.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")

# attributes every LogRecord has; anything else on a record came from `extra=` (ids, counts)
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, event, args,
    process, any `extra=` fields, and the traceback as `exception` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        if isinstance(record.msg, str) and record.args:
            line["event"] = record.msg
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            line["args"] = [_plain(a) for a in args]
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in line:
                line[name] = _plain(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


# Control characters (CR, LF, ESC...) in a logged value would forge or garble lines.
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(32), 127)}
MAX_FIELD = 300  # characters of one logged value (a 1 MB URL is not copied into every line)


def escape(value: object, limit: int = MAX_FIELD) -> str:
    """A value fit for one log line: control characters escaped, cut at `limit` characters."""
    text = str(value)
    if len(text) > limit:
        text = f"{text[:limit]}…({len(text)} characters)"
    return text.translate(_CONTROLS)


def redact_callback(url: str) -> str:
    """A callback URL for INFO lines: scheme and host only, since the rest of an unsigned
    subscription's callback is its only credential."""
    scheme, _, rest = str(url).partition("://")
    authority = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    return escape(f"{scheme}://{authority}/…" if rest else "…")


def redact_in(text: object, callback: str) -> str:
    """`text` (an error message, a reason) for INFO lines: whatever of `callback` beyond its
    scheme and host (credentials, path, query) is replaced by "…", then escaped. An HTTP
    client's error may quote the URL it was asked for."""
    text = str(text)
    rest = str(callback).partition("://")[2]
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    userinfo, _, _ = rest[:cut].rpartition("@")
    secret = rest[cut:]
    # longest first: the path with its query, then the path alone (a client may drop the query)
    for part in (secret, secret.split("?", 1)[0].split("#", 1)[0], f"{userinfo}@" if userinfo else ""):
        if len(part) > 1:
            text = text.replace(part, "/…" if part.startswith("/") else "…")
    return escape(text)


class EscapingFormatter(logging.Formatter):
    """The text format, with control characters in the message escaped (tracebacks keep their lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(_CONTROLS)
        return super().formatMessage(record)


# --- deliveries and verifications: named fields, and a summary instead of a line per success ---

FIELD_NAMES = ("sid", "nid", "seq", "status", "ms", "attempt")
SUMMARY_EVERY = 60.0   # s between two summary lines of one worker


def delivery_fields(sid: str, nid: str | None = None, seq: int | None = None, status: int | None = None,
                    ms: float | None = None, attempt: int | None = None) -> dict[str, Any]:
    """`extra=` for a delivery or verification line: the same six named fields on every one (None
    when not known), so a log shipper can filter by subscription, notification, status or latency."""
    return {"sid": sid, "nid": nid, "seq": seq, "status": status,
            "ms": None if ms is None else round(ms, 1), "attempt": attempt}


class DeliverySummary:
    """Counts one worker's delivery outcomes and logs one INFO line per minute. Successes are
    logged one by one only at DEBUG (at full fan-out there are thousands a second); failures
    keep their own WARNING lines."""

    def __init__(self, logger: logging.Logger, every: float = SUMMARY_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log, self._every, self._clock = logger, every, clock
        self._start = clock()
        self._outcomes: dict[str, int] = {}
        self._ms: list[float] = []

    def add(self, outcome: str, ms: float) -> None:
        self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1
        if len(self._ms) < 100_000:      # enough for the percentiles of a busy minute
            self._ms.append(ms)

    def log_if_due(self) -> None:
        """The summary line, once `every` seconds have passed since the last one and anything happened."""
        elapsed = self._clock() - self._start
        if elapsed < self._every:
            return
        outcomes, times = self._outcomes, sorted(self._ms)
        self._start, self._outcomes, self._ms = self._clock(), {}, []
        if not outcomes:
            return
        p50, p99 = (times[int(q * (len(times) - 1))] for q in (0.5, 0.99))
        counts = {name: outcomes.get(name, 0) for name in ("delivered", "retry", "dead", "gone")}
        self._log.info("deliveries in the last %.0f s: %d delivered, %d failed and retried, %d dead letters, "
                       "%d ended by 410; POST p50 %.1f ms, p99 %.1f ms", elapsed, *counts.values(), p50, p99,
                       extra={"summary": "deliveries", "seconds": round(elapsed), **counts,
                              "p50_ms": round(p50, 1), "p99_ms": round(p99, 1)})


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Send the process's log lines to stderr, as text or JSON, from `level` up."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be text or json, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else EscapingFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # imported here: neterrors brings aiohttp, which `rsnotify hub --help` (hub/cli.py imports
    # this module) has no use for
    from rsnotify.neterrors import quiet_malformed_requests
    quiet_malformed_requests()


class OutageLog:
    """One warning when a loop's Redis calls start failing and one line when they work again,
    however many times the loop retries in between (loops retry every second; a line each time
    would flood the log during an outage)."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log, self.what = log, what
        self.failing = False

    def failed(self, exc: BaseException) -> None:
        if not self.failing:
            self.log.warning("%s: Redis failed (%s); trying again every second", self.what, exc)
        self.failing = True

    def recovered(self) -> None:
        if self.failing:
            self.log.info("%s: Redis answers again", self.what)
            self.failing = False

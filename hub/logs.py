"""Log line formats of the hub's processes: text for people, JSON (one object per line) for log shippers.

Only entry points (hub/cli.py) call configure_logging; modules just log with %-style arguments,
and a JSON line keeps the message template (`event`) and its values (`args`) apart, so a shipper
can group lines by event and still read each id.
"""
from __future__ import annotations

import json
import logging
import sys
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


class EscapingFormatter(logging.Formatter):
    """The text format, with control characters in the message escaped (tracebacks keep their lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(_CONTROLS)
        return super().formatMessage(record)


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

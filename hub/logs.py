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


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Send the process's log lines to stderr, as text or JSON, from `level` up."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be text or json, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

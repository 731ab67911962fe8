"""--log-format json: one JSON object per line, with the message template and its ids apart, for
log shippers; and the admin actions log one line each with the subscription id."""
from __future__ import annotations

import json
import logging
import sys

from cryptography.fernet import Fernet

from rsnotify.hub.logs import JsonFormatter
from tests.support import cli


def test_json_line_keeps_event_args_and_extra_ids() -> None:
    record = logging.getLogger("rsnotify.hub.delivery").makeRecord(
        "rsnotify.hub.delivery", logging.INFO, __file__, 1, "delivered %s (seq %d) to %s: %d in %.1f ms",
        ("1700000000000-0", 3, "https://sub.example/cb", 200, 12.34), None, extra={"sid": "ab" * 16})
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "delivered 1700000000000-0 (seq 3) to https://sub.example/cb: 200 in 12.3 ms"
    assert line["event"] == "delivered %s (seq %d) to %s: %d in %.1f ms"
    assert line["args"] == ["1700000000000-0", 3, "https://sub.example/cb", 200, 12.34]
    assert line["sid"] == "ab" * 16 and line["level"] == "INFO" and line["logger"] == "rsnotify.hub.delivery"
    assert line["time"].endswith("+00:00")


def test_json_line_carries_the_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("x").makeRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "failed" and "ValueError: boom" in line["exception"]


def test_worker_logs_json_lines(redis_url: str, tmp_path) -> None:
    env = {"PATH": "/usr/bin:/bin", "RSNOTIFY_SECRET_KEY": Fernet.generate_key().decode()}
    done = cli.run("worker", "--burst", "--redis-url", redis_url, "--data-dir", str(tmp_path), "--log-format", "json",
                   env=env, inherit_env=False)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    assert any(line["logger"] == "rsnotify.hub.worker.process" and "ready" in line["message"] for line in lines), done.stderr


def test_bad_log_format_is_a_usage_error(redis_url: str) -> None:
    done = cli.run("worker", "--burst", "--redis-url", redis_url, "--log-format", "xml")
    assert done.returncode == 2
    assert "log_format must be text or json, got 'xml'" in done.stderr


async def test_admin_actions_log_one_line_with_the_subscription_id(ops_hub, subscriber, caplog) -> None:
    sid = await ops_hub.subscribe(subscriber.url("/logged"))
    with caplog.at_level(logging.INFO, logger="rsnotify.hub.web.admin"):
        await ops_hub.admin("POST", f"/admin/subscriptions/{sid}/pause")
        await ops_hub.admin("POST", f"/admin/subscriptions/{sid}/resume")
    actions = [(r.action, r.sid) for r in caplog.records if r.name == "rsnotify.hub.web.admin"]
    assert actions == [("pause", sid), ("resume", sid)]

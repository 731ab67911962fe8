"""--log-format json: one JSON object per line, with the message template and its ids apart, for
log shippers; and the admin actions log one line each with the subscription id."""
from __future__ import annotations

import json
import logging
import sys

from cryptography.fernet import Fernet

from rsnotify.hub.logs import FIELD_NAMES, DeliverySummary, JsonFormatter
from tests.support import cli

from .conftest import body


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
    assert "Invalid value for '--log-format'" in done.stderr and "'xml' is not one of 'text', 'json'" in done.stderr


async def test_admin_actions_log_one_line_with_the_subscription_id(ops_hub, subscriber, caplog) -> None:
    sid = await ops_hub.subscribe(subscriber.url("/logged"))
    with caplog.at_level(logging.INFO, logger="rsnotify.hub.web.admin"):
        await ops_hub.admin("POST", f"/admin/subscriptions/{sid}/pause")
        await ops_hub.admin("POST", f"/admin/subscriptions/{sid}/resume")
    actions = [(r.action, r.sid) for r in caplog.records if r.name == "rsnotify.hub.web.admin"]
    assert actions == [("pause", sid), ("resume", sid)]


async def test_every_delivery_line_names_its_fields_and_successes_stay_at_debug(ops_hub, subscriber, caplog) -> None:
    caplog.set_level(logging.INFO, logger="rsnotify.hub.worker.verification")
    good = await ops_hub.subscribe(subscriber.url("/good"))
    subscriber.on("/bad", 500)
    bad = await ops_hub.subscribe(subscriber.url("/bad"))
    with caplog.at_level(logging.DEBUG, logger="rsnotify.hub.worker.outcomes"):
        published = await ops_hub.publish(body(1))
        await ops_hub.drain()
    lines = [r for r in caplog.records if r.name == "rsnotify.hub.worker.outcomes"]
    for record in lines:
        assert all(hasattr(record, name) for name in FIELD_NAMES), record.getMessage()
        line = json.loads(JsonFormatter().format(record))
        assert {name: line[name] for name in ("sid", "nid", "seq")} == {
            "sid": record.sid, "nid": published["notification_id"], "seq": 1}
    [delivered] = [r for r in lines if r.sid == good]
    assert delivered.levelno == logging.DEBUG and delivered.status == 200 and delivered.attempt == 1
    assert isinstance(delivered.ms, float)
    failures = [r for r in lines if r.sid == bad]
    assert [r.attempt for r in failures] == [1, 2, 3]                       # max_attempts=3, then a dead letter
    assert all(r.levelno == logging.WARNING and r.status == 500 for r in failures)
    assert "dead letter" in failures[-1].getMessage()
    verified = [r for r in caplog.records if r.name == "rsnotify.hub.worker.verification"]
    assert sorted(r.sid for r in verified) == sorted([good, bad])
    assert all(r.status == 200 and isinstance(r.ms, float) and hasattr(r, "nid") for r in verified)


def test_one_summary_line_a_minute_with_counts_and_latency(caplog) -> None:
    now = [0.0]
    summary = DeliverySummary(logging.getLogger("rsnotify.test.summary"), every=60, clock=lambda: now[0])
    for ms in range(1, 101):
        summary.add("delivered", float(ms))
    summary.add("retry", 5000.0)
    summary.add("dead", 5000.0)
    with caplog.at_level(logging.INFO, logger="rsnotify.test.summary"):
        now[0] = 59.0
        summary.log_if_due()                     # not a minute yet
        now[0] = 61.0
        summary.log_if_due()
        now[0] = 200.0
        summary.log_if_due()                     # nothing happened since: no line
    [record] = caplog.records
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith("deliveries in the last 61 s: 100 delivered, 1 failed and retried, "
                                          "1 dead letters, 0 ended by 410; POST p50 51.0 ms, p99 100.0 ms")
    line = json.loads(JsonFormatter().format(record))
    assert (line["summary"], line["delivered"], line["retry"], line["dead"]) == ("deliveries", 100, 1, 1)

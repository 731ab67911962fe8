"""Dormant subscriptions: a callback that has refused every delivery for longer than
--dormant-after is told apart from live trouble (hub/web/reports.py), with its own short line."""
from __future__ import annotations

from dataclasses import replace

from rsnotify.hub.web.reports import SubscriptionSummary

NOW = 1_800_000_000.0
DAY = 86_400.0


def refusing(**changes: object) -> SubscriptionSummary:
    """A subscription created 3 days ago whose callback has answered 500 to everything."""
    summary = SubscriptionSummary(
        sid="a" * 32, topic="https://source.example/rs", callback="https://gone.example/cb", tid="b" * 32,
        state="active", expires=int(NOW + 10 * DAY), lease_seconds=int(30 * DAY), created=int(NOW - 3 * DAY),
        attempts=0, next_attempt=0.0, last_status="500", last_error="", last_attempt_at=int(NOW - 60),
        last_latency_ms=2.0, last_outcome="dead", delivered=0, gaps=0, last_gap="", resend=0, backlog=0,
        dead_letters=12)
    return replace(summary, **changes)


def test_a_callback_refusing_everything_for_longer_than_dormant_after_is_dormant() -> None:
    summary = refusing()
    assert summary.refusing_since() == int(NOW - 3 * DAY)
    assert summary.is_dormant(NOW, DAY)
    assert not summary.is_dormant(NOW, 4 * DAY)          # not long enough yet
    data = summary.to_json(NOW, DAY)
    assert data["dormant"] is True
    assert data["problem"] == "dormant: refused every delivery for 3 d · last HTTP 500"
    assert data["last_error_short"] == "HTTP 500"


def test_a_recent_success_a_pause_an_ended_lease_or_a_retry_that_worked_is_not_dormant() -> None:
    assert refusing(last_delivered_at=int(NOW - 3600)).refusing_since() == int(NOW - 3600)
    assert not refusing(last_delivered_at=int(NOW - 3600)).is_dormant(NOW, DAY)
    assert refusing(last_delivered_at=int(NOW - 2 * DAY)).is_dormant(NOW, DAY)
    assert not refusing(state="paused").is_dormant(NOW, DAY)
    assert not refusing(expires=int(NOW - 1)).is_dormant(NOW, DAY)
    assert not refusing(last_outcome="delivered", dead_letters=0).is_dormant(NOW, DAY)
    # delivered before the hub kept success times: when it began refusing is unknown, so not dormant
    assert refusing(delivered=40).refusing_since() is None and not refusing(delivered=40).is_dormant(NOW, DAY)
    assert "dormant" not in refusing().to_json(NOW)      # without a threshold the field is left out

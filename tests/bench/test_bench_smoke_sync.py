"""The benchmark's Destination scenario (sync: a baseline on disk and on tmpfs, its audits, live and
inbox steps) at its smallest size, each command it runs succeeding. One group of tests/bench/smoke.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import GROUPS, run_group


@pytest.mark.timeout(420)
def test_sync_runs_end_to_end_with_each_copy_audited(tmp_path: Path) -> None:
    smoke = run_group(tmp_path, GROUPS[3])
    for run in (r for r in smoke.runs if r["scenario"] == "sync"):   # each copy audited, plain and --deep, and timed
        assert run["audit_exit"] == run["audit_deep_exit"] == 0 and run["audit_s"] > 0 and run["audit_deep_s"] > 0, run
        assert run["audit_rss_mb"] > 0 and run["audit_deep_rss_mb"] > 0, run

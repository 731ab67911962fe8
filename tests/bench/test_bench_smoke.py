"""The benchmark harness end to end at its smallest size, so it can't rot; figures are not asserted.
Its scenarios run in four groups, one a file (tests/bench/smoke.py): this one measures the fan-out
against its ceiling, scale beside that ceiling, and the Source (rsnotify source's publishing)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.checks import check_deliveries
from bench.cli import SCENARIOS as BENCH_SCENARIOS

from tests.bench.smoke import GROUPS, REPORTS, run_group

# every name a smoke run reports (sync also reports sync-live and sync-inbox)
SCENARIOS = {"ceiling", "fanout", "latency", "ingest", "subscribe", "scale", "isolation", "failover", "source",
             "sync", "sync-live", "sync-inbox", "relay", "ingest-ceiling", "subscribe-ceiling"}


def test_the_groups_cover_every_scenario() -> None:
    assert sorted(name for group in GROUPS for name in group) == sorted(BENCH_SCENARIOS) == sorted(REPORTS)
    assert {scenario for reports in REPORTS.values() for scenario, _ in reports} == SCENARIOS


@pytest.mark.timeout(420)
def test_fanout_scale_and_source_run_end_to_end_with_all_deliveries_checked(tmp_path: Path) -> None:
    smoke = run_group(tmp_path, GROUPS[0])
    fanout = smoke.only("fanout")
    assert fanout["deliveries"] == fanout["subscribers"] * fanout["notifications"]
    assert fanout["ceiling_ratio"] > 0
    assert "| fan-out / ceiling |" in smoke.log
    assert smoke.ratio_rows() == ["fanout"]


def test_check_catches_missing_duplicate_and_reordered_deliveries() -> None:
    snapshot = {"paths": {"a": {"seq": [1, 3, 2, 3], "id": ["n1", "n3", "n2", "n3"], "t": [0, 0, 0, 0]},
                          "b": {"seq": [1], "id": ["n1"], "t": [0]},
                          "stray": {"seq": [1], "id": ["n1"], "t": [0]}}}
    check = check_deliveries(snapshot, {"a": [1, 2, 3], "b": [1, 2]})
    assert (check.missing, check.duplicates, check.out_of_order, check.unexpected) == (1, 1, 1, 1)
    assert not check.ok

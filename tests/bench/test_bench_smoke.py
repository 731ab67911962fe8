"""The benchmark harness end to end at its smallest size, so it can't rot; figures are not asserted."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.checks import check_deliveries

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = {"ceiling", "fanout", "latency", "ingest", "subscribe", "scale", "isolation", "failover", "source",
             "sync", "sync-live", "sync-inbox", "relay", "ingest-ceiling", "subscribe-ceiling"}


@pytest.mark.timeout(420)
def test_every_scenario_runs_end_to_end_with_all_deliveries_checked(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    done = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    runs = [line for line in lines if "scenario" in line]
    assert {r["scenario"] for r in runs} == SCENARIOS
    for run in runs:
        if "check" in run:       # hub scenarios: every delivery counted, no duplicates, in order
            assert run["check"]["ok"], run
        else:                    # Source/Destination scenarios: each command they ran succeeded
            exits = {k: v for k, v in run.items() if k.endswith("_exit")}
            assert all(v == 0 for v in exits.values()), run
            assert exits or run.get("complete") == run.get("notifications") or run.get("failures") == 0, run
    fanout = next(r for r in runs if r["scenario"] == "fanout")
    assert fanout["deliveries"] == fanout["subscribers"] * fanout["notifications"]
    assert fanout["ceiling_ratio"] > 0
    assert "| fan-out / ceiling |" in done.stdout
    assert lines[-1]["summary"][0].startswith("| target |")
    # every scenario with a ceiling is paired with one from the same invocation, and says its ratio
    for name, key in (("ingest", "ceiling_ratio"), ("subscribe", "ceiling_ratio"), ("latency", "p50_ratio"),
                      ("latency", "p99_ratio")):
        assert all(r[key] > 0 for r in runs if r["scenario"] == name), (name, key)
    ratios = lines[-1]["ratios"]
    assert [row.split(" | ")[0].strip("| ") for row in ratios[2:]] == ["fanout", "ingest", "subscribe", "latency",
                                                                         "latency"]
    assert done.stdout.rstrip().endswith(ratios[-1])


def test_check_catches_missing_duplicate_and_reordered_deliveries() -> None:
    snapshot = {"paths": {"a": {"seq": [1, 3, 2, 3], "id": ["n1", "n3", "n2", "n3"], "t": [0, 0, 0, 0]},
                          "b": {"seq": [1], "id": ["n1"], "t": [0]},
                          "stray": {"seq": [1], "id": ["n1"], "t": [0]}}}
    check = check_deliveries(snapshot, {"a": [1, 2, 3], "b": [1, 2]})
    assert (check.missing, check.duplicates, check.out_of_order, check.unexpected) == (1, 1, 1, 1)
    assert not check.ok

"""The benchmark harness end to end at its smallest size, so it can't rot; figures are not asserted."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.checks import check_deliveries
from bench.cli import SCENARIOS as BENCH_SCENARIOS

ROOT = Path(__file__).resolve().parents[2]
# Every scenario of `python -m bench` (bench/cli.py's SCENARIOS; sync also reports sync-live and
# sync-inbox), in three groups of about the same length run side by side: each run starts its own
# sinks and hubs on free ports, so the groups share nothing, and the test takes the longest
# group's time instead of the sum (about 55 s one after another on the 2-core machine).
GROUPS = (("ceiling", "fanout", "latency", "ingest", "subscribe", "scale"), ("isolation", "failover"),
          ("source", "sync"))
SCENARIOS = {"ceiling", "fanout", "latency", "ingest", "subscribe", "scale", "isolation", "failover", "source",
             "sync", "sync-live", "sync-inbox", "relay", "ingest-ceiling", "subscribe-ceiling"}


def test_the_groups_cover_every_scenario() -> None:
    assert sorted(name for group in GROUPS for name in group) == sorted(BENCH_SCENARIOS)


@pytest.mark.timeout(420)
def test_every_scenario_runs_end_to_end_with_all_deliveries_checked(tmp_path: Path) -> None:
    started = []
    for number, group in enumerate(GROUPS):
        out, log = tmp_path / f"results-{number}.jsonl", tmp_path / f"bench-{number}.log"
        with log.open("w") as output:
            process = subprocess.Popen([sys.executable, "-m", "bench", "--smoke", "--out", str(out), *group],
                                       cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        started.append((process, out, log))
    try:
        for process, _, _ in started:
            process.wait(400)
    finally:
        for process, _, _ in started:
            if process.poll() is None:
                process.kill()
                process.wait()
    runs = []
    for process, out, log in started:
        said = log.read_text(errors="replace")
        assert process.returncode == 0, said[-5000:]
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert lines[-1]["summary"][0].startswith("| target |"), said[-3000:]
        runs += [line for line in lines if "scenario" in line]
    # each once (--smoke: one run), the sync baseline once per medium (disk, tmpfs)
    assert sorted((r["scenario"], r.get("medium")) for r in runs) == sorted(
        [(name, None) for name in SCENARIOS - {"sync"}] + [("sync", "disk"), ("sync", "tmpfs")])
    for run in runs:
        assert "skipped" not in run, run     # a step that could not run is reported, not passed over
        if "check" in run:       # hub scenarios: every delivery counted, no duplicates, in order
            assert run["check"]["ok"], run
        else:                    # Source/Destination scenarios: each command they ran succeeded
            exits = {k: v for k, v in run.items() if k.endswith("_exit")}
            assert all(v == 0 for v in exits.values()), run
            assert exits or run.get("complete") == run.get("notifications") or run.get("failures") == 0, run
    for run in (r for r in runs if r["scenario"] == "sync"):   # each copy audited, plain and --deep, and timed
        assert run["audit_exit"] == run["audit_deep_exit"] == 0 and run["audit_s"] > 0 and run["audit_deep_s"] > 0, run
        assert run["audit_rss_mb"] > 0 and run["audit_deep_rss_mb"] > 0, run
    fanout = next(r for r in runs if r["scenario"] == "fanout")
    assert fanout["deliveries"] == fanout["subscribers"] * fanout["notifications"]
    assert fanout["ceiling_ratio"] > 0
    first_log = (tmp_path / "bench-0.log").read_text()          # the group with every ceiling
    assert "| fan-out / ceiling |" in first_log
    # every scenario with a ceiling is paired with one from the same invocation, and says its ratio
    for name, key in (("ingest", "ceiling_ratio"), ("subscribe", "ceiling_ratio"), ("latency", "p50_ratio"),
                      ("latency", "p99_ratio")):
        assert all(r[key] > 0 for r in runs if r["scenario"] == name), (name, key)
    first = [json.loads(line) for line in (tmp_path / "results-0.jsonl").read_text().splitlines()]
    ratios = first[-1]["ratios"]
    assert [row.split(" | ")[0].strip("| ") for row in ratios[2:]] == ["fanout", "ingest", "subscribe", "latency",
                                                                         "latency"]
    assert ratios[-1] in first_log


def test_check_catches_missing_duplicate_and_reordered_deliveries() -> None:
    snapshot = {"paths": {"a": {"seq": [1, 3, 2, 3], "id": ["n1", "n3", "n2", "n3"], "t": [0, 0, 0, 0]},
                          "b": {"seq": [1], "id": ["n1"], "t": [0]},
                          "stray": {"seq": [1], "id": ["n1"], "t": [0]}}}
    check = check_deliveries(snapshot, {"a": [1, 2, 3], "b": [1, 2]})
    assert (check.missing, check.duplicates, check.out_of_order, check.unexpected) == (1, 1, 1, 1)
    assert not check.ok

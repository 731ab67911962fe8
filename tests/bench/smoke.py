"""Runs `python -m bench --smoke` on a group of scenarios for the test_bench_smoke*.py files, one
group a file so that the xdist workers run the groups side by side (one after another they take
about 70 s on the 2-core machine, the longest group about 20 s), and checks what every run says."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# Every scenario of `python -m bench` (bench/cli.py's SCENARIOS) in four groups of about the same
# length (10-20 s each on a quiet 2-core machine), each started by its own file; a scenario that
# needs the fan-out's ceiling (scale) runs in the group that measures it.
GROUPS = (("ceiling", "fanout", "scale", "source"), ("latency", "ingest", "subscribe"), ("isolation", "failover"),
          ("sync",))
# What each scenario reports, (scenario, medium): one with a ceiling of its own reports that too, and
# sync reports its baseline on each medium (disk, tmpfs) and its live and inbox steps.
REPORTS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "ceiling": (("ceiling", None),), "fanout": (("fanout", None),), "scale": (("scale", None),),
    "latency": (("latency", None), ("relay", None)), "ingest": (("ingest", None), ("ingest-ceiling", None)),
    "subscribe": (("subscribe", None), ("subscribe-ceiling", None)), "isolation": (("isolation", None),),
    "failover": (("failover", None),), "source": (("source", None),),
    "sync": (("sync", "disk"), ("sync", "tmpfs"), ("sync-live", None), ("sync-inbox", None))}


@dataclass
class Smoke:
    """One group's run: the scenario lines of its JSON lines file, its summary line, its output."""

    runs: list[dict[str, Any]]
    summary: dict[str, Any]
    log: str

    def only(self, scenario: str) -> dict[str, Any]:
        [run] = [r for r in self.runs if r["scenario"] == scenario]
        return run

    def ratio_rows(self) -> list[str]:
        """The scenario named by each row of the ratios table (below its two header lines)."""
        return [row.split(" | ")[0].strip("| ") for row in self.summary["ratios"][2:]]


def run_group(tmp_path: Path, group: tuple[str, ...]) -> Smoke:
    """`python -m bench --smoke GROUP`, asserted to exit 0, each scenario once (each sync medium
    once), and every run checked (check_run)."""
    out, log = tmp_path / "results.jsonl", tmp_path / "bench.log"
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, "-m", "bench", "--smoke", "--out", str(out), *group],
                                   cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        process.wait(400)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    said = log.read_text(errors="replace")
    assert process.returncode == 0, said[-5000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[-1]["summary"][0].startswith("| target |"), said[-3000:]
    smoke = Smoke([line for line in lines if "scenario" in line], lines[-1], said)
    # each once (--smoke: one run), the sync baseline once per medium
    assert sorted((r["scenario"], r.get("medium")) for r in smoke.runs) == \
        sorted(report for name in group for report in REPORTS[name]), said[-3000:]
    for run in smoke.runs:
        check_run(run)
    assert all(row in said for row in smoke.summary["ratios"]), said[-3000:]     # the table is printed too
    return smoke


def check_run(run: dict[str, Any]) -> None:
    assert "skipped" not in run, run     # a step that could not run is reported, not passed over
    if "check" in run:       # hub scenarios: every delivery counted, no duplicates, in order
        assert run["check"]["ok"], run
    else:                    # Source/Destination scenarios: each command they ran succeeded
        exits = {k: v for k, v in run.items() if k.endswith("_exit")}
        assert all(v == 0 for v in exits.values()), run
        assert exits or run.get("complete") == run.get("notifications") or run.get("failures") == 0, run

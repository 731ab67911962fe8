"""The benchmark's isolation (an unrelated topic beside black holes and hanging subscribers) and
failover (a worker SIGKILLed mid-stream) scenarios at their smallest size, every delivery checked.
One group of tests/bench/smoke.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import GROUPS, run_group


@pytest.mark.timeout(420)
def test_isolation_and_failover_run_end_to_end_with_all_deliveries_checked(tmp_path: Path) -> None:
    smoke = run_group(tmp_path, GROUPS[2])
    assert smoke.only("isolation")["check"]["received"] > 0
    assert smoke.only("failover")["check"]["received"] > 0

"""The benchmark's scenarios that measure a ceiling of their own in the same invocation (latency
beside a plain relay, ingest and subscribe beside plain aiohttp programs), at the smallest size;
each says its ratio. One group of tests/bench/smoke.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import GROUPS, run_group


@pytest.mark.timeout(420)
def test_latency_ingest_and_subscribe_run_end_to_end_each_paired_with_its_ceiling(tmp_path: Path) -> None:
    smoke = run_group(tmp_path, GROUPS[1])
    for name, key in (("ingest", "ceiling_ratio"), ("subscribe", "ceiling_ratio"), ("latency", "p50_ratio"),
                      ("latency", "p99_ratio")):
        assert smoke.only(name)[key] > 0, (name, key)
    assert smoke.ratio_rows() == ["ingest", "subscribe", "latency", "latency"]

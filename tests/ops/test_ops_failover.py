"""The hub outlives its Redis primary, proven with real processes on loopback (tests/ops/failover.py):
the primary gets SIGKILL after 100 of 300 notifications and comes back after 200, as a replica.
Every notification answered 200 reaches every subscriber, in order, none missing; deliveries resume
soon after Sentinel's down-after time; no process exits. The same over TLS: test_ops_failover_tls.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.waiting import LONG_TEST_TIMEOUT

from .failover import run_failover

pytestmark = pytest.mark.timeout(LONG_TEST_TIMEOUT)     # the TLS run's, with the old primary's return


def test_primary_killed_mid_stream_then_back_as_replica_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    # one run for both (a Sentinel group takes seconds to settle): the kill after 100, the old
    # primary back after 200, and the last 100 published while it rejoins as a replica
    run_failover(tmp_path, old_primary_returns=True)

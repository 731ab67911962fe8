"""`rsnotify hub` refuses delays and timeouts that are not finite positive numbers (nan passed
every "<= 0" check, inf never ends a wait, and --retry-base had no check at all): one line,
exit 2, nothing started or created."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import cli
from tests.support.ports import free_port


@pytest.mark.parametrize(("args", "message"), [
    (["--retry-base", "nan"], "--retry-base must be a finite number, got nan"),
    (["--retry-cap", "inf"], "--retry-cap must be a finite number, got inf"),
    (["--retry-base", "0"], "--retry-base must be a positive number, got 0.0"),
    (["--fetch-timeout", "-1"], "--fetch-timeout must be a positive number, got -1.0"),
    (["--header-timeout", "nan"], "--header-timeout must be a finite number, got nan"),
    # far past any clock drift, and past the last datetime there is: every publish failed with 500
    (["--future-skew", "1e12"], "--future-skew must be 0-3155760000 seconds (100 years), got 1000000000000.0"),
])
def test_a_delay_that_is_not_a_finite_positive_number_is_refused(tmp_path: Path, args, message) -> None:
    data = tmp_path / "data"
    result = cli.run("hub", "--port", str(free_port()), "--data-dir", str(data), *args, timeout=30)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not data.exists()

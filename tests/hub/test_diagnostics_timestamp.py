"""GET /diagnostics/{sid} with an X-RSNotify-Timestamp that is not plain epoch seconds (400
digits, Arabic-Indic digits, underscores) is a 401 naming the header, never a 500."""
from __future__ import annotations

import pytest

from tests.support.http import fetch

SID = "0123456789abcdef0123456789abcdef"


# the Arabic-Indic digits go out as their UTF-8 bytes (http.client sends headers as Latin-1)
@pytest.mark.parametrize("timestamp", ["9" * 400, "١٢٣٤٥".encode().decode("latin-1"), "1_700_000_000", "-5", "12.5"])
def test_a_timestamp_that_is_not_epoch_seconds_is_401(hub_process, timestamp) -> None:
    hub = hub_process()
    answer = fetch(f"{hub.url}diagnostics/{SID}", headers={"X-RSNotify-Timestamp": timestamp,
                                                           "X-Hub-Signature": "sha256=00"})
    assert answer.status == 401, answer.text
    assert "X-RSNotify-Timestamp must be epoch seconds" in answer.text, answer.text
    assert "Traceback" not in hub.output()

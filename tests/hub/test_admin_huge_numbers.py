"""Admin query numbers of thousands of digits (int() refuses past 4,300 with a ValueError) are a
400 that quotes the value cut short, never a 500."""
from __future__ import annotations

import pytest

from tests.support.http import fetch


@pytest.mark.parametrize(("path", "message"), [
    ("admin/history?minutes=", "minutes must be an integer 1-"),
    ("admin/subscriptions?limit=", "limit must be an integer 1-"),
    ("admin/subscriptions?offset=", "offset must be an integer 0 or more"),
])
def test_a_number_of_5000_digits_is_400(hub_process, path, message) -> None:
    hub = hub_process()
    answer = fetch(hub.url + path + "9" * 5000)
    assert answer.status == 400, answer.text
    assert message in answer.text and "(5000 characters)" in answer.text and len(answer.text) < 300, answer.text
    assert "Traceback" not in hub.output()

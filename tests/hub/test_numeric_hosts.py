"""A callback or topic whose host is a number that is not a dotted-decimal IPv4 address
("2852039166", "0251.0376.0251.0376", "0xa9fea9fe": 169.254.169.254 as clients read them) is
refused with a 400 naming the rule, before anything is stored or queued; the same address in
dotted decimal meets the outbound-address guard as it always did."""
from __future__ import annotations

import pytest

from tests.support.http import get_json, post_form

TOPIC = "http://data.example.org/ds1/changes"
SPELLINGS = ["http://2852039166/cb", "http://0251.0376.0251.0376/cb", "http://0xa9fea9fe/cb",
             "http://169.254.169.254./cb", "http://127.1/cb"]


@pytest.fixture
def hub(hub_process):
    return hub_process()


@pytest.mark.parametrize("callback", SPELLINGS)
def test_a_numeric_callback_host_that_is_not_dotted_decimal_is_400(hub, callback) -> None:
    status, body = post_form(hub.url, {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": callback})
    assert status == 400, body
    assert b"numeric host that is not an IPv4 address in dotted decimal" in body
    assert "verification queued" not in hub.output()
    assert get_json(hub.url + "admin/subscriptions")[1]["total"] == 0


def test_a_numeric_topic_host_is_400_too_and_dotted_decimal_meets_the_guard(hub) -> None:
    status, body = post_form(hub.url, {"hub.mode": "subscribe", "hub.topic": "http://2852039166/changes",
                                       "hub.callback": "http://127.0.0.1:9/cb"})
    assert status == 400 and b"hub.topic has a numeric host" in body, body
    status, body = post_form(hub.url, {"hub.mode": "subscribe", "hub.topic": TOPIC,
                                       "hub.callback": "http://169.254.169.254/cb"})
    assert status == 400 and b"not a public address" in body, body

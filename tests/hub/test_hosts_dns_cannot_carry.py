"""A topic or callback whose host DNS cannot carry (a label over 63 characters, an empty label,
over 253 characters in all) or whose port is 0 is refused at intake with a 400 naming the
problem, and nothing is queued. Before, the subscribe was accepted and its verification task
died in the worker on the resolver's UnicodeError, leaving the request held by that worker for
good (/health's verification lane "behind" until the worker stopped). A real hub process."""
from __future__ import annotations

import urllib.parse

import pytest
from yarl import URL

from rsnotify.hub.settings import HubSettings
from rsnotify.outbound import Limits
from tests.support.http import get_json
from tests.support.http import http as http_request
from tests.support.waiting import wait_until

from .conftest import outbound_client

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
TOPIC = "http://data.example.org/ds1/changes"
BAD_HOSTS = [
    "a" * 64 + ".example",                 # a label of 64 characters
    "a..example",                          # an empty label
    ".example",                            # an empty first label
    ".".join(["a" * 60] * 5),              # 304 characters in all
]


def post(url: str, pairs: list[tuple[str, str]]) -> tuple[int, str]:
    status, body = http_request("POST", url, urllib.parse.urlencode(pairs).encode(), FORM, 10.0)
    return status, body.decode()


@pytest.mark.parametrize("host", BAD_HOSTS)
def test_a_host_name_dns_cannot_carry_is_400_everywhere_and_nothing_is_queued(hub_process, host) -> None:
    hub = hub_process()
    bad = f"http://{host}/callback"
    answers = {
        "subscribe callback": post(hub.url, [("hub.mode", "subscribe"), ("hub.topic", TOPIC), ("hub.callback", bad)]),
        "subscribe topic": post(hub.url, [("hub.mode", "subscribe"), ("hub.topic", bad),
                                          ("hub.callback", "http://127.0.0.1:9/cb")]),
        "thin ping": post(hub.url, [("hub.mode", "publish"), ("hub.url", bad)]),
        "diagnostics": post(hub.url + "diagnostics", [("hub.topic", TOPIC), ("hub.callback", bad)]),
    }
    for what, (status, text) in answers.items():
        assert status == 400, (what, status, text)
        assert "has an invalid host name (labels of 1-63 characters, 253 in all)" in text, (what, text)
    output = hub.output()
    assert "verification queued" not in output and "fetch queued" not in output
    assert "Traceback" not in output


def test_a_callback_on_port_0_is_400(hub_process) -> None:
    hub = hub_process()
    status, text = post(hub.url, [("hub.mode", "subscribe"), ("hub.topic", TOPIC),
                                  ("hub.callback", "http://127.0.0.1:0/cb")])
    assert status == 400 and "hub.callback has an invalid port" in text, text
    assert "verification queued" not in hub.output()


def test_a_trailing_dot_and_63_character_labels_are_still_accepted_and_verified(hub_process) -> None:
    hub = hub_process()
    host = "b" * 63 + ".invalid."          # a valid name that resolves nowhere: the verification fails quietly
    status, text = post(hub.url, [("hub.mode", "subscribe"), ("hub.topic", TOPIC),
                                  ("hub.callback", f"http://{host}/cb")])
    assert status == 202, text
    hub.wait_for_output(r"subscribe of http://b+\.invalid\./… for .* not verified")

    def lane_empty() -> bool:
        status, health = get_json(hub.url + "health")
        return status == 200 and health["lanes"]["verification"]["waiting"] == 0 and health["verifications_pending"] == 0
    wait_until(lane_empty, 30.0, "the verification lane to empty")
    assert "Traceback" not in hub.output()


async def test_the_hubs_client_answers_an_unresolvable_name_with_an_error_not_an_exception(redis_url, tmp_path) -> None:
    client = outbound_client(HubSettings(redis_url=redis_url, data_dir=str(tmp_path)))
    try:
        answer = await client.request("GET", URL(f"http://{'a' * 64}.example/cb"), {}, b"",
                                      Limits(connect_timeout=2.0, total_timeout=5.0, max_body=100))
    finally:
        await client.close()
    assert answer.status is None
    assert answer.error.startswith(f"host name not found: {'a' * 64}.example"), answer.error

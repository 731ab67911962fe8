"""`rsnotify publish` and `rsnotify capability-list add-channel`, through click's CliRunner and
as a real subprocess, against a loopback fake hub."""
from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from rsnotify.publisher.client import utc_now
from rsnotify.xml import parse_capability_list, parse_notification
from tests.support import cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOPIC = "https://example.org/dataset1/change/"


@pytest.fixture
def run(tmp_path):  # type: ignore[no-untyped-def]
    """Invoke `rsnotify ARGS` with a private state file and no stray RSNOTIFY_* settings."""
    env = {"RSNOTIFY_PUBLISH_STATE": str(tmp_path / "state.json"), "RSNOTIFY_HUB_URL": None,
           "RSNOTIFY_TOPIC_URL": None, "RSNOTIFY_HUB_TOKEN": None, "RSNOTIFY_PUBLISH_RETRY_DELAY": "0.01"}

    def invoke(*args: str, input: bytes | str | None = None, **extra_env: str):  # type: ignore[no-untyped-def]
        return cli.invoke(*args, input=input, env={**env, **extra_env}, catch_exceptions=False)

    return invoke


def test_publish_prints_the_id_of_each_accepted_notification(run, threaded_hub):
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--token", "t0k",
                 "--updated", "https://example.org/a")
    assert result.exit_code == 0, result.output
    [line] = result.stdout.splitlines()
    assert line.startswith(f"00001-0 accepted by {threaded_hub.url} (1 change, ")
    [got] = threaded_hub.received
    assert got.headers["Authorization"] == "Bearer t0k"
    [change] = parse_notification(got.body).changes
    assert (change.loc, change.change.value) == ("https://example.org/a", "updated")


def test_publish_keeps_the_command_line_order_and_the_given_datetimes(run, threaded_hub):
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC,
                 "--created", "https://example.org/x", "--deleted", "https://example.org/x",
                 "--updated=https://example.org/old@2020-01-01T00:00:00Z", "--capability-list",
                 "https://example.org/dataset1/capabilitylist.xml")
    assert result.exit_code == 0, result.output
    notification = parse_notification(threaded_hub.received[0].body)
    assert [(c.loc, c.change.value) for c in notification.changes] == [
        ("https://example.org/old", "updated"), ("https://example.org/x", "created"), ("https://example.org/x", "deleted")]
    assert notification.from_time.isoformat() == "2020-01-01T00:00:00+00:00"
    assert notification.up == "https://example.org/dataset1/capabilitylist.xml"


def test_consecutive_cli_publishes_chain_through_the_state_file(run, threaded_hub):
    for uri in ("https://example.org/a", "https://example.org/b"):
        assert run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--updated", uri).exit_code == 0
    first, second = (parse_notification(s.body) for s in threaded_hub.received)
    assert second.from_time == first.until_time


def test_publish_a_notification_file_sends_it_as_is(run, threaded_hub):
    example = FIXTURES / "change-notification-1.0.1" / "notification_ex_1.xml"
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--file", str(example))
    assert result.exit_code == 0, result.output
    assert "(2 changes, 2013-01-03T00:00:00Z to 2013-01-03T00:10:00Z)" in result.stdout
    assert threaded_hub.received[0].body == example.read_bytes()


def test_publish_json_lines_from_standard_input(run, threaded_hub):
    lines = "\n".join(json.dumps(item) for item in [
        {"loc": "https://example.org/b", "change": "updated", "datetime": "2024-05-01T10:02:00Z",
         "hash": "md5:1e0d5cb8ef6ba40c99b14c0237be735e", "length": 14599, "type": "text/html"},
        {"loc": "https://example.org/a", "change": "created", "datetime": "2024-05-01T10:01:00Z"},
    ]) + "\n\n"
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--file", "-", input=lines)
    assert result.exit_code == 0, result.output
    changes = parse_notification(threaded_hub.received[0].body).changes
    assert [c.loc for c in changes] == ["https://example.org/a", "https://example.org/b"]
    assert (changes[1].hash, changes[1].length, changes[1].media_type) == (
        "md5:1e0d5cb8ef6ba40c99b14c0237be735e", 14599, "text/html")


def test_a_hub_refusal_exits_1_with_the_hub_reason_on_stderr(run, threaded_hub):
    threaded_hub.answers = [403]
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--updated", "https://example.org/a")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "refused the notification with 403: publisher token not allowed for this topic" in result.stderr


def test_an_unreachable_hub_exits_1_after_the_retries(run, unused_port):
    result = run("publish", "--hub", f"http://127.0.0.1:{unused_port}/", "--topic", TOPIC,
                 "--attempts", "2", "--updated", "https://example.org/a")
    assert result.exit_code == 1
    assert "could not be reached after 2 attempts" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    ((), "nothing to publish"),
    (("--updated", "https://example.org/a@2024-13-45T00:00:00Z"), "not a valid W3C datetime"),
    # an @ past the host is URI@DATETIME gone wrong, never silently part of the loc
    (("--updated", "https://example.org/a@yesterday-ish"), "'yesterday-ish' after the last @ is not a W3C datetime"),
    (("--updated", "https://example.org/a%40b@soon"), "'soon' after the last @ is not a W3C datetime"),
])
def test_usage_errors_exit_2_with_a_message(run, threaded_hub, args, message):
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, *args, input="{oops\n")
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert threaded_hub.received == []


@pytest.mark.parametrize(("args", "message"), [
    (("--file", "-"), "--file -:1: not JSON"),
    (("--file", str(FIXTURES / "core-1.1" / "resourcesync_ex_13.xml")), "not a change notification"),
])
def test_data_errors_exit_1_naming_the_file_without_the_usage_banner(run, threaded_hub, args, message):
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, *args, input="{oops\n")
    assert result.exit_code == 1, result.output
    assert message in result.stderr and "Usage:" not in result.stderr
    assert threaded_hub.received == []


def test_a_change_dated_before_the_chain_names_the_state_file(run, threaded_hub, tmp_path):
    assert run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--updated", "https://example.org/a").exit_code == 0
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC,
                 "--updated", "https://example.org/b@2020-01-01T00:00:00Z")
    assert result.exit_code == 1, result.output
    assert "before the end of" in result.stderr and str(tmp_path / "state.json") in result.stderr
    assert "Usage:" not in result.stderr and len(threaded_hub.received) == 1


def test_a_change_dated_in_the_future_exits_1_in_one_line_and_records_nothing(run, threaded_hub):
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC,
                 "--updated", "https://example.org/a@2099-01-01T00:00:00Z")
    assert result.exit_code == 1, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: <rs:md> for https://example.org/a has datetime=2099-01-01T00:00:00Z in the future")
    assert threaded_hub.received == []
    # nothing was recorded: the next publish, dated now, still chains
    assert run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--updated", "https://example.org/b").exit_code == 0
    # ... and --future-skew (RSNOTIFY_FUTURE_SKEW) widens the bound for a Source whose clock is known to be fast
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--future-skew", "3600",
                 "--updated", f"https://example.org/c@{(utc_now() + timedelta(minutes=30)).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    assert result.exit_code == 0, result.output
    assert len(threaded_hub.received) == 2
    # a skew reaching past the year 9999 is no bound at all (it was an OverflowError traceback)
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--future-skew", "1e12",
                 "--updated", "https://example.org/d@2099-01-01T00:00:00Z")
    assert result.exit_code == 0 and "Traceback" not in result.stderr, result.output
    assert len(threaded_hub.received) == 3


def test_a_bad_hub_url_or_missing_topic_exits_2(run):
    assert run("publish", "--hub", "hub.example.org", "--topic", TOPIC, "--updated", "https://e/a").exit_code == 2
    result = run("publish", "--hub", "http://127.0.0.1:9/", "--updated", "https://e/a")
    assert result.exit_code == 2 and "--topic" in result.stderr


def test_an_xml_file_cannot_be_mixed_with_change_options(run, threaded_hub):
    example = FIXTURES / "change-notification-1.0.1" / "notification_ex_1.xml"
    result = run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--file", str(example),
                 "--updated", "https://example.org/a")
    assert result.exit_code == 2 and "sent as is" in result.stderr


def test_publish_as_a_subprocess(threaded_hub, tmp_path):
    done = cli.run("publish", "--hub", threaded_hub.url, "--topic", TOPIC, "--deleted", "https://example.org/gone",
                   "--state", str(tmp_path / "state.json"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("00001-0 accepted by ")
    assert parse_notification(threaded_hub.received[0].body).changes[0].loc == "https://example.org/gone"


# -- capability-list add-channel ---------------------------------------------------------------

HUB = "http://hub.example.org/websub/"
CHANNEL_TOPIC = "http://example.com/dataset1/change/"


def test_add_channel_edits_the_file_in_place(run, tmp_path):
    caplist = tmp_path / "capabilitylist.xml"
    caplist.write_bytes((FIXTURES / "core-1.1" / "resourcesync_ex_13.xml").read_bytes())
    result = run("capability-list", "add-channel", str(caplist), "--topic", CHANNEL_TOPIC, "--hub", HUB)
    assert result.exit_code == 0, result.output
    expected = parse_capability_list((FIXTURES / "change-notification-1.0.1" / "notification_ex_7.xml").read_bytes())
    assert parse_capability_list(caplist.read_bytes()).entries == expected.entries


def test_add_channel_to_stdout_and_from_stdin(run, tmp_path):
    original = (FIXTURES / "core-1.1" / "resourcesync_ex_13.xml").read_bytes()
    caplist = tmp_path / "capabilitylist.xml"
    caplist.write_bytes(original)
    printed = run("capability-list", "add-channel", str(caplist), "--topic", CHANNEL_TOPIC, "--hub", HUB, "--stdout")
    piped = run("capability-list", "add-channel", "-", "--topic", CHANNEL_TOPIC, "--hub", HUB, input=original)
    assert printed.exit_code == piped.exit_code == 0
    assert caplist.read_bytes() == original  # --stdout leaves the file alone
    assert printed.stdout_bytes == piped.stdout_bytes
    assert parse_capability_list(printed.stdout_bytes).change_notification_channels()[0].hubs == (HUB,)


def test_add_channel_creates_a_missing_file_only_with_up(run, tmp_path):
    caplist = tmp_path / "new.xml"
    refused = run("capability-list", "add-channel", str(caplist), "--topic", CHANNEL_TOPIC, "--hub", HUB)
    assert refused.exit_code == 2 and "--up" in refused.stderr
    created = run("capability-list", "add-channel", str(caplist), "--topic", CHANNEL_TOPIC, "--hub", HUB,
                  "--up", "http://example.com/.well-known/resourcesync")
    assert created.exit_code == 0, created.output
    assert parse_capability_list(caplist.read_bytes()).up == "http://example.com/.well-known/resourcesync"


def test_add_channel_refuses_an_invalid_capability_list_and_leaves_it_alone(run, tmp_path):
    caplist = tmp_path / "capabilitylist.xml"
    caplist.write_bytes(b"<urlset/>")
    result = run("capability-list", "add-channel", str(caplist), "--topic", CHANNEL_TOPIC, "--hub", HUB)
    assert result.exit_code == 2 and "not a Capability List" in result.stderr
    assert caplist.read_bytes() == b"<urlset/>"


def test_publish_to_an_idn_topic_sends_its_idna_form(run, threaded_hub):
    result = run("publish", "--hub", threaded_hub.url, "--topic", "https://bücher.example/dataset1/change/",
                 "--updated", "https://bücher.example/a")
    assert result.exit_code == 0, result.output
    [got] = threaded_hub.received
    assert "<https://xn--bcher-kva.example/dataset1/change/>; rel=\"self\"" in got.headers["Link"]


def test_publish_refuses_a_malformed_idn_topic_in_one_line(run, threaded_hub):
    result = run("publish", "--hub", threaded_hub.url, "--topic", "https://😀.example/change/",
                 "--updated", "https://example.org/a")
    assert result.exit_code == 2     # a bad parameter, as click reports every other one
    [error] = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert "topic URL has an invalid internationalized host name '😀.example'" in error
    assert "Traceback" not in result.output
    assert threaded_hub.received == []

"""`rsnotify admin` against a real hub on loopback (real Redis, real worker context, a real
subscriber that fails and then recovers): what an operator reads and what each action does."""
from __future__ import annotations

import asyncio
import json

from click.testing import Result

from rsnotify.hub.settings import HubSettings
from tests.support import cli
from tests.support.ports import free_port

from .conftest import body, start_hub

TOKEN = "op-token-123"


async def rsnotify_admin(hub_url: str, *args: str, token: str | None = None) -> Result:
    """`rsnotify admin ARGS` as a user runs it (its own event loop, so in a thread beside the hub's)."""
    env = {"RSNOTIFY_HUB_URL": hub_url, "RSNOTIFY_ADMIN_TOKEN": token or ""}
    return await asyncio.to_thread(cli.invoke, "admin", *args, env=env)


def ok(result: Result) -> str:
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.output}"
    return result.output


def refused(result: Result, *expected: str) -> str:
    """A one-line refusal: exit 1, no usage banner, no traceback, every `expected` phrase said."""
    assert result.exit_code == 1, f"exit {result.exit_code}: {result.output}"
    assert "Usage:" not in result.output and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    for phrase in expected:
        assert phrase in result.output, result.output
    return result.output


async def failing_and_healthy(hub, subscriber) -> tuple[str, str]:
    """/good answers 200, /bad 500: after three publishes /bad holds three dead letters."""
    good = await hub.subscribe(subscriber.url("/good"))
    subscriber.on("/bad", 500)
    bad = await hub.subscribe(subscriber.url("/bad"))
    for n in range(3):
        await hub.publish(body(n))
    await hub.drain()
    await hub.counted("outcome:dead", 3, timeout=30)    # workers flush their counters in batches
    return good, bad


async def test_overview_and_trouble_tell_what_is_wrong(ops_hub, subscriber) -> None:
    good, bad = await failing_and_healthy(ops_hub, subscriber)
    text = ok(await rsnotify_admin(ops_hub.url, "overview"))
    assert "subscriptions     2 (active 2 · expired 0 · paused 0)" in text
    assert "3 in all" in text and "3 dead letter(s)" in text
    assert "1 subscription(s) need a look" in text and bad in text and good not in text
    assert subscriber.url("/bad") in text and "UTC" in text

    as_json = json.loads(ok(await rsnotify_admin(ops_hub.url, "--json", "overview")))
    assert as_json["trouble_count"] == 1 and as_json["dead_letters"] == 3

    lines = ok(await rsnotify_admin(ops_hub.url, "subscriptions", "--trouble")).splitlines()
    assert lines[0].split()[:3] == ["SUBSCRIPTION", "ID", "STATE"]
    [row] = lines[1:]
    assert row.startswith(bad) and row.endswith("3 dead letters · last HTTP 500")
    searched = ok(await rsnotify_admin(ops_hub.url, "subscriptions", "--search", "/BAD")).splitlines()
    assert len(searched) == 2 and searched[1].startswith(bad)

    everything = ok(await rsnotify_admin(ops_hub.url, "subscriptions"))
    assert good in everything and bad in everything
    topics = ok(await rsnotify_admin(ops_hub.url, "topics"))
    assert "http://source.example.org/changes/rs" in topics and " 3 " in topics.splitlines()[1]


async def test_dead_letters_resent_reach_the_recovered_subscriber(ops_hub, subscriber) -> None:
    _, bad = await failing_and_healthy(ops_hub, subscriber)
    listed = ok(await rsnotify_admin(ops_hub.url, "dead-letters", "list", bad)).splitlines()
    assert len(listed) == 1 + 3 and all("500" in line for line in listed[1:])
    first_nid = listed[1].split()[0]

    subscriber.on("/bad", 200)                      # the subscriber is fixed
    assert ok(await rsnotify_admin(ops_hub.url, "dead-letters", "resend", bad, first_nid)).strip() == \
        f"{bad}: dead letter {first_nid} queued for re-sending"
    assert ok(await rsnotify_admin(ops_hub.url, "dead-letters", "resend", bad)).strip() == \
        f"{bad}: 2 dead letter(s) queued for re-sending"
    await ops_hub.drain()
    received = subscriber.bodies("/bad")[-3:]
    assert received == [body(0), body(1), body(2)]         # in order, after the three failed tries each
    assert ok(await rsnotify_admin(ops_hub.url, "dead-letters", "list", bad)).strip() == "no dead letters"


async def test_pause_resume_and_retry(ops_hub, subscriber) -> None:
    good = await ops_hub.subscribe(subscriber.url("/good"))
    assert ok(await rsnotify_admin(ops_hub.url, "pause", good)).strip() == f"{good}: paused"
    await ops_hub.publish(body(1))
    await ops_hub.drain()
    assert subscriber.bodies("/good") == []
    detail = ok(await rsnotify_admin(ops_hub.url, "subscription", good))
    assert "paused by an operator" in detail and "backlog       1" in detail
    refused(await rsnotify_admin(ops_hub.url, "retry", good), f"subscription {good} is paused",
            f"rsnotify admin resume {good}")

    assert ok(await rsnotify_admin(ops_hub.url, "resume", good)).strip() == f"{good}: active"
    await ops_hub.drain()
    assert subscriber.bodies("/good") == [body(1)]
    assert ok(await rsnotify_admin(ops_hub.url, "retry", good)).strip() == f"{good}: next delivery attempt now"


async def test_token_from_the_environment(aiohttp_server, ops_settings: HubSettings, ops_clock) -> None:
    settings = ops_settings.with_values(admin_token=TOKEN)
    async for hub in start_hub(aiohttp_server, settings, ops_clock):
        refused(await rsnotify_admin(hub.url, "overview"), "answered 401", "RSNOTIFY_ADMIN_TOKEN")
        refused(await rsnotify_admin(hub.url, "overview", token="wrong"), "not this hub's admin token")
        assert "topics" in ok(await rsnotify_admin(hub.url, "overview", token=TOKEN))
        refused(await rsnotify_admin(hub.url, "subscription", "a" * 32, token=TOKEN), "answered 404",
                f"no subscription {'a' * 32}")


async def test_unreachable_hub_and_bad_ids_are_one_line_errors() -> None:
    refused(await rsnotify_admin(f"http://127.0.0.1:{free_port()}/", "overview"), "cannot reach the hub",
            "RSNOTIFY_HUB_URL")
    bad_url = await rsnotify_admin("ftp://hub.example.org/", "overview")
    assert bad_url.exit_code == 2 and "starts with http:// or https://" in bad_url.output
    bad_id = await rsnotify_admin("http://127.0.0.1:1/", "pause", "not-an-id")
    assert bad_id.exit_code == 2 and "32 lower-case hex digits" in bad_id.output


def test_overview_lists_the_workers() -> None:
    from rsnotify.admin_cli import render_overview

    text = render_overview({"hub_url": "http://127.0.0.1:8080/", "now": 1_800_000_000, "workers": [
        {"name": "w1", "host": "node-a", "pid": 42, "last_seen": 1_800_000_000, "claims": 3, "slots": 200,
         "following": 1}]})
    header, row = text.split("\n\n")[1].splitlines()[:2]
    assert header.split() == ["WORKER", "HOST", "PID", "LAST", "SEEN", "CLAIMS", "SLOTS", "FOLLOWING"]
    assert row.split() == ["w1", "node-a", "42", "2027-01-15", "08:00:00", "UTC", "3", "200", "1"]
    assert text.endswith("no subscription needs a look")

"""What a command's start costs: `rsnotify --help`, a command's --help and a usage error load only
what they use (no aiohttp, no lxml, no Redis client), and the command list `rsnotify --help`
prints from rsnotify.cli.SUMMARIES is the one the commands themselves would print."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from rsnotify.cli import LAZY_COMMANDS, SUMMARIES, main

# Modules a command loads only when it runs: the HTTP stack, the XML parser, the hub's Redis side,
# and the roles' heavy parts (callback core, clients).
HEAVY = ("aiohttp", "aiohttp.web", "lxml.etree", "yarl", "redis", "rq", "watchfiles",
         "rsnotify.subscriber.callback.core", "rsnotify.subscriber.client", "rsnotify.publisher.client",
         "rsnotify.hub.web.app")

# argv, then the exit code click gives it
LIGHT_STARTS = [
    (["--help"], 0),
    (["sync", "--help"], 0),
    (["sync", "status", "--help"], 0),
    (["audit", "--help"], 0),
    (["subscribe", "--help"], 0),
    (["publish", "--help"], 0),
    (["capability-list", "--help"], 0),
    (["capability-list", "set", "--help"], 0),
    (["hub", "--help"], 0),
    (["worker", "--help"], 0),
    (["source", "--help"], 0),
    (["validate", "--help"], 0),
    (["inspect", "--help"], 0),
    (["admin", "--help"], 0),
    (["admin", "topics", "--help"], 0),
    (["sync"], 2),                                  # usage error: --dir is missing
    (["subscribe", "--hub", "http://hub.example/"], 2),
    (["publish", "--hub", "not a url"], 2),
    (["inspect", "ftp://example.org/"], 2),
    (["no-such-command"], 2),
]

# Runs `rsnotify ARGV` in a fresh interpreter and prints, as JSON, the exit code and which of
# HEAVY it had imported by then.
PROBE = """
import json, sys
from rsnotify.cli import main
heavy = json.loads(sys.argv[1])
try:
    main(sys.argv[2:], prog_name="rsnotify")
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "loaded": [name for name in heavy if name in sys.modules]}), file=sys.__stderr__)
"""


def loaded_by(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY), *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"}, check=False)
    return json.loads(done.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize(("args", "code"), LIGHT_STARTS, ids=[" ".join(args) for args, _ in LIGHT_STARTS])
def test_help_and_usage_errors_load_no_http_xml_or_redis_stack(args: list[str], code: int) -> None:
    assert loaded_by(*args) == {"code": code, "loaded": []}


def test_importing_the_subscriber_package_loads_none_of_its_modules() -> None:
    code = ("import sys, rsnotify.subscriber, rsnotify.publisher; print(sorted(m for m in sys.modules if "
            "m.startswith(('rsnotify.subscriber.', 'rsnotify.publisher.', 'aiohttp', 'lxml'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_validating_a_local_file_loads_no_http_client() -> None:
    example = Path(__file__).resolve().parents[1] / "fixtures" / "change-notification-1.0.1" / "notification_ex_1.xml"
    result = loaded_by("validate", str(example))
    assert result["code"] == 0
    assert "lxml.etree" in result["loaded"] and "aiohttp" not in result["loaded"]


def test_a_sync_without_push_loads_no_callback_server() -> None:
    """`rsnotify sync --once` and `rsnotify audit` run the engine without a callback server: what
    they import leaves out aiohttp.web, the callback core and the subscriber client."""
    code = ("import sys, rsnotify.subscriber.cli, rsnotify.subscriber.sync.runner; print(sorted(m for m in "
            "('aiohttp.web', 'rsnotify.subscriber.callback.core', 'rsnotify.subscriber.client', "
            "'rsnotify.subscriber.sync.push') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_the_subscriber_package_still_offers_every_public_name() -> None:
    import rsnotify.subscriber as package
    from rsnotify.subscriber import Subscriber, SubscriberSettings
    from rsnotify.subscriber.client import Subscriber as defined
    assert Subscriber is defined and SubscriberSettings.__module__ == "rsnotify.subscriber.settings"
    exported = {name: getattr(package, name) for name in package.__all__}   # each one loads
    assert exported["discover"].__module__ == "rsnotify.subscriber.discovery"
    assert issubclass(exported["SubscriptionDeniedError"], exported["SubscriberError"])
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        package.Nothing  # noqa: B018


def test_every_lazy_command_has_a_summary_equal_to_its_own_help() -> None:
    assert set(SUMMARIES) == set(LAZY_COMMANDS)
    ctx = click.Context(main)
    for name, summary in SUMMARIES.items():
        command = main.get_command(ctx, name)
        assert command is not None and not command.hidden
        stand_in = click.Command(name, help=summary)
        for limit in (10, 30, 45, 60, 80, 120, 400):
            assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit), (name, limit)


@pytest.mark.parametrize("width", [40, 80, 200])
def test_the_command_list_is_the_one_click_prints_from_the_commands(width: int) -> None:
    ctx = click.Context(main, terminal_width=width)
    listed, stock = click.HelpFormatter(width=width), click.HelpFormatter(width=width)
    main.format_commands(ctx, listed)
    click.Group.format_commands(main, ctx, stock)   # imports every command, as click itself would
    assert listed.getvalue() == stock.getvalue()
    assert "\n  sync " in listed.getvalue() and "\n  hub " in listed.getvalue()

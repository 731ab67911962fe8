"""The README's "`rsnotify admin` ... as a table or `--json`": --json works where users put it,
before the command (`admin --json overview`) and after it (`admin subscriptions --trouble
--json`, `admin dead-letters list SID --json`). Before, the latter was "No such option: --json"
(exit 2). A real hub process and the installed console script."""
from __future__ import annotations

import json

from tests.support import cli


def test_json_is_taken_before_and_after_the_command(hub_process) -> None:
    hub = hub_process()
    env = {"RSNOTIFY_HUB_URL": hub.url}
    for args in (["--json", "overview"], ["overview", "--json"], ["subscriptions", "--trouble", "--json"],
                 ["topics", "--json"]):
        done = cli.run("admin", *args, env=env)
        assert done.returncode == 0, (args, done.stderr)
        data = json.loads(done.stdout)
        assert isinstance(data, dict), (args, data)
    assert "busiest_topics" in json.loads(cli.run("admin", "overview", "--json", env=env).stdout)
    table = cli.run("admin", "overview", env=env)
    assert table.returncode == 0 and not table.stdout.lstrip().startswith("{"), table.stdout
    sid = "0" * 32
    done = cli.run("admin", "dead-letters", "list", sid, "--json", env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr    # no such subscription: one line
    assert "No such option" not in done.stderr

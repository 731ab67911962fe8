"""Traps a new user fell into, each closed with one line and the right exit code, run as the
installed `rsnotify` script: a missing hub extra, an unreachable Redis, a file as --data-dir, a
bad URL before a port is bound, a hub that is down said once, `URI@not-a-datetime`."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.support import cli
from tests.support.ports import free_port

# A meta-path finder that makes `import redis` fail as it does after a plain `pip install .`:
# Python runs sitecustomize at start-up from PYTHONPATH.
BLOCK_REDIS = '''\
import sys


class _NoRedis:
    def find_spec(self, name, path=None, target=None):
        if name == "redis" or name.startswith("redis."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoRedis())
'''


def _one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1]


@pytest.mark.parametrize("command", [["hub", "--port", "0"], ["worker", "--redis-url", "redis://127.0.0.1:1/0"]])
def test_hub_commands_without_the_hub_extra_say_how_to_install_it(tmp_path, command):
    (tmp_path / "sitecustomize.py").write_text(BLOCK_REDIS)
    result = cli.run(*command, "--data-dir", str(tmp_path / "data"), env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"rsnotify {command[0]} needs the hub extra: pip install 'rsnotify[hub]'"
    assert not (tmp_path / "data").exists()
    # The blocker really blocks: the same interpreter cannot import redis.
    probe = subprocess.run([sys.executable, "-c", "import redis"], env=cli.environment({"PYTHONPATH": str(tmp_path)}),
                           capture_output=True, text=True, check=False)
    assert probe.returncode == 1 and "No module named 'redis'" in probe.stderr


def test_worker_says_redis_is_unreachable_within_the_connect_timeout(tmp_path):
    closed = free_port()
    started = time.monotonic()
    result = cli.run("worker", "--redis-url", f"redis://127.0.0.1:{closed}/0", "--data-dir", str(tmp_path / "no-key"),
                     "--connect-timeout", "2")
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert _one_line_error(result.stderr).startswith(f"Error: cannot reach Redis at redis://127.0.0.1:{closed}/0")
    assert "secret key" not in result.stderr
    assert elapsed < 15, f"took {elapsed:.1f} s"   # not the 30 s wait for a key file


@pytest.mark.parametrize("command", [["hub", "--port", "0"], ["worker", "--redis-url", "redis://127.0.0.1:1/0"]])
@pytest.mark.parametrize(("where", "message"), [
    ("notes.txt", "notes.txt is a file; expected a folder (created if missing)"),
    ("notes.txt/data", "notes.txt/data is inside {tmp}/notes.txt, which is a file; expected a folder"),
])
def test_a_file_as_data_dir_is_a_usage_error(tmp_path, command, where, message):
    (tmp_path / "notes.txt").write_text("mine\n")
    result = cli.run(*command, "--data-dir", str(tmp_path / where))
    assert result.returncode == 2, result.stderr
    assert message.format(tmp=tmp_path) in _one_line_error(result.stderr)
    assert "Errno" not in result.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize(("args", "message"), [
    (["--topic", "notaurl"], "--topic must be an absolute http or https URL, got 'notaurl'"),
    (["--topic", "http://127.0.0.1:1/t", "--hub", "hub.example.org"], "--hub must be an absolute http or https URL"),
    (["--source", "ftp://example.org/"], "--source must be an absolute http or https URL"),
])
def test_subscribe_checks_urls_before_binding_its_port(tmp_path, args, message):
    port = free_port()
    result = cli.run("subscribe", *args, "--listen", f"127.0.0.1:{port}", "--state-file", str(tmp_path / "s.db"))
    assert result.returncode == 2, result.stderr
    assert message in _one_line_error(result.stderr)
    assert "listening on" not in result.stderr
    assert not (tmp_path / "s.db").exists()


def test_a_hub_that_is_down_is_described_once(tmp_path):
    hub = f"http://127.0.0.1:{free_port()}/"
    subscribed = cli.run("subscribe", "--topic", "http://127.0.0.1:9/t", "--hub", hub,
                         "--listen", f"127.0.0.1:{free_port()}", "--state-file", str(tmp_path / "s.db"))
    assert subscribed.returncode == 1, subscribed.stderr
    line = _one_line_error(subscribed.stderr)
    assert line == f"Error: cannot reach hub {hub} to subscribe http://127.0.0.1:9/t: connection refused"
    assert subscribed.stderr.count(hub) == 1, subscribed.stderr

    published = cli.run("publish", "--hub", hub, "--topic", "http://127.0.0.1:9/t", "--updated",
                        "http://127.0.0.1:9/a", "--no-state", "--attempts", "1")
    assert published.returncode == 1, published.stderr
    assert _one_line_error(published.stderr) == f"Error: hub {hub} could not be reached: connection refused"
    assert published.stderr.count(hub.rstrip("/").rpartition(":")[2]) == 1, published.stderr  # its port, once


def test_an_at_sign_not_followed_by_a_datetime_is_refused(tmp_path):
    state = tmp_path / "state.db"
    result = cli.run("publish", "--hub", f"http://127.0.0.1:{free_port()}/", "--topic", "https://example.org/changes",
                     "--updated", "https://example.org/a@yesterday", "--state", str(state))
    assert result.returncode == 2, result.stderr
    assert _one_line_error(result.stderr) == (
        "Error: --updated https://example.org/a@yesterday: 'yesterday' after the last @ is not a W3C datetime "
        "(e.g. 2024-05-01T10:00:00Z); write an @ that belongs to the URI as %40")
    if state.exists():   # opened before the changes are read: it must hold nothing
        from rsnotify.publisher.memory.store import ChangeMemory
        memory = ChangeMemory(state)
        try:
            assert memory.last_until("https://example.org/changes") is None
        finally:
            memory.close()
    # A user@host authority and a real datetime still work as before (checked without a hub).
    from datetime import UTC, datetime

    from rsnotify.notification import ChangeType
    from rsnotify.publisher.changes import parse_change_option
    now = datetime.now(UTC)
    assert parse_change_option(ChangeType.UPDATED, "https://me@example.org/a", now).loc == "https://me@example.org/a"
    dated = parse_change_option(ChangeType.UPDATED, "https://example.org/a@2024-05-01T10:00:00Z", now)
    assert (dated.loc, dated.changed_at) == ("https://example.org/a", datetime(2024, 5, 1, 10, tzinfo=UTC))

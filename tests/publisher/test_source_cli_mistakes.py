"""`rsnotify source` (and `publish`) given what a stranger following the README might give them:
a hub URL the hub does not call itself (localhost for a hub on 127.0.0.1), a change memory in a
folder that cannot exist (also `publish --state`), a change memory another `rsnotify source` is
using, a public base URL without --listen, and a hub that refuses the notification for good under
`--write --once`. Each is one line on stderr and exit 1, never a traceback, and never "accepted"."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import redis as redis_lib

from tests.support import cli
from tests.support.ports import free_port


def _src(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha\n")
    return src


def test_a_hub_url_the_hub_does_not_call_itself_exits_1_before_anything_is_published(hub_process, redis_url,
                                                                                       tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)     # its public URL is http://127.0.0.1:PORT/
    other_name = f"http://localhost:{hub.port}/"
    result = cli.run("source", "--dir", str(_src(tmp_path)), "--base-url", f"http://127.0.0.1:{free_port()}/",
                     "--hub", other_name, "--db", str(tmp_path / "m.db"), timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"give --hub {hub.url}" in result.stderr
    assert "Traceback" not in result.stderr
    client = redis_lib.Redis.from_url(redis_url)
    try:
        assert client.scard("rsnotify:topics") == 0
    finally:
        client.close()


def test_the_hub_url_without_its_trailing_slash_is_the_same_hub(hub_process, redis_url, tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)
    result = cli.run("source", "--dir", str(_src(tmp_path)), "--base-url", f"http://127.0.0.1:{free_port()}/",
                     "--hub", hub.url.rstrip("/"), "--db", str(tmp_path / "m.db"),
                     "--write", str(tmp_path / "out"), "--once", timeout=90)
    assert result.returncode == 0, result.stderr
    assert "every notification accepted" in result.stderr


def test_a_change_memory_that_cannot_be_created_is_one_line(hub_process, redis_url, tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    db = blocker / "m.db"
    result = cli.run("source", "--dir", str(_src(tmp_path)), "--base-url", f"http://127.0.0.1:{free_port()}/",
                     "--hub", hub.url, "--db", str(db), timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"cannot open the change memory {db}" in result.stderr
    assert "Traceback" not in result.stderr


def test_write_once_exits_1_when_the_hub_refuses_the_notification_for_good(hub_process, redis_url, tmp_path):
    # a body limit no notification fits: the hub answers 413, which no resend can cure
    hub = hub_process("--max-body", "64", redis_url=redis_url, workers=0)
    args = ("source", "--dir", str(_src(tmp_path)), "--base-url", f"http://127.0.0.1:{free_port()}/",
            "--hub", hub.url, "--db", str(tmp_path / "m.db"), "--write", str(tmp_path / "out"), "--once")
    result = cli.run(*args, timeout=90)
    assert result.returncode == 1, result.stderr
    assert "refused for good" in result.stderr
    assert "413" in result.stderr
    assert "every notification accepted" not in result.stderr
    assert "Traceback" not in result.stderr
    # the refusal is that run's news: a next run with nothing new to send exits 0
    again = cli.run(*args, timeout=90)
    assert again.returncode == 0, again.stderr


def test_write_once_with_a_token_the_hub_refuses_ends_at_once_naming_it(hub_process, redis_url, tmp_path):
    # the hub wants a publisher token; a wrong one is refused with 401 on every try: --once says
    # so within seconds (it waited out its 60 s), and the notification waits for the next run
    hub = hub_process("--publish-token", "right-token=http://", redis_url=redis_url, workers=0)
    args = ("source", "--dir", str(_src(tmp_path)), "--base-url", f"http://127.0.0.1:{free_port()}/",
            "--hub", hub.url, "--db", str(tmp_path / "m.db"), "--write", str(tmp_path / "out"), "--once",
            "--token", "wrong-token")
    started = time.monotonic()
    result = cli.run(*args, timeout=90)
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - started < 30, result.stderr
    last = result.stderr.splitlines()[-1]
    assert "refused this publisher's credential" in last and "401" in last and "--token" in last, last
    assert "Traceback" not in result.stderr


def test_a_public_base_url_without_listen_names_the_way_out(hub_process, redis_url, tmp_path):
    # the base URL is the public one; without --listen the Source binds its host, not this machine's
    hub = hub_process(redis_url=redis_url, workers=0)
    result = cli.run("source", "--dir", str(_src(tmp_path)), "--base-url", "https://data.invalid/dataset1/",
                     "--hub", hub.url, "--db", str(tmp_path / "m.db"), timeout=60)
    assert result.returncode == 1, result.stderr
    assert "cannot serve on data.invalid:443" in result.stderr
    assert "give --listen HOST:PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_second_source_on_the_same_change_memory_is_refused(hub_process, redis_url, run_source, tmp_path):
    # both would see each change in SRC and record it twice: two notifications of one change
    hub = hub_process(redis_url=redis_url, workers=0)
    src = _src(tmp_path)
    base = f"http://127.0.0.1:{free_port()}/dataset1/"
    first = run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
                       ready_url=base + "capabilitylist.xml")
    for extra in (("--listen", f"127.0.0.1:{free_port()}"), ("--write", str(tmp_path / "out"), "--once")):
        result = cli.run("source", "--dir", str(src), "--base-url", base, "--hub", hub.url,
                         "--db", str(tmp_path / "m.db"), *extra, timeout=60)
        assert result.returncode == 1, result.stderr
        assert f"is in use by rsnotify source (pid {first.pid})" in result.stderr
        assert "Traceback" not in result.stderr
    assert cli.stop(first, signal.SIGINT) == 0
    # once the first has stopped, the memory is free again
    again = cli.run("source", "--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
                    "--write", str(tmp_path / "out"), "--once", timeout=90)
    assert again.returncode == 0, again.stderr


def test_publish_with_a_state_file_that_cannot_be_created_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    state = blocker / "memory.db"
    result = cli.run("publish", "--hub", f"http://127.0.0.1:{free_port()}/", "--topic", "https://example.org/t/",
                     "--updated", "https://example.org/r", "--state", str(state), timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"cannot open the change memory {state}" in result.stderr
    assert "Traceback" not in result.stderr

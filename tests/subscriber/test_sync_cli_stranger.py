"""`rsnotify sync`, `audit` and `subscribe` run as the README has a stranger run them: an audit
of a copy whose Source stopped says it audited nothing and why (one verdict line, exit 3), and
`subscribe --source` finds a Source below the host root where `sync --source` finds it."""
from __future__ import annotations

import signal
import socket

from tests.support import cli
from tests.support.ports import free_port
from tests.support.sources import serve_folder
from tests.support.waiting import wait_until


def test_audit_of_a_copy_whose_source_is_stopped_says_nothing_was_audited(hub_process, redis_url, run_source,
                                                                          tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)
    base, source = serve_folder(run_source, hub.url, tmp_path,
                                {"nested dir/café.txt": "alpha\n", "empty.txt": ""})
    mirror = tmp_path / "mirror"
    first = cli.run("sync", "--source", base, "--dir", str(mirror), "--once", timeout=120)
    assert first.returncode == 0, first.stderr
    assert cli.run("audit", "--source", base, "--dir", str(mirror), timeout=120).returncode == 0
    assert cli.stop(source, signal.SIGINT) == 0
    result = cli.run("audit", "--source", base, "--dir", str(mirror), timeout=120)
    assert result.returncode == 3, result.stderr
    assert result.stderr.splitlines()[-1] == "rsnotify audit: the Source cannot be reached: nothing was audited"
    assert "Traceback" not in result.stderr


def test_subscribe_finds_a_source_below_the_host_root_as_sync_does(hub_process, redis_url, run_source, tmp_path):
    # the README's `rsnotify subscribe --source URL` on what `rsnotify source` serves at /dataset1/:
    # the host has no /.well-known/resourcesync, the Source Description is <URL>sourcedescription.xml
    hub = hub_process(redis_url=redis_url, workers=1)
    base, _ = serve_folder(run_source, hub.url, tmp_path, {"a.txt": "alpha\n"})
    log = tmp_path / "subscribe.log"
    subscribe = cli.start("subscribe", "--source", base, "--listen", f"127.0.0.1:{free_port()}",
                          "--state-file", str(tmp_path / "sub.db"), log=log)
    try:
        wait_until(lambda: subscribe.poll() is not None or f"subscribed to {base}changes" in log.read_text(),
                   60.0, "the subscription", logs=[log])
        assert subscribe.poll() is None, log.read_text()
        assert f"discovered channel {base}changes with hub(s) {hub.url}" in log.read_text()
    finally:
        assert cli.stop(subscribe, signal.SIGINT) == 0, log.read_text()


def test_a_callback_url_that_is_no_url_is_a_usage_error_before_anything_starts(tmp_path):
    # a bare word once reached aiohttp's router as a route path: a traceback after the baseline
    source = f"http://127.0.0.1:{free_port()}/dataset1/"     # never contacted: refused before
    for command in (("sync", "--source", source, "--dir", str(tmp_path / "copy")),
                    ("subscribe", "--source", source, "--listen", "127.0.0.1:0",
                     "--state-file", str(tmp_path / "sub.db"))):
        result = cli.run(*command, "--callback-url", "notaurl", timeout=60)
        assert result.returncode == 2, result.stderr
        assert "--callback-url must be an absolute http or https URL, got 'notaurl'" in result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "copy").exists()


def test_the_last_runs_callback_address_taken_by_another_program_names_the_way_out(hub_process, redis_url,
                                                                                   run_source, tmp_path):
    hub = hub_process(redis_url=redis_url, workers=1)
    base, _ = serve_folder(run_source, hub.url, tmp_path, {"a.txt": "alpha\n"})
    mirror, log = tmp_path / "mirror", tmp_path / "sync.log"
    port = free_port()
    live = cli.start("sync", "--source", base, "--dir", str(mirror), "--listen", f"127.0.0.1:{port}", log=log)
    try:
        wait_until(lambda: live.poll() is not None or "rsnotify sync: live" in log.read_text(), 60.0, "live",
                   logs=[log])
        # a second sync of the folder while this one runs is told the folder is in use, not to
        # give --listen (the port it would reuse is this sync's own)
        second = cli.run("sync", "--source", base, "--dir", str(mirror), timeout=60)
        assert second.returncode != 0 and "is in use by" in second.stderr, second.stderr
        assert "cannot listen" not in second.stderr and "Traceback" not in second.stderr
    finally:
        assert cli.stop(live, signal.SIGTERM) == 0, log.read_text()
    with socket.create_server(("127.0.0.1", port)):        # another program took the port meanwhile
        result = cli.run("sync", "--source", base, "--dir", str(mirror), timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}, the callback address of the last run" in result.stderr
    assert "give --listen HOST:PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_folder_whose_first_sync_never_reached_its_source_needs_one_named(tmp_path):
    # the first sync could not reach the Source, so DIR's state names none: without --source the
    # next sync or audit is a usage error (exit 2, as for a DIR with no state), not a failure (1)
    mirror = tmp_path / "mirror"
    first = cli.run("sync", "--source", f"http://127.0.0.1:{free_port()}/", "--dir", str(mirror), "--once")
    assert first.returncode == 3, first.stderr
    for command in ("sync", "audit"):
        again = cli.run(command, "--dir", str(mirror), *(["--once"] if command == "sync" else []))
        assert again.returncode == 2, again.stderr
        assert again.stderr.splitlines()[-1].startswith(f"rsnotify {command}: no Source: give --source URL"), again.stderr
        assert "Traceback" not in again.stderr

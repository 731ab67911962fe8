"""`rsnotify sync --dir DIR` and `rsnotify audit --dir DIR` without --source or
--capability-list resume with the Capability List DIR's state remembers (a fresh DIR is a usage
error, exit 2); both used to stop on an AssertionError traceback."""
from __future__ import annotations

from pathlib import Path

from tests.support import cli
from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.waiting import wait_until

WAIT = 60.0


def test_sync_and_audit_resume_from_the_remembered_source(hub_process, run_source, tmp_path: Path) -> None:
    hub = hub_process()
    src, mirror = tmp_path / "src", tmp_path / "mirror"
    src.mkdir()
    (src / "a.txt").write_text("alpha\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}/data/"
    log = tmp_path / "source.log"      # where run_source writes its output
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               ready_url=base + "resourcelist.xml")
    first = cli.run("sync", "--source", base, "--dir", str(mirror), "--once")
    assert first.returncode == 0, first.stderr
    (src / "b.txt").write_text("beta\n")
    wait_until(lambda: b"/data/b.txt" in fetch(base + "resourcelist.xml").body, WAIT, "b.txt in the Resource List",
               logs=log)
    audit = cli.run("audit", "--dir", str(mirror))
    assert audit.returncode == 1, audit.stderr           # b.txt is missing: a difference
    assert "Traceback" not in audit.stderr and "missing 1" in audit.stderr, audit.stderr
    again = cli.run("sync", "--dir", str(mirror), "--once")
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr
    copy = mirror / f"127.0.0.1_{port}" / "data"
    assert (copy / "b.txt").read_text() == "beta\n"
    assert cli.run("audit", "--dir", str(mirror)).returncode == 0
    fresh = cli.run("audit", "--dir", str(tmp_path / "fresh"))
    assert fresh.returncode == 2 and "give --source URL or --capability-list URL" in fresh.stderr, fresh.stderr

"""`rsnotify source` pointed at a checkout, against a real `rsnotify hub`: hidden files, editor
scratch, VCS folders and --exclude globs are never served, listed or published; a client
trickling its headers is cut off; a taken port stops it before anything is recorded or published."""
from __future__ import annotations

import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis as redis_lib

from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange
from rsnotify.publisher.memory.store import ChangeMemory
from tests.support import cli
from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.sources import listed
from tests.support.waiting import wait_until

WAIT = 60.0


def checkout(src: Path) -> None:
    """A working copy as people have them: VCS data, secrets in dotfiles, editor leftovers, build output."""
    (src / ".git").mkdir(parents=True)
    (src / ".git" / "config").write_text('[remote "origin"]\n\turl = https://user:secret@example.org/r.git\n')
    (src / ".env").write_text("API_KEY=secret\n")
    (src / ".cache").mkdir()
    (src / ".cache" / "x.bin").write_bytes(b"x")
    (src / "docs").mkdir()
    (src / "docs" / "a.txt").write_text("alpha\n")
    (src / "docs" / "a.txt~").write_text("old alpha\n")
    (src / "docs" / ".a.txt.swp").write_bytes(b"swap")
    (src / "docs" / "b.swp").write_bytes(b"swap")
    (src / "docs" / "#a.txt#").write_text("autosave\n")
    (src / "build").mkdir()
    (src / "build" / "out.o").write_bytes(b"obj")
    (src / "run.log").write_text("log\n")
    (src / "readme.txt").write_text("readme\n")


HIDDEN_AND_SCRATCH = [".git/config", ".env", ".cache/x.bin", "docs/a.txt~", "docs/.a.txt.swp", "docs/b.swp",
                      "docs/%23a.txt%23", "build/out.o", "run.log"]


def test_hidden_scratch_vcs_and_excluded_files_are_never_served_listed_or_published(hub_process, redis_url,
                                                                                   run_source, tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)
    src = tmp_path / "src"
    checkout(src)
    base = f"http://127.0.0.1:{free_port()}/data/"
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               "--exclude", "build", "--exclude", "*.log", ready_url=base + "capabilitylist.xml")
    for name in HIDDEN_AND_SCRATCH:
        answer = fetch(base + name)
        assert answer.status == 404, (name, answer.status)
    assert fetch(base + "docs/a.txt").text == "alpha\n"
    wanted = [base + "docs/a.txt", base + "readme.txt"]
    assert listed(base + "resourcelist.xml") == wanted
    # what reaches the hub is what the Change List holds: the start scan's two files
    wait_until(lambda: listed(base + "changelist.xml") == wanted, WAIT, "the start scan's changes")
    # live edits to excluded files are not published either; a visible one is
    (src / "docs" / "c.txt.swp").write_bytes(b"swap")
    (src / ".env").write_text("API_KEY=other\n")
    (src / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (src / "docs" / "new.txt").write_text("new\n")
    wait_until(lambda: base + "docs/new.txt" in listed(base + "changelist.xml"), WAIT, "the live edit")
    assert listed(base + "changelist.xml") == sorted([*wanted, base + "docs/new.txt"])
    client = redis_lib.Redis.from_url(redis_url)
    try:
        bodies = b"".join(fields[b"body"] for key in client.scan_iter("rsnotify:topic:*:log")
                          for _, fields in client.xrange(key))
    finally:
        client.close()
    assert b"docs/a.txt" in bodies and b"docs/new.txt" in bodies
    for secret in (b".git", b".env", b"swp", b"a.txt~", b"%23a.txt%23", b"build/", b"run.log"):
        assert secret not in bodies, secret


def test_include_hidden_serves_dotfiles_but_never_vcs_folders(hub_process, redis_url, run_source, tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)
    src = tmp_path / "src"
    checkout(src)
    base = f"http://127.0.0.1:{free_port()}/data/"
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               "--include-hidden", ready_url=base + "capabilitylist.xml")
    assert fetch(base + ".env").status == 200
    assert fetch(base + ".git/config").status == 404
    assert fetch(base + "docs/a.txt~").status == 404
    assert base + ".git/config" not in listed(base + "resourcelist.xml")


def test_a_client_trickling_its_headers_is_cut_off(hub_process, redis_url, run_source, tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               "--header-timeout", "2", "--body-timeout", "1", ready_url=base + "capabilitylist.xml")
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
        slow.sendall(b"GET /a.txt HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        reply = b"x"
        slow.settimeout(0.5)
        while time.monotonic() - began < 20:
            try:
                slow.sendall(b"X-Trickle: 1\r\n")    # a byte or so at a time, never the blank line
                reply = slow.recv(1024)
                break
            except TimeoutError:
                continue
            except OSError:   # reset by the Source: cut off
                reply = b""
                break
        cut_after = time.monotonic() - began
        assert reply == b"" or reply.startswith(b"HTTP/1.1 408"), reply
    assert cut_after < 8, f"still open after {cut_after:.1f} s (--header-timeout 2)"
    assert fetch(base + "a.txt").text == "alpha\n"   # others are served meanwhile
    # a body announced and never sent: 408 once --body-timeout passes
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.sendall(b"GET /a.txt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n0123456789")
        assert slow.recv(1024).startswith(b"HTTP/1.1 408"), "no 408 for a body that never came"


def test_a_taken_port_exits_1_before_anything_is_recorded_or_published(hub_process, redis_url, tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha\n")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = cli.run("source", "--dir", str(src), "--base-url", f"http://127.0.0.1:{port}/",
                         "--hub", hub.url, "--db", str(tmp_path / "m.db"), timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"cannot serve on 127.0.0.1:{port}" in result.stderr
    assert "start scan" not in result.stderr
    assert "Traceback" not in result.stderr
    client = redis_lib.Redis.from_url(redis_url)
    try:
        assert client.scard("rsnotify:topics") == 0
        assert list(client.scan_iter("rsnotify:topic:*")) == []
    finally:
        client.close()
    assert "stored" not in hub.output()


def test_a_change_memory_whose_chain_ends_in_the_future_is_a_one_line_error(hub_process, redis_url, tmp_path):
    # an older rsnotify recorded a notification dated 2099: every change dated by the clock now
    # comes before the chain's end (or, dated at it, in the future), so nothing can be recorded
    hub = hub_process(redis_url=redis_url, workers=0)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha\n")
    base = f"http://127.0.0.1:{free_port()}/"
    far = datetime(2099, 1, 1, tzinfo=UTC)
    memory = ChangeMemory(tmp_path / "m.db")
    try:
        memory.record_documents(base + "changes", [ChangeNotification(
            far - timedelta(hours=1), far, (ResourceChange(base + "old.txt", ChangeType.UPDATED, far),))])
    finally:
        memory.close()
    result = cli.run("source", "--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
                     timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"cannot record the changes in the change memory {tmp_path / 'm.db'}" in result.stderr
    assert "2099-01-01T00:00:00Z in the future" in result.stderr
    assert "Traceback" not in result.stderr
    assert "stored" not in hub.output()

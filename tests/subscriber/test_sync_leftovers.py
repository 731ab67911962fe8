"""Issue 20's last rules, each with a hostile Source (an aiohttp server on loopback) and a real
`rsnotify sync` / `rsnotify audit` process: refusals counted by loc, both locs of a collision
reported, audit's checks never through a symlink, Ctrl-C of an audit, bodies held to their
Content-Length."""
from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import threading
import time

from aiohttp import web

from tests.subscriber.test_sync_trust import (  # noqa: F401  (the fixture is used by name)
    RSNOTIFY,
    copy_of,
    hostile,
    snapshot,
    status,
    sync_once,
)


def test_refusals_count_the_refused_locs_not_each_poll(hostile, tmp_path):
    dest = tmp_path / "dest"
    hostile.add("/a.txt", b"a")
    hostile.delete("http://victimhost/notes.txt")
    hostile.delete("http://.rsnotify/state.db")
    for _ in range(3):                      # three starts, each lists the same two hostile entries
        run = sync_once(hostile, dest)
        assert run.code == 1 and len(run.of("refused")) == 2   # reported at every run ...
    info = status(dest)
    assert info["refusals"] == {"host": 2}                     # ... but counted once per loc
    assert sorted(r["loc"] for r in info["last_refusals"]) == ["http://.rsnotify/state.db",
                                                               "http://victimhost/notes.txt"]


def test_ctrl_c_stops_an_audit_with_130_and_one_line(hostile, tmp_path):
    dest = tmp_path / "dest"
    hostile.add("/a.txt", b"a")
    assert sync_once(hostile, dest).code == 0
    release = threading.Event()
    original = hostile.handle

    async def slow_list(request: web.Request) -> web.StreamResponse:
        if request.raw_path == "/resourcelist.xml":
            hostile.hits.append(request.raw_path)
            response = web.StreamResponse()
            await response.prepare(request)
            await response.write(b"<?xml version='1.0' encoding='UTF-8'?>\n")
            while not release.is_set():          # an audit in the middle of a long list
                await asyncio.sleep(0.05)
            return response
        return await original(request)

    hostile.handle = slow_list                   # the app routes through the attribute
    hostile.hits.clear()
    try:
        audit = subprocess.Popen([RSNOTIFY, "audit", "--capability-list", hostile.base + "/caps.xml",
                                  "--dir", str(dest)], stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while "/resourcelist.xml" not in hostile.hits and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "/resourcelist.xml" in hostile.hits
        audit.send_signal(signal.SIGINT)
        _, err = audit.communicate(timeout=10)
    finally:
        release.set()
    assert audit.returncode == 130, err
    assert "rsnotify audit: interrupted" in err and "Aborted" not in err and "Traceback" not in err, err
    assert "interrupted" in subprocess.run([RSNOTIFY, "audit", "--help"], capture_output=True, text=True).stdout


def test_audit_reports_a_planted_symlink_and_never_reads_through_it(hostile, tmp_path):
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    hostile.add("/a.txt", b"alpha")
    hostile.add("/b/c.txt", b"gamma")
    hostile.add("/d.txt", b"delta")
    assert sync_once(hostile, dest).code == 0
    folder = copy_of(hostile, dest)
    # Links to copies with the very same bytes: read through, they would pass as "same".
    (outside / "b").mkdir(parents=True)
    (outside / "a.txt").write_bytes(b"alpha")
    (outside / "b" / "c.txt").write_bytes(b"gamma")
    (folder / "a.txt").unlink()
    (folder / "a.txt").symlink_to(outside / "a.txt")
    shutil.rmtree(folder / "b")
    (folder / "b").symlink_to(outside / "b", target_is_directory=True)
    before = snapshot(outside)
    audit = subprocess.run([RSNOTIFY, "audit", "--capability-list", hostile.base + "/caps.xml", "--dir", str(dest),
                            "--deep", "--json"], capture_output=True, text=True, timeout=60, check=False)
    assert audit.returncode == 1, audit.stderr
    assert "Traceback" not in audit.stderr and "missing 2 (symlinks 2)" in audit.stderr, audit.stderr
    [done] = [json.loads(line) for line in audit.stdout.splitlines() if '"audit.done"' in line]
    assert done["same"] == 1 and done["symlinks"] == 2
    assert sorted(done["examples"]["symlink"]) == [hostile.base + "/a.txt", hostile.base + "/b/c.txt"]
    # --repair refuses to write through them; what they point at is left as it was
    repair = subprocess.run([RSNOTIFY, "audit", "--capability-list", hostile.base + "/caps.xml", "--dir", str(dest),
                             "--repair"], capture_output=True, text=True, timeout=60, check=False)
    assert repair.returncode == 1 and "Traceback" not in repair.stderr, repair.stderr
    assert snapshot(outside) == before and (folder / "a.txt").is_symlink()

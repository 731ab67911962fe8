"""Issue 20's last rules, each with a hostile Source (an aiohttp server on loopback) and a real
`rsnotify sync` / `rsnotify audit` process: refusals counted by loc, both locs of a collision
reported, audit's checks never through a symlink, Ctrl-C of an audit, bodies held to the announced
length and the size cap (chunked, compressed)."""
from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time

from aiohttp import web

from rsnotify.lists import Resource

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


def _chunked(body: bytes, piece: int = 4096):
    """A handler that streams `body` chunked, with no Content-Length to warn the client."""
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        try:
            for start in range(0, len(body), piece):
                await response.write(body[start:start + piece])
        except (ConnectionResetError, RuntimeError):
            pass
        return response
    return handler


def _gzipped(body: bytes):
    """A handler that serves `body` gzip-encoded, with the Content-Length of the encoded bytes."""
    encoded = gzip.compress(body)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=encoded, headers={"Content-Encoding": "gzip"})
    return handler


def test_bodies_are_held_to_the_announced_length_and_the_size_cap(hostile, tmp_path):
    dest = tmp_path / "dest"
    announced = [
        ("/exact.bin", b"0123456789", 10),                   # chunked, exactly as announced: stored
        ("/one-more.bin", b"0123456789X", 10),               # chunked, one byte past it: cut, refused
        ("/unannounced.bin", b"u" * 100_000, None),          # no length: up to --max-resource-size
        ("/over-cap.bin", b"o" * (3 << 20), None),           # no length, past the cap: cut, refused
    ]
    for path, body, length in announced:
        hostile.listed.append(Resource(hostile.base + path, length=length))
        hostile.bodies[path] = _chunked(body)
    text = b"line of a text file\n" * 50_000                  # 1 MB that gzips to a few KB
    hostile.listed.append(Resource(hostile.base + "/text.txt", length=len(text),
                                   hashes=(("md5", hashlib.md5(text).hexdigest()),)))
    hostile.bodies["/text.txt"] = _gzipped(text)
    hostile.listed.append(Resource(hostile.base + "/tiny.txt", length=3))   # gzip makes 3 bytes ~23
    hostile.bodies["/tiny.txt"] = _gzipped(b"abc")
    hostile.listed.append(Resource(hostile.base + "/bomb.txt", length=10))  # 50 MB of zeros in ~50 KB
    hostile.bodies["/bomb.txt"] = _gzipped(bytes(50 << 20))
    run = sync_once(hostile, dest, "--max-resource-size", "2MiB")
    folder = copy_of(hostile, dest)
    assert run.code == 1
    assert (folder / "exact.bin").read_bytes() == b"0123456789"
    assert (folder / "unannounced.bin").read_bytes() == b"u" * 100_000
    assert (folder / "text.txt").read_bytes() == text and (folder / "tiny.txt").read_bytes() == b"abc"
    assert sorted(os.listdir(folder)) == ["exact.bin", "text.txt", "tiny.txt", "unannounced.bin"]  # no partials
    rules = {e["loc"].rsplit("/", 1)[1]: e["rule"] for e in run.of("refused")}
    assert rules == {"one-more.bin": "length", "over-cap.bin": "size", "bomb.txt": "length"}, run.events

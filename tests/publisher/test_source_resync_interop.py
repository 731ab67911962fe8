"""`rsnotify source` as the reference client sees it: the real `resync` package (resync-sync,
resync-explorer) copies a folder of awkward names (spaces, NFC and NFD, %, #, ?, +, sub-delims,
leading dots, an empty file, a symlink, a deep tree) with --baseline, follows creates, updates,
deletes and a rename with --incremental --delete, finds the copy in sync with --audit (lengths and
md5/sha-256 hashes checked), and walks the documents from the well-known URI; served by
`rsnotify source` and written by `rsnotify source --write` behind nginx alike.

resync writes each resource under its loc's path as it is, without decoding it; so the copy is
compared with the folder after decoding its names, and a name that needs no escaping in a URL
path ("a+b&c.txt") must be copied under that very name."""
from __future__ import annotations

import io
import subprocess
import sys
import time
import unicodedata
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote

import pytest

from rsnotify.datetimes import format_datetime
from rsnotify.lists import ListRef, open_list
from tests.publisher.test_static_source import nginx, nginx_site  # noqa: F401  (nginx: a fixture)
from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.waiting import wait_until

BIN = Path(sys.executable).parent   # resync's console scripts, installed with the dev extra
WAIT = 60.0
NFC = unicodedata.normalize("NFC", "café.txt")
NFD = unicodedata.normalize("NFD", "café.txt")
VERBATIM = "a+b&c;d=e,(f)!$'@:g.txt"   # RFC 3986 pchar only: no escaping needed in a path
FILES = {
    "with space.txt": b"space\n", NFC: b"composed\n", NFD: b"decomposed\n", "100%.txt": b"percent\n",
    "a#b.txt": b"hash\n", "a?b.txt": b"query\n", VERBATIM: b"sub-delims\n", ".leading-dot.txt": b"dot\n",
    "empty.txt": b"", "target.txt": b"target\n", "d1/d2/d3/d4/d5/d6/d7/d8/d9/d10/deep leaf.txt": b"deep\n",
}


def resync(*args: str, cwd: Path) -> str:
    """A resync console script run to completion; its output, after checking it went well (resync
    exits 0 even after a FatalError, so the output is checked too)."""
    done = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=300, cwd=cwd,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "FatalError" not in output and "Traceback" not in output, output
    return output


def decoded_tree(root: Path) -> dict[str, bytes]:
    """path (decoded as resync's names need) -> bytes, for every file under root."""
    return {unquote(p.relative_to(root).as_posix()): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def resource_lengths(base: str) -> dict[str, int | None]:
    """The Source's Resource List (a single list) as decoded path -> length."""
    return {unquote(e.loc.removeprefix(base)): e.length for e in open_list(io.BytesIO(fetch(base + "resourcelist.xml").body))}


def source_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("mode", ["served", "written behind nginx"])
def test_resync_copies_follows_and_audits_a_folder_of_awkward_names(hub_process, run_source, request, tmp_path,
                                                                     mode):
    hub = hub_process(workers=1)
    src = tmp_path / "src"
    for name, body in FILES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(body)
    (src / "link.txt").symlink_to("target.txt")          # inside the folder: served as a file
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    written: tuple[str, ...] = ()
    if mode != "served":   # `rsnotify source --write OUT`, the README's nginx block serving SRC and OUT
        request.getfixturevalue("nginx")(nginx_site("/", src, tmp_path / "out", hub.url, base), port)
        written = ("--write", str(tmp_path / "out"))
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               "--include-hidden", *written, ready_url=base + "resourcelist.xml")
    listed = wait_until(lambda: (e := list(open_list(io.BytesIO(fetch(base + "resourcelist.xml").body))))
                        and len(e) == len(FILES) + 1 and e, WAIT, "every file in the Resource List")
    at = open_list(io.BytesIO(fetch(base + "resourcelist.xml").body)).info.at
    assert base + VERBATIM in {entry.loc for entry in listed}

    # Baseline from the host root (resync finds /.well-known/resourcesync, then the lists).
    copy = tmp_path / "copy"
    resync("resync-sync", "--baseline", base, str(copy), cwd=tmp_path)
    expected = source_tree(src)
    assert decoded_tree(copy) == expected
    assert (copy / VERBATIM).read_bytes() == FILES[VERBATIM]       # under its own name, not a%2Bb...
    assert (copy / "empty.txt").stat().st_size == 0
    audit = resync("resync-sync", "--audit", "--hash", "md5", "--hash", "sha-256", base, str(copy), cwd=tmp_path)
    assert f"IN SYNC (same={len(expected)}, to create=0, to update=0, to delete=0)" in audit, audit

    # Creates, an update, a delete and a rename, live; then resync's incremental sync.
    (src / "new file+1.txt").write_bytes(b"new\n")
    (src / NFD).write_bytes(b"decomposed, changed\n")
    (src / "a#b.txt").unlink()
    (src / "d1/d2/d3/d4/d5/d6/d7/d8/d9/d10/deep leaf.txt").rename(src / "d1" / "moved up.txt")
    (src / "empty.txt").write_bytes(b"not empty any more\n")
    expected = source_tree(src)
    wait_until(lambda: resource_lengths(base) == {name: len(body) for name, body in expected.items()}, WAIT,
               "the live changes in the Resource List")
    # resync starts after the Resource List's `at` (see the README: its own checkpoint is the
    # newest lastmod it fetched, from which it would replay the start scan's creates).
    after_at = format_datetime(at + timedelta(microseconds=1))
    resync("resync-sync", "--incremental", "--delete", "--from", after_at, base, str(copy), cwd=tmp_path)
    assert decoded_tree(copy) == expected
    audit = resync("resync-sync", "--audit", "--hash", "md5", "--hash", "sha-256", base, str(copy), cwd=tmp_path)
    assert f"IN SYNC (same={len(expected)}, to create=0, to update=0, to delete=0)" in audit, audit


def test_resync_explorer_walks_from_the_well_known_uri_to_every_list(hub_process, run_source, tmp_path):
    hub = hub_process(workers=1)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.txt", "b c.txt", VERBATIM):
        (src / name).write_bytes(name.encode())
    base = f"http://127.0.0.1:{free_port()}/"
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               ready_url=base + "resourcelist.xml")
    # Source Description -> [1] Capability List -> [1] Resource List, back, [2] Change List, quit.
    walk = subprocess.run([str(BIN / "resync-explorer"), "--sitemap", base + ".well-known/resourcesync"],
                          input="1\n1\nb\n2\nq\n", capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          check=False)
    output = walk.stdout + walk.stderr
    assert walk.returncode == 0, output
    for parsed in ("Parsed description document with 1 entries", "Parsed capabilitylist document with 3 entries",
                   "Parsed resourcelist document with 3 entries", "Parsed changelist document with 3 entries"):
        assert parsed in output, output
    assert "Cannot parse" not in output and "Cannot read" not in output, output
    assert f"[1] {base}capabilitylist.xml" in output and f"{base}b%20c.txt" in output and base + VERBATIM in output
    # resync knows no change-notification capability: its only warning is about that entry.
    warnings = [line for line in output.splitlines() if "WARNING" in line or "EXPECTED" in line]
    assert all("change-notification" in line for line in warnings), warnings


def test_resync_follows_a_change_list_index_one_list_at_a_time(hub_process, run_source, tmp_path):
    """resync cannot read a Change List Index; the README's way round it: --changelist-uri at
    each list of the index in turn, from the first whose until is after --from."""
    hub = hub_process(workers=1)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"start {i}.txt").write_bytes(b"%d\n" % i)
    base = f"http://127.0.0.1:{free_port()}/"
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               "--rotate", "1", ready_url=base + "resourcelist.xml")
    at = open_list(io.BytesIO(fetch(base + "resourcelist.xml").body)).info.at
    assert at is not None
    copy = tmp_path / "copy"
    resync("resync-sync", "--baseline", base, str(copy), cwd=tmp_path)

    # Three live batches over more than a second each: the lists rotate between them.
    edits = [lambda: (src / "start 0.txt").write_bytes(b"changed\n"), lambda: (src / "start 1.txt").unlink(),
             lambda: (src / "late+new.txt").write_bytes(b"late\n")]
    for number, edit in enumerate(edits, 1):
        edit()
        wanted = {name: len(body) for name, body in source_tree(src).items()}
        wait_until(lambda: resource_lengths(base) == wanted, WAIT, f"batch {number} in the Resource List")  # noqa: B023
        time.sleep(1.2)
    index = open_list(io.BytesIO(fetch(base + "changelist.xml").body))
    assert index.info.is_index
    lists = [ref for ref in index if isinstance(ref, ListRef)]
    assert len(lists) >= 3

    # resync on the index itself: it cannot (and says so, while exiting 0).
    done = subprocess.run([str(BIN / "resync-sync"), "--incremental", "--delete", "--from",
                           format_datetime(at + timedelta(microseconds=1)), base, str(copy)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert "ChangeTypeError" in done.stdout + done.stderr

    after_at = format_datetime(at + timedelta(microseconds=1))
    for ref in lists:
        if ref.until is None or ref.until > at:
            resync("resync-sync", "--incremental", "--delete", "--from", after_at, "--changelist-uri", ref.loc,
                   base, str(copy), cwd=tmp_path)
    assert decoded_tree(copy) == source_tree(src)

"""`rsnotify source` as a user runs it, against a real `rsnotify hub`: the documents it serves
validate and parse with resync, `resync-sync --baseline` makes a byte-identical copy, edits
(live and offline) are recorded and published, bad input gets one line and an exit code."""
from __future__ import annotations

import filecmp
import io
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from datetime import timedelta
from pathlib import Path

import pytest
from resync.change_list import ChangeList as ResyncChangeList
from resync.resource_list import ResourceList as ResyncResourceList

from rsnotify.datetimes import format_datetime
from rsnotify.documents import parse_document
from rsnotify.lists import ListInfo, Resource, open_list
from rsnotify.publisher.memory.resourcelist import write_resource_list
from rsnotify.publisher.source.server import SourceUrls
from rsnotify.xml import parse_capability_list, parse_source_description
from tests.support import cli
from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.waiting import wait_until

BIN = Path(sys.executable).parent   # resync's console scripts
WAIT = 60.0


def _tree(src: Path) -> None:
    (src / "sub dir").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"alpha\n")
    (src / "sub dir" / "b c.json").write_bytes(b'{"b": 1}\n')
    (src / "bin.dat").write_bytes(bytes(range(256)) * 40)
    (src / "leak").symlink_to("/etc/hostname" if Path("/etc/hostname").exists() else "/etc/passwd")


def _changelist_entries(base: str) -> list:
    answer = fetch(base + "changelist.xml")
    assert answer.status == 200
    stream = open_list(io.BytesIO(answer.body))
    assert not stream.info.is_index
    return list(stream)


def test_source_serves_a_folder_that_resync_copies_byte_for_byte(hub_process, run_source, tmp_path):
    hub = hub_process(workers=1)     # nothing is delivered here: one worker is plenty
    src = tmp_path / "src"
    _tree(src)
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    db = tmp_path / "state" / "memory.db"
    source = run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(db),
                        ready_url=base + "capabilitylist.xml")

    # Discovery at the host root: /.well-known/resourcesync -> Capability List -> lists, channel.
    answer = fetch(base + ".well-known/resourcesync")
    assert answer.status == 200 and answer.headers["Content-Type"].startswith("application/xml")
    assert parse_source_description(answer.body).capability_lists == [base + "capabilitylist.xml"]
    capability_list = parse_capability_list(fetch(base + "capabilitylist.xml").body)
    assert {e.capability: e.loc for e in capability_list.entries} == {
        "resourcelist": base + "resourcelist.xml", "changelist": base + "changelist.xml",
        "change-notification": base + "changes",
    }
    assert capability_list.change_notification_channels()[0].hubs == (hub.url,)

    # Every document validates (rsnotify validate, as a user runs it: exit 0 only when each file
    # is valid, so one run checks all four) and resync reads the lists.
    documents = {}
    for name in (".well-known/resourcesync", "capabilitylist.xml", "resourcelist.xml", "changelist.xml"):
        path = tmp_path / name.replace("/", "_")
        path.write_bytes(fetch(base + name).body)
        documents[name] = path
    checked = cli.run("validate", *map(str, documents.values()))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    resource_list = ResyncResourceList()
    resource_list.parse(str_data=documents["resourcelist.xml"].read_text())
    assert sorted(r.uri for r in resource_list) == [base + "a.txt", base + "bin.dat", base + "sub%20dir/b%20c.json"]
    assert all(r.md5 and r.length and r.mime_type for r in resource_list)
    change_list = ResyncChangeList()
    change_list.parse(str_data=documents["changelist.xml"].read_text())
    assert sorted((r.uri, r.change) for r in change_list) == sorted((r.uri, "created") for r in resource_list)
    info = open_list(io.BytesIO(documents["resourcelist.xml"].read_bytes())).info
    topic = fetch(base + "changes", "HEAD")
    assert topic.status == 200 and topic.headers["Content-Type"] == "application/xml"
    assert f'<{base}changes>; rel="self"' in topic.headers["Link"] and f'<{hub.url}>; rel="hub"' in topic.headers["Link"]
    notification = wait_until(lambda: fetch(base + "changes").body, WAIT, "the first notification on the topic URI")
    assert info.at is not None and f'until="{info.at.isoformat().replace("+00:00", "Z")}"'.encode() in notification

    # Files: headers a client relies on; a symlink leaving SRC is not served.
    answer = fetch(base + "sub%20dir/b%20c.json", "GET")
    assert (answer.status, answer.body, answer.headers["Content-Length"]) == (200, b'{"b": 1}\n', "9")
    assert answer.headers["ETag"] and answer.headers["Last-Modified"]
    assert fetch(base + "leak").status == 404

    # resync's own client, baseline: a byte-identical copy.
    copy = tmp_path / "copy"
    synced = subprocess.run([str(BIN / "resync-sync"), "--baseline", base, str(copy)], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, check=False)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    # resync maps a loc to a path without decoding it: "sub%20dir/b%20c.json" on its side.
    for name in ("a.txt", "bin.dat", "sub dir/b c.json"):
        assert filecmp.cmp(src / name, copy / urllib.parse.quote(name), shallow=False)
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file()) == [
        "a.txt", "bin.dat", "sub%20dir/b%20c.json",
    ]
    assert not (copy / "leak").exists()

    # A live edit is recorded and published; the Resource List follows.
    (src / "a.txt").write_bytes(b"alpha, changed\n")
    (src / "bin.dat").unlink()
    entries = wait_until(lambda: (e := _changelist_entries(base)) and len(e) >= 5 and e, WAIT,
                         "the live changes in the Change List")
    assert sorted((e.loc, e.change.value) for e in entries[3:]) == [(base + "a.txt", "updated"), (base + "bin.dat", "deleted")]
    assert next(e for e in entries[3:] if e.loc == base + "a.txt").length == len(b"alpha, changed\n")
    listed = {r.loc: r for r in open_list(io.BytesIO(fetch(base + "resourcelist.xml").body))}
    assert sorted(listed) == [base + "a.txt", base + "sub%20dir/b%20c.json"] and listed[base + "a.txt"].length == 15

    # resync's incremental sync from the Change List brings its copy up to date, deletes included.
    # It is told to start after the Resource List's `at` (the list reflects every change up to
    # it): left to itself it starts at the newest lastmod it downloaded, replays the start
    # scan's creates, and then drops bin.dat's delete as half of a create/delete pair.
    after_at = format_datetime(info.at + timedelta(microseconds=1))
    synced = subprocess.run([str(BIN / "resync-sync"), "--incremental", "--delete", "--from", after_at,
                             "--changelist-uri", base + "changelist.xml", base, str(copy)],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert (copy / "a.txt").read_bytes() == b"alpha, changed\n" and not (copy / "bin.dat").exists(), synced.stdout + synced.stderr

    # Offline edits are exactly what the next start publishes.
    assert cli.stop(source, signal.SIGINT) == 0
    (src / "sub dir" / "b c.json").unlink()
    (src / "new.txt").write_bytes(b"new\n")
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(db), ready_url=base + "changelist.xml")
    entries = _changelist_entries(base)
    assert sorted((e.loc, e.change.value) for e in entries[5:]) == [
        (base + "new.txt", "created"), (base + "sub%20dir/b%20c.json", "deleted"),
    ]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--dir", "{tmp}/missing", "--base-url", "http://127.0.0.1:1/", "--hub", "http://127.0.0.1:1/"], 2, "is not a folder"),
        (["--dir", "{tmp}", "--base-url", "ftp://example.org/data/", "--hub", "http://127.0.0.1:1/"], 2, "is not an http(s) URL"),
        (["--dir", "{tmp}", "--base-url", "http://127.0.0.1:1/", "--hub", "http://127.0.0.1:1/", "--db", "{tmp}/m.db",
          "--listen", "nonsense"], 2, "is not HOST:PORT"),
        (["--dir", "{tmp}/src", "--base-url", "http://127.0.0.1:1/", "--hub", "http://127.0.0.1:{closed}/",
          "--db", "{tmp}/m.db"], 1, "cannot reach the hub"),
    ],
)
def test_bad_input_gets_one_line_and_an_exit_code(tmp_path, args, code, message):
    (tmp_path / "src").mkdir()
    values = {"tmp": str(tmp_path), "closed": str(free_port())}
    result = cli.run("source", *(a.format(**values) for a in args), env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert result.returncode == code, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_base_below_the_host_root_serves_its_source_description_beside_the_lists():
    urls = SourceUrls("https://example.org/dataset1/")
    assert urls.source_description == "https://example.org/dataset1/sourcedescription.xml"
    assert SourceUrls("https://example.org/").source_description == "https://example.org/.well-known/resourcesync"


def test_a_resource_list_past_the_limits_becomes_an_index_of_parts(tmp_path):
    resources = [Resource(f"https://example.org/r{i:03d}", length=i, hashes=(("md5", "0" * 32),)) for i in range(25)]
    from datetime import UTC, datetime

    at = datetime(2026, 11, 21, tzinfo=UTC)
    files = write_resource_list(iter(resources), tmp_path, at=at, up="https://example.org/capabilitylist.xml",
                                part_url=lambda name: "https://example.org/" + name, max_entries=10,
                                index_url="https://example.org/resourcelist.xml")
    index = open_list(io.BytesIO(files.main.read_bytes()))
    assert index.info == ListInfo("resourcelist", True, at, links=index.info.links)
    refs = list(index)
    assert [ref.loc.rsplit("/", 1)[1] for ref in refs] == [p.name for p in files.parts] and len(refs) == 3
    assert all(ref.at == at for ref in refs)
    assert parse_document(files.main.read_bytes()).is_valid
    read = [r for part in files.parts for r in open_list(io.BytesIO(part.read_bytes()))]
    assert read == resources
    for part in files.parts:
        verdict = parse_document(part.read_bytes())
        assert verdict.is_valid and verdict.entries <= 10
        assert open_list(io.BytesIO(part.read_bytes())).info.link("index") == "https://example.org/resourcelist.xml"
    small = write_resource_list(iter(resources[:3]), tmp_path / "small", at=at, up="https://example.org/c.xml",
                                part_url=str)
    assert small.parts == () and not open_list(io.BytesIO(small.main.read_bytes())).info.is_index


def test_source_keeps_going_while_the_hub_is_down(hub_process, run_source, tmp_path):
    hub_port = free_port()
    hub = hub_process(port=hub_port, workers=1)     # nothing is delivered here: one worker is plenty
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("one\n")
    base = f"http://127.0.0.1:{free_port()}/data/"
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               "--rotate", "0.5", ready_url=base + "capabilitylist.xml")
    first = wait_until(lambda: fetch(base + "changes").body, WAIT, "the first notification accepted")
    rotate_after = time.monotonic() + 0.5      # the first Change List was opened before that
    hub.stop()
    time.sleep(max(0.0, rotate_after - time.monotonic()))  # past --rotate: the next notification closes it
    (src / "a.txt").write_text("two\n")
    refs = wait_until(lambda: (i := open_list(io.BytesIO(fetch(base + "changelist.xml").body))).info.is_index
                      and list(i), WAIT, "the Change List Index after the rotation")
    assert len(refs) == 2 and refs[0].until == refs[1].from_ and refs[1].until is None
    closed = fetch(refs[0].loc)
    assert closed.status == 200 and "immutable" in closed.headers["Cache-Control"] and fetch(refs[0].loc).body == closed.body
    [entry] = list(open_list(io.BytesIO(fetch(refs[1].loc).body)))
    assert (entry.loc, entry.change.value) == (base + "a.txt", "updated")  # recorded although no hub answers
    assert fetch(base + "changes").body == first
    hub_process(port=hub_port, workers=1)  # back: the outbox delivers what waited
    later = wait_until(lambda: (body := fetch(base + "changes").body) != first and body, 120,
                       "the edit delivered after the hub returned")
    assert b"a.txt" in later and b'change="updated"' in later


def test_a_folder_lists_regular_files_inside_it_only(tmp_path):
    from rsnotify.publisher.source.folder import Folder, changes_against

    root = tmp_path / "src"
    (root / "ü dir").mkdir(parents=True)
    (root / "ü dir" / "x%y.txt").write_text("x")
    (root / "capabilitylist.xml").write_text("<shadowed/>")
    os.symlink(tmp_path, root / "outside")  # a symlinked folder leaving the root
    os.symlink(root / "ü dir" / "x%y.txt", root / "inside-link.txt")
    with open(os.path.join(os.fsencode(root), b"bad\xff.txt"), "wb") as handle:
        handle.write(b"no URL")
    folder = Folder(root, "http://127.0.0.1:1/d/", ["capabilitylist.xml"])
    states = folder.scan()
    assert sorted(states) == ["http://127.0.0.1:1/d/%C3%BC%20dir/x%25y.txt", "http://127.0.0.1:1/d/inside-link.txt"]
    assert folder.path_for("%C3%BC%20dir/x%25y.txt") == root / "ü dir" / "x%y.txt"
    (tmp_path / "secret.txt").write_text("secret")
    assert folder.path_for("../secret.txt") is None and folder.path_for("outside/secret.txt") is None
    assert folder.path_for("capabilitylist.xml") is None
    changes = changes_against(states, {"http://127.0.0.1:1/d/gone.txt": "md5:0"}, complete=True)
    assert [(c.loc.rsplit("/", 1)[1], c.change.value) for c in changes] == [
        ("gone.txt", "deleted"), ("x%25y.txt", "created"), ("inside-link.txt", "created"),  # deletes first
    ]

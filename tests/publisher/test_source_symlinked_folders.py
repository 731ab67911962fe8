"""A symlink to a folder made while `rsnotify source` runs is treated as the start scan treats
it: not descended into. A link leaving SRC is not walked (a link to /etc used to visit every file
there, a warning each, and a link to / the whole disk), and a link to a folder inside SRC does
not give its files a second URL."""
from __future__ import annotations

from pathlib import Path

from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.sources import listed
from tests.support.waiting import wait_until

WAIT = 60.0


def test_folder_symlinks_made_live_are_not_walked(hub_process, run_source, tmp_path: Path) -> None:
    hub = hub_process()
    src, outside = tmp_path / "src", tmp_path / "outside"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.txt").write_text("x\n")
    outside.mkdir()
    for i in range(30):
        (outside / f"secret-{i}.txt").write_text("secret\n")
    base = f"http://127.0.0.1:{free_port()}/data/"
    log = tmp_path / "source.log"      # where run_source writes its output
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               ready_url=base + "resourcelist.xml")
    (src / "away").symlink_to(outside, target_is_directory=True)
    (src / "alias").symlink_to(src / "sub", target_is_directory=True)
    (src / "marker.txt").write_text("after the links\n")
    wait_until(lambda: base + "marker.txt" in listed(base + "changelist.xml"), WAIT, "the marker", logs=log)
    assert listed(base + "resourcelist.xml") == [base + "marker.txt", base + "sub/x.txt"]
    assert listed(base + "changelist.xml") == [base + "marker.txt", base + "sub/x.txt"]
    text = log.read_text()
    assert "secret-" not in text, text[-2000:]
    assert fetch(base + "away/secret-1.txt").status == 404

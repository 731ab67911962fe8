"""A copy that `rsnotify sync` keeps inside the folder a Source serves is not served: syncing a
Source into a subfolder of its own folder gives one copy, not a copy inside the copy inside the
copy (each round served back and copied one level deeper)."""
from __future__ import annotations

from pathlib import Path

from tests.support import cli
from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.sources import listed
from tests.support.waiting import wait_until

WAIT = 60.0


def test_a_sync_into_a_subfolder_of_its_own_source_is_one_copy(hub_process, run_source, tmp_path: Path) -> None:
    hub = hub_process()
    src = tmp_path / "src"
    (src / "docs").mkdir(parents=True)
    (src / "a.txt").write_text("a\n")
    (src / "docs" / "b.txt").write_text("b\n")
    base = f"http://127.0.0.1:{free_port()}/data/"
    log = tmp_path / "source.log"
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               ready_url=base + "resourcelist.xml")
    mirror = src / "mirror"
    for _ in range(2):      # a second round must not find the copy served back either
        done = cli.run("sync", "--source", base, "--dir", str(mirror), "--once", timeout=120)
        assert done.returncode == 0, done.stderr
        copied = sorted(p.relative_to(mirror).as_posix() for p in mirror.rglob("*.txt"))
        layout = base.split("//", 1)[1].replace(":", "_")     # the copy's folders: host_port/path/
        assert copied == [f"{layout}a.txt", f"{layout}docs/b.txt"], copied
    (src / "c.txt").write_text("c\n")      # the Source still follows its own files
    wait_until(lambda: base + "c.txt" in listed(base + "resourcelist.xml"), WAIT, "c.txt listed", logs=[log])
    assert listed(base + "resourcelist.xml") == [base + "a.txt", base + "c.txt", base + "docs/b.txt"]
    assert fetch(base + "mirror/a.txt").status == 404
    assert "is not served: it is a copy that rsnotify sync keeps" in log.read_text()

"""Every resource `rsnotify source` lists can be fetched at its loc, whatever characters its
file name holds: a line break (listed as %0A) used to be listed yet answered 404, since the
catch-all route's "." does not match a line break; `rsnotify sync` then copies the whole tree."""
from __future__ import annotations

import io
from pathlib import Path

from rsnotify.lists import open_list
from tests.support import cli
from tests.support.http import fetch
from tests.support.ports import free_port

WAIT = 60.0
NAMES = ["new\nline.txt", "tab\there.txt", "back\\slash.txt", " lead space.txt", "%41.txt", "q?r#s.txt",
         "café 日本.txt", "sub dir/x\ny.txt"]


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_listed_resource_is_served_and_copied(hub_process, run_source, tmp_path: Path) -> None:
    hub = hub_process()
    src = tmp_path / "src"
    for i, name in enumerate(NAMES):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(f"file {i}\n".encode())
    port = free_port()
    base = f"http://127.0.0.1:{port}/data/"
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
               ready_url=base + "resourcelist.xml")
    listed = [entry.loc for entry in open_list(io.BytesIO(fetch(base + "resourcelist.xml").body))]
    assert len(listed) == len(NAMES), listed
    assert base + "new%0Aline.txt" in listed
    for loc in listed:
        answer = fetch(loc)
        assert answer.status == 200, (loc, answer.status, answer.text)
    result = cli.run("sync", "--source", base, "--dir", str(tmp_path / "copy"), "--once")
    assert result.returncode == 0, result.stderr
    assert tree(tmp_path / "copy" / f"127.0.0.1_{port}" / "data") == tree(src)

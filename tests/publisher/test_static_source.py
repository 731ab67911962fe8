"""`rsnotify source --write` behind a real nginx (Debian's; the test skips without it): the
README's configuration serves SRC and the written documents, `rsnotify sync` and
`resync-sync --baseline` both make an equal copy, and `--once` publishes one notification for a
batch of offline edits and updates the lists."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rsnotify.lists import open_list
from rsnotify.xml import parse_capability_list, parse_source_description
from tests.support import cli
from tests.support.http import fetch, get_json
from tests.support.ports import free_port
from tests.support.waiting import wait_until

BIN = Path(sys.executable).parent   # resync's console scripts
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
WAIT = 60.0



def nginx_site(base_path: str, src: Path, out: Path, hub: str, base: str) -> str:
    """The README's nginx server block for a Source under `base_path`, SRC and OUT as given."""
    return textwrap.dedent(f"""\
        location = /.well-known/resourcesync {{
            alias {out}/sourcedescription.xml;
            types {{ }} default_type application/xml;
            add_header Cache-Control no-cache;
        }}
        location ~ ^{base_path}((sourcedescription|capabilitylist|resourcelist|changelist)[^/]*\\.xml)$ {{
            alias {out}/$1;
            types {{ }} default_type application/xml;
            add_header Cache-Control no-cache;
        }}
        location = {base_path}changes {{
            alias {out}/changes;
            types {{ }} default_type application/xml;
            add_header Link '<{hub}>; rel="hub", <{base}changes>; rel="self"' always;
        }}
        location ~ ^{base_path}\\.rsnotify-write- {{ return 404; }}
        location {base_path} {{
            alias {src}/;
        }}
        """)


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[Callable[[str, int], str]]:
    """Factory: run nginx on 127.0.0.1:`port` with `site` (server-block lines); returns its
    http://127.0.0.1:PORT. Stopped after the test."""
    if not Path(NGINX).is_file():
        pytest.skip("nginx is not installed (apt-get install -y nginx; .ci/run tries it)")
    started: list[subprocess.Popen] = []

    def start(site: str, port: int) -> str:
        prefix = tmp_path / f"nginx-{port}"
        prefix.mkdir()
        conf = prefix / "nginx.conf"
        conf.write_text(textwrap.dedent(f"""\
            daemon off;
            user root;
            worker_processes 1;
            pid {prefix}/nginx.pid;
            error_log {prefix}/error.log;
            events {{ worker_connections 64; }}
            http {{
                include /etc/nginx/mime.types;
                access_log off;
                client_body_temp_path {prefix}/body;
                proxy_temp_path {prefix}/proxy;
                fastcgi_temp_path {prefix}/fastcgi;
                uwsgi_temp_path {prefix}/uwsgi;
                scgi_temp_path {prefix}/scgi;
                server {{
                    listen 127.0.0.1:{port};
            {textwrap.indent(site, "        ")}
                }}
            }}
            """))
        with (prefix / "stderr.log").open("wb") as stderr:     # nginx keeps its own copy
            process = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(conf)], stdout=subprocess.DEVNULL,
                                       stderr=stderr)
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: process.poll() is not None or _answers(url + "/"), 30.0, "nginx to listen",
                   logs=[prefix / "stderr.log", prefix / "error.log"])
        assert process.poll() is None, (prefix / "stderr.log").read_text() + (prefix / "error.log").read_text()
        return url

    yield start
    for process in started:
        process.terminate()
        process.wait(10)


def _answers(url: str) -> bool:
    try:
        fetch(url)
    except OSError:
        return False
    return True


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _write_files(src: Path) -> None:
    (src / "sub dir").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"alpha\n")
    (src / "sub dir" / "b c.json").write_bytes(b'{"b": 1}\n')
    (src / "bin.dat").write_bytes(bytes(range(256)) * 40)


def _notifications(hub_url: str, topic: str) -> list[dict]:
    status, found = get_json(f"{hub_url}admin/topics?url={urllib.parse.quote(topic, safe='')}")
    assert status == 200, found
    if not found["topics"]:
        return []
    status, detail = get_json(f"{hub_url}admin/topics/{found['topics'][0]['tid']}")
    assert status == 200, detail
    return detail["recent_notifications"]


def test_written_documents_behind_nginx_are_copied_by_rsnotify_sync_and_resync(hub_process, nginx, tmp_path):
    hub = hub_process()
    src, out = tmp_path / "src", tmp_path / "out"
    _write_files(src)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    base = url + "/dataset1/"
    nginx(nginx_site("/dataset1/", src, out, hub.url, base), port)
    once = cli.run("source", "--dir", str(src), "--base-url", base, "--hub", hub.url, "--db",
                   str(tmp_path / "memory.db"), "--write", str(out), "--once")
    assert once.returncode == 0, once.stderr
    names = sorted(p.name for p in out.iterdir())
    assert [n for n in names if not n.startswith("changelist-")] == [
        "capabilitylist.xml", "changelist.xml", "changes", "resourcelist.xml", "sourcedescription.xml",
    ]
    assert len([n for n in names if n.startswith("changelist-")]) == 1, names   # the open list, by name too

    # Discovery through nginx: the well-known URL, the Capability List, the topic's Link headers.
    description = fetch(url + "/.well-known/resourcesync")
    assert description.status == 200 and description.headers["Content-Type"] == "application/xml"
    assert parse_source_description(description.body).capability_lists == [base + "capabilitylist.xml"]
    capabilities = parse_capability_list(fetch(base + "capabilitylist.xml").body)
    assert capabilities.change_notification_channels()[0].hubs == (hub.url,)
    topic = fetch(base + "changes", "HEAD")
    assert topic.status == 200 and f'<{hub.url}>; rel="hub"' in topic.headers["Link"]
    listed = {r.loc for r in open_list(io.BytesIO(fetch(base + "resourcelist.xml").body))}
    assert listed == {base + "a.txt", base + "bin.dat", base + "sub%20dir/b%20c.json"}

    # rsnotify sync: an equal copy.
    dest = tmp_path / "dest"
    synced = cli.run("sync", "--source", base, "--dir", str(dest), "--once")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    copy_root = dest / f"127.0.0.1_{urllib.parse.urlsplit(url).port}" / "dataset1"
    # The copy has the Source's own names (each loc segment decoded once).
    assert _tree(copy_root) == _tree(src)

    # resync's own client: a byte-identical copy (it keeps "%20" in the file names).
    copy = tmp_path / "resync-copy"
    resynced = subprocess.run([str(BIN / "resync-sync"), "--baseline", base, str(copy)], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path, check=False)
    assert resynced.returncode == 0, resynced.stdout + resynced.stderr
    assert _tree(copy) == {urllib.parse.quote(name): body for name, body in _tree(src).items()}


def test_once_after_fifty_offline_edits_publishes_one_notification_and_updates_the_lists(hub_process, nginx, tmp_path):
    hub = hub_process()
    src = tmp_path / "src"
    _write_files(src)
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    db = tmp_path / "memory.db"
    args = ("source", "--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(db), "--write", "--once")
    first = cli.run(*args)   # --write without OUT: the documents go into SRC itself
    assert first.returncode == 0, first.stderr
    wait_until(lambda: len(_notifications(hub.url, base + "changes")) == 1, WAIT, "the first notification")

    for i in range(48):
        (src / f"new-{i:02d}.txt").write_bytes(f"file {i}\n".encode())
    (src / "a.txt").write_bytes(b"alpha, changed\n")
    (src / "bin.dat").unlink()
    second = cli.run(*args)
    assert second.returncode == 0, second.stderr
    notifications = wait_until(lambda: (n := _notifications(hub.url, base + "changes")) and len(n) == 2 and n,
                               WAIT, "the second notification")
    assert len(notifications) == 2, notifications

    # The lists, served by nginx from SRC, list the resources but never the Source's documents.
    site = textwrap.dedent(f"""\
        location = /.well-known/resourcesync {{ alias {src}/sourcedescription.xml; }}
        location = /changes {{ alias {src}/changes; }}
        location / {{ root {src}; }}
        """)
    served = nginx(site, port)
    resources = {r.loc for r in open_list(io.BytesIO(fetch(served + "/resourcelist.xml").body))}
    assert resources == {base + "a.txt", base + "sub%20dir/b%20c.json"} | {base + f"new-{i:02d}.txt" for i in range(48)}
    changes = list(open_list(io.BytesIO(fetch(served + "/changelist.xml").body)))
    assert len(changes) == 3 + 50
    assert sorted((c.loc, c.change.value) for c in changes[3:] if not c.loc.startswith(base + "new-")) == [
        (base + "a.txt", "updated"), (base + "bin.dat", "deleted"),
    ]
    third = cli.run(*args)   # nothing changed: nothing published, nothing listed twice
    assert third.returncode == 0 and "recorded 0 change(s)" in third.stderr, third.stderr
    time.sleep(0.5)
    assert len(_notifications(hub.url, base + "changes")) == 2
    assert json.dumps(sorted(p.name for p in src.iterdir() if p.name.startswith(".rsnotify-write-"))) == "[]"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--write", "{tmp}/src/docs"], "is inside SRC; write into SRC itself or a folder outside it"),
        (["--write", "{tmp}/src/a.txt"], "exists and is not a folder"),
        (["--once"], "--once needs --write"),
        (["--write", "{tmp}", "--once"], "the change memory {tmp}/m.db is inside OUT"),
    ],
)
def test_bad_write_options_get_one_line_and_exit_2(tmp_path, args, message):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    values = {"tmp": str(tmp_path)}
    result = cli.run("source", "--dir", str(tmp_path / "src"), "--base-url", "http://127.0.0.1:1/",
                     "--hub", "http://127.0.0.1:1/", "--db", str(tmp_path / "m.db"), *(a.format(**values) for a in args))
    assert result.returncode == 2, result.stderr
    assert message.format(**values) in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == ["a.txt"]   # nothing written


def test_an_out_that_cannot_be_written_records_nothing_and_the_next_run_publishes_everything(hub_process, tmp_path):
    # As a served Source binds its port before recording: an OUT that cannot be created (here
    # below a plain file, which fails even for root) exits 1 with one line and leaves the change
    # memory as it was, so the run with a good OUT records and publishes the whole scan.
    hub = hub_process()
    src = tmp_path / "src"
    _write_files(src)
    (tmp_path / "plain").write_text("not a folder")
    base = f"http://127.0.0.1:{free_port()}/"
    args = ("source", "--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"))
    bad = cli.run(*args, "--write", str(tmp_path / "plain" / "out"), "--once")
    assert bad.returncode == 1, bad.stderr
    assert "cannot write the documents into" in bad.stderr and "nothing was recorded" in bad.stderr
    assert "Traceback" not in bad.stderr and "recorded 3 change(s)" not in bad.stderr
    good = cli.run(*args, "--write", str(tmp_path / "out"), "--once")
    assert good.returncode == 0, good.stderr
    assert "scan recorded 3 change(s)" in good.stderr, good.stderr
    notifications = wait_until(lambda: _notifications(hub.url, base + "changes"), WAIT, "the notification")
    assert len(notifications) == 1, notifications
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".rsnotify-write-")) == []

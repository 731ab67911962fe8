"""`rsnotify admin` against a port nobody listens on: one line in plain words, the hub's URL
once, without aiohttp's own text ("Cannot connect to host ... ssl:default [Connect call failed ...]")."""
from __future__ import annotations

from tests.support import cli
from tests.support.ports import free_port


def test_an_unreachable_hub_is_one_plain_line() -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    result = cli.run("admin", "--hub", url, "overview")
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [f"Error: cannot reach the hub at {url}: connection refused "
                     "(is the hub running? point --hub or RSNOTIFY_HUB_URL at it)"], lines

"""Issue 20's last rules, each with a hostile Source (an aiohttp server on loopback) and a real
`rsnotify sync` / `rsnotify audit` process: refusals counted by loc, both locs of a collision
reported, audit's checks never through a symlink, Ctrl-C of an audit, bodies held to their
Content-Length."""
from __future__ import annotations

from tests.subscriber.test_sync_trust import (  # noqa: F401  (the fixture is used by name)
    hostile,
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

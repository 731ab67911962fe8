"""A change memory shared by processes, as the README invites ("threads and processes sharing
the file make one unbroken chain"): a served `rsnotify source` keeps answering its lists after
another process opened the same file and closed it. Before, every connection the Source opened
(one per list request) re-read the file's first byte through Python to look for an old JSON state,
and closing that handle dropped all of the process's POSIX locks on the file; the other process,
seeing no other user, deleted the WAL and shared-memory files at its close, and the Source answered
500 ("disk I/O error") from then on."""
from __future__ import annotations

import subprocess
import sys
import time

from tests.support.http import fetch
from tests.support.ports import free_port
from tests.support.waiting import wait_until

OTHER_PROCESS = """
import sys
from rsnotify.publisher.memory.store import ChangeMemory
memory = ChangeMemory(sys.argv[1])
memory.last_until(sys.argv[2])
memory.close()
"""


def test_a_served_source_keeps_its_lists_after_another_process_used_its_memory(hub_process, redis_url, run_source,
                                                                              tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("alpha\n")
    base = f"http://127.0.0.1:{free_port()}/dataset1/"
    db = tmp_path / "m.db"
    run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(db),
               ready_url=base + "capabilitylist.xml")
    for name in ("resourcelist.xml", "changelist.xml"):      # each opens a snapshot connection
        assert fetch(base + name).status == 200
    subprocess.run([sys.executable, "-c", OTHER_PROCESS, str(db), base + "changes"], check=True, timeout=60)
    assert db.with_name(db.name + "-wal").exists(), "the other process deleted the Source's WAL"
    (src / "b.txt").write_text("beta\n")
    time.sleep(0.5)
    wait_until(lambda: "b.txt" in fetch(base + "changelist.xml").text, 30.0, "b.txt in the Change List")
    for name in ("resourcelist.xml", "changelist.xml"):
        answer = fetch(base + name)
        assert answer.status == 200, answer.text

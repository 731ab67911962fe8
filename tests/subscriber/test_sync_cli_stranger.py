"""`rsnotify sync`/`audit` as the README's quick start has a stranger run them, then the Source
stopped: an audit says it audited nothing and why (one verdict line, exit 3), never only that it
is "using what the state remembers"."""
from __future__ import annotations

import signal

from tests.support import cli
from tests.support.ports import free_port


def test_audit_of_a_copy_whose_source_is_stopped_says_nothing_was_audited(hub_process, redis_url, run_source,
                                                                          tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)
    src = tmp_path / "src"
    (src / "nested dir").mkdir(parents=True)
    (src / "nested dir" / "café.txt").write_text("alpha\n")
    (src / "empty.txt").write_bytes(b"")
    base = f"http://127.0.0.1:{free_port()}/dataset1/"
    source = run_source("--dir", str(src), "--base-url", base, "--hub", hub.url, "--db", str(tmp_path / "m.db"),
                        ready_url=base + "capabilitylist.xml")
    mirror = tmp_path / "mirror"
    first = cli.run("sync", "--source", base, "--dir", str(mirror), "--once", timeout=120)
    assert first.returncode == 0, first.stderr
    assert cli.run("audit", "--source", base, "--dir", str(mirror), timeout=120).returncode == 0
    assert cli.stop(source, signal.SIGINT) == 0
    result = cli.run("audit", "--source", base, "--dir", str(mirror), timeout=120)
    assert result.returncode == 3, result.stderr
    assert result.stderr.splitlines()[-1] == "rsnotify audit: the Source cannot be reached: nothing was audited"
    assert "Traceback" not in result.stderr

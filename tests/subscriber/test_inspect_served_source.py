"""`rsnotify inspect BASE` on what `rsnotify source` serves below the host root: the README's
`rsnotify inspect https://example.org/dataset1/` finds `<BASE>sourcedescription.xml`, where the
Source serves it and `rsnotify sync --source BASE` finds it, though the host has no
/.well-known/resourcesync."""
from __future__ import annotations

from tests.support import cli
from tests.support.sources import serve_folder


def test_inspect_from_the_base_url_of_a_source_below_the_host_root(hub_process, redis_url, run_source, tmp_path):
    hub = hub_process(redis_url=redis_url, workers=0)
    base, _ = serve_folder(run_source, hub.url, tmp_path, {"a b.txt": "alpha\n"})
    result = cli.run("inspect", base, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Source Description: {base}sourcedescription.xml" in result.stdout
    assert f"Capability List: {base}capabilitylist.xml" in result.stdout
    assert "(Resource List, at " in result.stdout and "1 entry)" in result.stdout
    assert "no problems found" in result.stdout
    # a folder URL that is no Source still reports what it tried, exit 1
    missing = cli.run("inspect", base.replace("dataset1", "nothere"), timeout=60)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert "answered 404" in missing.stdout

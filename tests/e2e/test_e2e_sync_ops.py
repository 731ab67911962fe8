"""`rsnotify sync` as an operator runs it, with real processes (`rsnotify source`, `rsnotify hub`,
`rsnotify sync`, `rsnotify audit`): audits while it runs, stops at any phase, a folder it cannot
write, a Source that is down at the first start, and the poll that must not apply the same
changes again."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e import test_e2e_sync as base
from tests.e2e.test_e2e_sync import (
    RSNOTIFY,
    answers,
    spawn,
    tree,
    wait_until,
    write_files,
)
from tests.support.ports import free_port

hub = base.hub       # one `rsnotify hub` for this module too
site = base.site


def status(s: base.Site) -> dict:
    return json.loads(s.run("sync", "status", "--dir", str(s.dest), "--json").stdout)


def audit(s: base.Site, *args: str) -> subprocess.CompletedProcess:
    return s.run("audit", "--capability-list", s.caplist, "--dir", str(s.dest), *args)


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "is not in deque" not in text, text[-3000:]


def test_audit_while_sync_runs_then_damage_then_repair_by_the_running_sync(site):
    s = site(120)
    live = s.live("live")
    wait_until(s.equal, "the baseline", 60, live)
    result = audit(s, "--deep")
    assert result.returncode == 0, result.stderr
    assert "same 120" in result.stderr and "read-only" in result.stderr
    # local damage: one edited, one deleted
    (s.copy / "d1" / "r1.txt").write_bytes(b"edited by hand")
    (s.copy / "d2" / "r2.txt").unlink()
    result = audit(s, "--deep")
    assert result.returncode == 1, result.stderr
    assert "missing 1" in result.stderr and "corrupt 1" in result.stderr
    result = audit(s, "--deep", "--repair")
    assert result.returncode == 0, result.stderr
    assert "asked it to audit and repair" in result.stderr and "repaired 2" in result.stderr
    assert s.equal()
    assert live.process.poll() is None            # the live sync kept running
    done = [e for e in live.events() if e["event"] == "audit.done"]
    assert done and done[-1]["trigger"] == "request" and done[-1]["repaired"] == 2
    # it still applies live changes afterwards
    (s.src / "after-audit.txt").write_bytes(b"still live")
    wait_until(s.equal, "a live change after the audit", 30, live)
    info = status(s)
    assert info["last_audit"]["outcome"] == "in sync"
    assert info["lag_seconds"] == 0.0, info      # measured on the Source's clock: an idle Source, no lag
    assert live.stop(signal.SIGTERM) == 0


def test_audit_every_runs_audits_in_the_live_process(site):
    s = site(30)
    live = s.sync("--listen", f"127.0.0.1:{s.sync_port}", "--audit-every", "1s", name="every")
    wait_until(lambda: len([e for e in live.events() if e["event"] == "audit.done"]) >= 2,
               "two periodic audits", 60, live)
    done = [e for e in live.events() if e["event"] == "audit.done"]
    assert all(e["trigger"] == "every" and e["in_sync"] for e in done[:2]), done
    assert status(s)["last_audit"]["counts"]["same"] == 30
    assert live.stop(signal.SIGINT) == 0
    bad = s.run("sync", "--capability-list", s.caplist, "--dir", str(s.dest), "--audit-every", "soon")
    assert bad.returncode == 2 and "--audit-every" in bad.stderr


def test_one_sigint_during_the_baseline_stops_within_2s_and_the_next_start_resumes(site):
    s = site(1500)
    first = s.sync("--once", "--concurrency", "1", name="first")
    wait_until(lambda: s.copy.exists() and sum(1 for _ in s.copy.rglob("*.txt")) >= 50,
               "the baseline to be under way", 60, first)
    first.process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    first.process.wait(10)
    took = time.monotonic() - sent
    print(f"one SIGINT during the baseline: exited {took:.2f} s after it")
    assert took < 2.0, f"stopped after {took:.2f} s"
    assert first.process.returncode == 1        # --once interrupted: not in sync
    no_traceback(first.output())
    assert "the state is saved" in first.output()
    copied = sum(1 for _ in s.copy.rglob("*.txt"))
    assert copied < 1500
    # the next start resumes: what was fetched is not fetched again
    again = s.run("sync", "--capability-list", s.caplist, "--dir", str(s.dest), "--once", "--json")
    assert again.returncode == 0, again.stderr
    [done] = [json.loads(line) for line in again.stdout.splitlines() if '"baseline.done"' in line]
    assert done["fetched"] <= 1500 - copied + 16 and done["unchanged"] >= copied - 16, (done, copied)
    assert s.equal()


def test_a_second_sigint_stops_at_once_without_tracebacks(site):
    s = site(600)
    proc = s.sync("--listen", f"127.0.0.1:{s.sync_port}", "--concurrency", "1", name="twice")
    wait_until(lambda: s.copy.exists() and sum(1 for _ in s.copy.rglob("*.txt")) >= 20,
               "the baseline to be under way", 60, proc)
    proc.process.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    proc.process.wait(10)
    took = time.monotonic() - sent
    print(f"second SIGINT: exited {took:.2f} s after it")
    assert took < 2.0
    no_traceback(proc.output())
    assert "stopping at once" in proc.output()
    assert status(s)["state"] in ("baselining", "new")       # the state database is readable


@pytest.fixture
def mount_point(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """A small tmpfs (root only; the test is skipped elsewhere), unmounted afterwards."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


def test_a_read_only_dir_is_one_line_and_exit_1_and_the_state_stays_intact(site, mount_point):
    s = site(20)
    dest = mount_point("size=4m")
    result = s.run("sync", "--capability-list", s.caplist, "--dir", str(dest), "--once")
    assert result.returncode == 0, result.stderr
    subprocess.run(["mount", "-o", "remount,ro", str(dest)], check=True)
    write_files(s.src, range(100, 105), tag="new")
    time.sleep(0.5)
    result = s.run("sync", "--capability-list", s.caplist, "--dir", str(dest), "--once")
    assert result.returncode == 1
    no_traceback(result.stderr)
    problem = [line for line in result.stderr.splitlines() if "cannot" in line]
    assert len(problem) == 1 and str(dest) in problem[0] and "read-only" in problem[0].lower(), result.stderr
    subprocess.run(["mount", "-o", "remount,rw", str(dest)], check=True)
    result = s.run("sync", "--capability-list", s.caplist, "--dir", str(dest), "--once")
    assert result.returncode == 0, result.stderr
    host = s.base.split("//", 1)[1].split("/", 1)[0].replace(":", "_")
    assert tree(s.src) == tree(dest / host / "dataset1")


def listed(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()
    except OSError:
        return ""


def test_a_full_disk_is_one_line_and_exit_1(site, mount_point):
    s = site(10)
    (s.src / "big.bin").write_bytes(os.urandom(3_000_000))
    wait_until(lambda: 'length="3000000"' in listed(s.base + "resourcelist.xml"), "the Source to list big.bin", 30,
               s.proc)
    dest = mount_point("size=2m")
    result = s.run("sync", "--capability-list", s.caplist, "--dir", str(dest), "--once")
    assert result.returncode == 1
    no_traceback(result.stderr)
    # each resource that does not fit fails alone (big.bin, and those written while its partial
    # file filled the disk), one line per try; the others are stored, and all are in the state
    lines = result.stderr.splitlines()
    problem = [line for line in lines if "cannot" in line and "held back" not in line and "held-back" not in line]
    assert any("big.bin" in line for line in problem), result.stderr
    assert all(line.startswith("rsnotify sync: failed: ") and str(dest) in line and "disk is full" in line
               for line in problem), result.stderr
    # before exiting, the held-back ones got a last try (a probe: the disk still refuses big.bin),
    # then one line names how many are still held back and the first of them
    [held] = [line for line in lines if "held back by the local disk" in line]
    assert held.startswith("rsnotify sync: ") and " change(s) held back by the local disk after a last try; first: " \
        "cannot write " in held and "big.bin: No space left on device (the disk is full)" in held, held
    info = json.loads(s.run("sync", "status", "--dir", str(dest), "--json").stdout)
    assert info["resources"].get("failed", 0) >= 1 and sum(info["resources"].values()) == 11, info
    assert any(item["loc"].endswith("/big.bin") for item in info["troubled"]), info


def test_a_fresh_live_sync_waits_for_a_source_that_is_down_at_start(hub, tmp_path):
    port = free_port()
    caplist = f"http://127.0.0.1:{port}/dataset1/capabilitylist.xml"
    once = subprocess.run([RSNOTIFY, "sync", "--capability-list", caplist, "--dir", str(tmp_path / "d1"), "--once"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert once.returncode == 3 and "cannot be reached" in once.stderr
    live = spawn(["sync", "--capability-list", caplist, "--dir", str(tmp_path / "dest"), "--json",
                  "--listen", f"127.0.0.1:{free_port()}"], tmp_path / "live.log", tmp_path / "live.jsonl")
    wait_until(lambda: "retrying in" in live.output(), "the first retry", 30, live)
    src = tmp_path / "src"
    src.mkdir()
    write_files(src, range(10))
    source = spawn(["source", "--dir", str(src), "--base-url", f"http://127.0.0.1:{port}/dataset1/", "--hub", hub,
                    "--db", str(tmp_path / "source.db")], tmp_path / "source.log")
    try:
        wait_until(lambda: answers(caplist), "the Source to answer", 60, source)
        copy = tmp_path / "dest" / f"127.0.0.1_{port}" / "dataset1"
        wait_until(lambda: copy.exists() and tree(src) == tree(copy), "the copy after the Source came up", 60, live)
        wait_until(lambda: any(e["event"] == "live" for e in live.events()), "live", 30, live)
        assert live.stop(signal.SIGTERM) == 0
        no_traceback(live.output())
    finally:
        live.stop()
        source.stop()


def test_source_with_a_path_is_found_and_a_404_is_not_found_not_unreachable(site):
    s = site(15)
    result = s.run("sync", "--source", s.base, "--dir", str(s.dest), "--once")
    assert result.returncode == 0, result.stderr
    assert s.equal()
    nope = s.base.replace("/dataset1/", "/nope/")
    result = s.run("sync", "--source", nope, "--dir", str(s.tmp / "other"), "--once")
    assert result.returncode == 1, result.stderr
    assert "not found at" in result.stderr and "cannot be reached" not in result.stderr
    gone = f"http://127.0.0.1:{free_port()}/dataset1/"
    result = s.run("sync", "--source", gone, "--dir", str(s.tmp / "third"), "--once")
    assert result.returncode == 3 and "cannot be reached" in result.stderr


def test_the_poll_does_not_apply_the_same_changes_again(site):
    s = site(20)
    live = s.sync("--listen", f"127.0.0.1:{s.sync_port}", "--poll-interval", "1", name="poll")
    wait_until(s.equal, "the baseline", 60, live)
    (s.src / "d1" / "r1.txt").write_bytes(b"changed once")
    (s.src / "d2" / "r2.txt").unlink()
    wait_until(s.equal, "the live changes", 30, live)

    def polls() -> list[dict]:
        return [e for e in live.events() if e["event"] == "catchup.done" and e["reason"] == "poll"]

    seen = len(polls())
    wait_until(lambda: len(polls()) >= seen + 3, "three polls", 30, live)
    for done in polls()[seen:]:
        assert done["changes"] == 0 and done["fetched"] == 0 and done["deleted"] == 0, done
    assert live.stop(signal.SIGTERM) == 0

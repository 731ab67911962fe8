"""`rsnotify sync` keeps a folder equal to a Source, with real processes: `rsnotify source` over
a folder, `rsnotify hub` (embedded Redis, its own worker, two delivery attempts so a stopped
Destination's notifications become dead letters quickly), and `rsnotify sync` itself, killed
with SIGKILL and restarted like a crashed service."""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rsnotify.lists import open_list
from rsnotify.xml import parse_notification
from tests.support.ports import free_port

RSNOTIFY = str(Path(sys.executable).with_name("rsnotify"))


@dataclass
class Proc:
    process: subprocess.Popen
    log: Path
    out: Path | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def events(self) -> list[dict]:
        if self.out is None or not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0, *procs: Proc) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            if proc.process.poll() is not None:
                raise AssertionError(f"{what}: a process exited with {proc.process.returncode}:\n{proc.output()}")
        if time.monotonic() > deadline:
            logs = "\n---\n".join(p.output()[-3000:] for p in procs)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.1)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def spawn(args: list[str], log: Path, out: Path | None = None, cwd: Path | None = None) -> Proc:
    with log.open("ab") as err:
        stdout = out.open("ab") if out is not None else err
        try:
            process = subprocess.Popen([RSNOTIFY, *args], stdout=stdout, stderr=err, cwd=cwd)
        finally:
            if out is not None:
                stdout.close()
    return Proc(process, log, out)


def serve_folder(hub: str, tmp_path: Path, fill: Callable[[Path], None]) -> tuple[Path, Path, int, str, Proc]:
    """tmp_path/src filled by `fill` and served at the root of a free port by `rsnotify source`
    (started, not yet answering): (src, the copy's --dir, the port, the base URL, the Source)."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    fill(src)
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    source = spawn(["source", "--dir", str(src), "--base-url", base, "--hub", hub, "--db", str(tmp_path / "source.db")],
                   tmp_path / "source.log")
    return src, dest, port, base, source


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `rsnotify hub` for the module: retries after 0.2 s, dead letter after 2 attempts."""
    folder = tmp_path_factory.mktemp("hub")
    port = free_port()
    proc = spawn(["hub", "--port", str(port), "--data-dir", str(folder / "data"), "--workers", "1",
                  "--retry-base", "0.2", "--retry-cap", "1", "--max-attempts", "2"], folder / "hub.log", cwd=folder)
    url = f"http://127.0.0.1:{port}/"
    wait_until(lambda: answers(url + "health"), "the hub to answer", 60, proc)
    yield url
    proc.stop()


@dataclass
class Site:
    """A running `rsnotify source` over `src`, and where `rsnotify sync` puts its copy."""

    src: Path
    dest: Path
    caplist: str
    base: str
    proc: Proc
    tmp: Path
    sync_port: int

    @property
    def copy(self) -> Path:
        host = self.base.split("//", 1)[1].split("/", 1)[0].replace(":", "_")
        return self.dest / host / "dataset1"

    def equal(self) -> bool:
        return tree(self.src) == tree(self.copy)

    def sync(self, *args: str, name: str = "sync") -> Proc:
        return spawn(["sync", "--capability-list", self.caplist, "--dir", str(self.dest), "--json", *args],
                     self.tmp / f"{name}.log", self.tmp / f"{name}.jsonl")

    def live(self, name: str) -> Proc:
        proc = self.sync("--listen", f"127.0.0.1:{self.sync_port}", "--poll-interval", "2", name=name)
        wait_until(lambda: any(e["event"] == "live" for e in proc.events()), "sync to go live", 60, proc, self.proc)
        return proc

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([RSNOTIFY, *args], check=False, capture_output=True, text=True, timeout=120)


def write_files(src: Path, names: range, size: int = 700, tag: str = "v1") -> None:
    for i in names:
        path = src / f"d{i % 7}" / f"r{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes((f"{tag} {i} ".encode() * (size // 8 + 1))[:size])


@pytest.fixture
def site(hub: str, tmp_path: Path) -> Iterator[Callable[..., Site]]:
    started: list[Site] = []

    def start(files: int = 200, *extra: str) -> Site:
        src = tmp_path / "src"
        src.mkdir()
        write_files(src, range(files))
        port = free_port()
        base = f"http://127.0.0.1:{port}/dataset1/"
        proc = spawn(["source", "--dir", str(src), "--base-url", base, "--hub", hub, "--db",
                      str(tmp_path / "source.db"), *extra], tmp_path / "source.log")
        caplist = base + "capabilitylist.xml"
        wait_until(lambda: answers(caplist), "the Source to answer", 60, proc)
        made = Site(src, tmp_path / "dest", caplist, base, proc, tmp_path, free_port())
        started.append(made)
        return made

    yield start
    for made in started:
        made.proc.stop()


def change_while_down(src: Path, count: int) -> set[str]:
    """60% updates, 20% creations, 20% deletions; returns the deleted relative paths."""
    files = sorted(p for p in src.rglob("*.txt"))
    updates, deletes = files[: count * 3 // 5], files[count * 3 // 5: count * 4 // 5]
    for path in updates:
        path.write_bytes(b"updated while the Destination was down: " + path.name.encode())
    for path in deletes:
        path.unlink()
    write_files(src, range(10_000, 10_000 + count // 5), tag="new")
    return {p.relative_to(src).as_posix() for p in deletes}


def test_fresh_baseline_is_byte_equal_and_audit_agrees(site):
    s = site(300)
    result = s.run("sync", "--capability-list", s.caplist, "--dir", str(s.dest), "--once", "--json")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    [done] = [e for e in events if e["event"] == "baseline.done"]
    assert done["fetched"] == 300 and done["failed"] == 0
    assert s.equal()
    audit = s.run("audit", "--capability-list", s.caplist, "--dir", str(s.dest), "--deep")
    assert audit.returncode == 0, audit.stderr
    assert "same 300" in audit.stderr and "missing 0" in audit.stderr
    # a second --once has nothing to fetch
    again = s.run("sync", "--capability-list", s.caplist, "--dir", str(s.dest), "--once", "--json")
    assert again.returncode == 0
    status = json.loads(s.run("sync", "status", "--dir", str(s.dest), "--json").stdout)
    assert status["resources"] == {"ok": 300} and status["high_water"]


def carries(site: Site, path: str, name: str, change: str) -> bool:
    """Does the Source's document at `path` (its Change List; or its topic URL, which shows the
    latest notification a hub accepted) carry this change of this file?"""
    try:
        with urllib.request.urlopen(site.base + path, timeout=5) as response:
            body = response.read()
    except OSError:
        return False
    entries = open_list(io.BytesIO(body)) if path != "changes" else parse_notification(body).changes
    return any(entry.loc == site.base + name and entry.change.value == change for entry in entries)


def nothing_left_to_deliver(hub: str) -> bool:
    """Every subscription of the hub has no notification left to deliver (each was delivered or
    became a dead letter), going by its admin API (loopback needs no token)."""
    with urllib.request.urlopen(hub + "admin/subscriptions", timeout=5) as response:
        subscriptions = json.load(response)["subscriptions"]
    return bool(subscriptions) and all(sub["backlog"] == 0 for sub in subscriptions)


def test_sigkill_then_500_changes_and_create_then_delete_then_restart_is_equal(site, hub):
    s = site(600)
    first = s.live("sync1")
    wait_until(s.equal, "the baseline", 60, first)
    (s.src / "live.txt").write_bytes(b"published while live")
    wait_until(s.equal, "the live change", 30, first)
    # the file lands before its batch's record and event: the event follows within moments
    wait_until(lambda: any(e["event"] == "notification.applied" for e in first.events()),
               "the notification.applied event", 10, first)

    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    deleted = change_while_down(s.src, 500)
    (s.src / "brief.txt").write_bytes(b"created, then deleted while down")
    # the Source records (and so publishes) the creation before the deletion
    wait_until(lambda: carries(s, "changelist.xml", "brief.txt", "created"), "the creation recorded", 30, s.proc)
    (s.src / "brief.txt").unlink()
    # the deletion is the last change: the latest notification the hub accepted (the topic URL)
    wait_until(lambda: carries(s, "changes", "brief.txt", "deleted"), "the deletion accepted", 30, s.proc)
    # the hub gives up on the stopped Destination (two attempts: dead letters)
    wait_until(lambda: nothing_left_to_deliver(hub), "the hub's dead letters", 30, s.proc)

    second = s.live("sync2")
    wait_until(s.equal, "equal after the restart", 30, second)
    assert not (s.copy / "brief.txt").exists()
    assert all(not (s.copy / path).exists() for path in deleted)
    [catchup] = [e for e in second.events() if e["event"] == "catchup.done"]
    assert catchup["reason"] == "start" and catchup["changes"] >= 500
    status = json.loads(s.run("sync", "status", "--dir", str(s.dest), "--json").stdout)
    assert set(status["resources"]) <= {"ok", "deleted"}, status["resources"]

    # the next notification comes after the dead letters: a hub that replays them (rsnotify's
    # honours rsnotify.replay_from) delivers them again, already covered by the catch-up; one
    # that does not shows a jump in the sequence, which is reported. Nothing is lost either way.
    (s.src / "after.txt").write_bytes(b"after the restart")
    wait_until(s.equal, "the next live change", 30, second)
    events = second.events()
    status = json.loads(s.run("sync", "status", "--dir", str(s.dest), "--json").stdout)
    replayed = status["inbox"].get("covered", 0) > 0
    assert replayed or any(e["event"] == "gap" and e["kind"] == "sequence" for e in events), (status, events)
    assert second.stop(signal.SIGTERM) == 0
    audit = s.run("audit", "--capability-list", s.caplist, "--dir", str(s.dest), "--deep")
    assert audit.returncode == 0, audit.stderr


def test_rotated_and_expired_change_lists_lead_to_a_rebaseline(site):
    # lists rotate every 0.3 s and closed ones are dropped after ~1 s
    s = site(100, "--rotate", "0.3", "--keep", str(1.0 / 86_400))
    first = s.live("sync1")
    wait_until(s.equal, "the baseline", 60, first)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    for round_ in range(4):
        write_files(s.src, range(round_ * 10, round_ * 10 + 10), tag=f"round{round_}")
        time.sleep(0.8)
    second = s.live("sync2")
    wait_until(s.equal, "equal after the restart", 30, second)
    events = second.events()
    assert any(e["event"] == "catchup.impossible" for e in events), events
    [rebaseline] = [e for e in events if e["event"] == "baseline.done" and e["phase"] == "re-baseline"]
    assert rebaseline["fetched"] <= 40 and rebaseline["unchanged"] >= 60
    assert second.stop(signal.SIGTERM) == 0

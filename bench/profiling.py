"""--profile DIR: py-spy records the hub's web process and its workers during the measured part
of fan-out runs (collapsed stacks, `--format raw`), and a top-functions digest of each file.

py-spy must be installed (`.venv/bin/pip install py-spy`); it samples without pausing the
process (--nonblocking), so the figures of a profiled run stay close to an unprofiled one.
"""
from __future__ import annotations

import collections
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from .hubproc import HubProcess

RATE = 250  # samples per second


class Profiler:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.recorders: list[tuple[subprocess.Popen, Path]] = []
        self.count = 0
        spy = Path(sys.executable).parent / "py-spy"
        self.py_spy = str(spy) if spy.exists() else shutil.which("py-spy")
        if self.py_spy is None:
            raise RuntimeError("--profile needs py-spy: .venv/bin/pip install py-spy")

    def start(self, scenario: str, hub: HubProcess) -> None:
        self.count += 1
        targets = {"hub": [hub.pid] if hub.pid else [], **{k: v for k, v in hub.child_pids().items() if k == "worker"}}
        for role, pids in targets.items():
            for pid in pids:
                out = self.folder / f"{scenario}-{self.count}-{role}-{pid}.txt"
                process = subprocess.Popen([self.py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate",
                                            str(RATE), "--nonblocking", "--output", str(out)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                self.recorders.append((process, out))

    def stop(self) -> None:
        for process, out in self.recorders:
            process.send_signal(signal.SIGINT)
        for process, out in self.recorders:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if out.exists():
                (out.parent / (out.stem + ".top.txt")).write_text(digest(out))
        self.recorders = []


def digest(raw: Path, top: int = 40) -> str:
    """Top functions of a collapsed-stacks file by self samples and by inclusive samples."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{raw.name}: {total} samples", "", "self:"]
    lines += [f"{100 * n / total:6.2f}%  {frame}" for frame, n in own.most_common(top)]
    lines += ["", "inclusive:"]
    lines += [f"{100 * n / total:6.2f}%  {frame}" for frame, n in inclusive.most_common(top)]
    return "\n".join(lines) + "\n"

"""CPU seconds used by the processes of a run, by role (hub web process, workers, Redis, sinks,
the benchmark itself), read from /proc: where the two cores went."""
from __future__ import annotations

import os

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (0: this process), in seconds; 0.0 once it is gone."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuMeter:
    """Started at construction; `done()` gives the CPU seconds each role used since."""

    def __init__(self, roles: dict[str, list[int]]) -> None:
        self.roles = roles
        self.start = {pid: cpu_seconds(pid) for pids in roles.values() for pid in pids}

    def done(self) -> dict[str, float]:
        return {role: round(sum(cpu_seconds(p) - self.start[p] for p in pids), 2)
                for role, pids in self.roles.items() if pids}

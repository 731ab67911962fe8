"""`free_port`: a loopback TCP port nothing listens on, for a server a test starts next.

The suite runs in several xdist workers at once, and a port is free only until its server binds
it. So each worker picks from a block of ports of its own (PYTEST_XDIST_WORKER, inherited by the
processes a test starts), below the kernel's ephemeral range (Linux: 32768-60999, macOS from
49152), where bind(0) and every outgoing connection take their local ports: a port picked here
cannot be taken meanwhile by another worker's free_port, nor by some connection's local end."""
from __future__ import annotations

import collections
import os
import random
import socket

FIRST, LAST = 20000, 32767      # the ports every worker's block comes from
TRIES = 200
# Ports handed out lately in this process, skipped by the next picks: a test often takes several
# ports before it starts any server (a Sentinel group takes six), and a port nothing binds yet
# would pass the probe again, so two of its servers could be given the same one.
RECENT = collections.deque[int](maxlen=256)


def worker_block(worker: str | None = None, count: str | None = None) -> range:
    """This process's block: the xdist worker "gwN" of COUNT gets the N-th of COUNT equal blocks;
    a run without workers gets all of them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "") if worker is None else worker
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") if count is None else count
    total, number = max(1, int(count)), int(worker[2:]) if worker.startswith("gw") else 0
    size = (LAST - FIRST + 1) // total
    start = FIRST + (number % total) * size
    return range(start, start + size)


def free_port() -> int:
    """A port of this worker's block that nothing is bound to on 127.0.0.1 right now."""
    block = worker_block()
    for port in random.sample(block, min(TRIES, len(block))):
        if port in RECENT:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        RECENT.append(port)
        return port
    raise RuntimeError(f"no free loopback port among {TRIES} tried in {block.start}-{block.stop - 1}")


__all__ = ["free_port"]

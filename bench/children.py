"""Benchmark helpers run as child processes (`python -m bench.<module>`): start one, wait for the
line that says where it listens, stop it; and, in the child, serve an aiohttp app."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")

START_TIMEOUT = 20.0
# The repository root, so `-m bench.<module>` resolves whatever the caller's working folder.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def listen(app: web.Application, host: str, port: int = 0, **runner_options: Any) -> int:
    """Serve `app` on host:port (0: a free one) until the process ends; returns the port."""
    runner = web.AppRunner(app, access_log=None, **runner_options)
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=4096).start()
    return int(runner.addresses[0][1])


def start_child(module: str, host: str, ready_line: str, parse: Callable[[str], T],
                what: str, args: tuple[str, ...] = ()) -> tuple[subprocess.Popen[str], T]:
    """Start `python -m <module> --host <host> [args]` and wait for its line starting with `ready_line`;
    `parse` reads the rest of that line. Raises RuntimeError naming `what` if no such line comes
    within START_TIMEOUT seconds (the child is stopped first)."""
    process = subprocess.Popen([sys.executable, "-m", module, "--host", host, *args],
                               stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=_ROOT)
    found: list[T] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith(ready_line):
                found.append(parse(line[len(ready_line):]))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(START_TIMEOUT)
    if not found:
        stop_child(process)
        raise RuntimeError(f"the {what} did not start within {START_TIMEOUT:.0f}s")
    return process, found[0]


def stop_child(process: subprocess.Popen[str]) -> None:
    """Terminate the child if it still runs; kill it if it does not end within 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

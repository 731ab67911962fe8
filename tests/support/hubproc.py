"""`rsnotify hub` as a real process: on a free port, with its own data dir (embedded Redis) or a
given --redis-url, ready once GET /health answers 200 (Redis reachable, a worker seen when it
runs workers), stopped by its PID. Its stdout and stderr go to a log file a test can read."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis as redis_lib

from . import cli
from .http import http
from .ports import free_port

START_TIMEOUT = 60.0    # a loaded 2-core machine starts Redis, the web process and workers slowly
READY_LINE = "Press Ctrl-C to stop"     # the last line of the hub's banner: what it says is all there


@dataclass
class HubProcess:
    """A running `rsnotify hub`: `url` is its hub URL, `log` its output, `args` its command line."""

    process: subprocess.Popen
    url: str
    port: int
    log: Path
    args: list[str]
    data_dir: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_output(self, pattern: str, timeout: float = 30.0, since: int = 0) -> re.Match[str]:
        """Until a line of the log matches `pattern` (a regex); the match. `since`: look only past
        that many characters (len(output()) taken earlier), for a hub several tests share."""
        deadline = time.monotonic() + timeout
        while True:
            if found := re.compile(pattern).search(self.output(), since):
                return found
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"{pattern!r} not in the hub's output:\n{self.output()[-5000:]}")
            time.sleep(0.05)

    def health(self) -> tuple[int, dict[str, Any]]:
        """GET /health: (status, JSON body); (0, {}) when nothing answers."""
        status, body = http("GET", self.url + "health", timeout=5)
        try:
            return status, json.loads(body)
        except ValueError:
            return status, {}

    def stop(self, signum: int = signal.SIGINT, timeout: float = 30.0) -> int:
        """Ctrl-C (or `signum`), as a user would: the hub stops its workers and Redis itself;
        killed if it is still there after `timeout`. Returns the exit status."""
        return cli.stop(self.process, signum, timeout)

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when the machine loses the process."""
        self.process.kill()
        self.process.wait()


def start_hub(workdir: Path, *args: str, data_dir: Path | None = None, redis_url: str | None = None,
              workers: int | None = None, port: int | None = None, env: cli.Env | None = None,
              timeout: float = START_TIMEOUT) -> HubProcess:
    """Start `rsnotify hub --port PORT --data-dir DATA [--redis-url URL] [--workers N] ARGS` and
    wait until GET /health answers 200 and the banner is out. The log is WORKDIR/hub-PORT.log; DATA defaults to
    WORKDIR/data (short paths: the embedded Redis's socket lives there)."""
    port = port or free_port()
    data_dir = data_dir or workdir / "data"
    argv = ["hub", "--port", str(port), "--data-dir", str(data_dir)]
    if redis_url is not None:
        argv += ["--redis-url", redis_url]
    if workers is not None:
        argv += ["--workers", str(workers)]
    argv += args
    log = workdir / f"hub-{port}.log"
    process = cli.start(*argv, log=log, env=env, cwd=workdir)
    hub = HubProcess(process, f"http://127.0.0.1:{port}/", port, log, [cli.RSNOTIFY, *argv], data_dir)
    deadline = time.monotonic() + timeout
    while (status := hub.health()[0]) != 200:
        if process.poll() is not None:
            raise AssertionError(f"rsnotify hub exited with {process.returncode}:\n{hub.output()[-5000:]}")
        if time.monotonic() > deadline:
            hub.stop()
            raise AssertionError(f"rsnotify hub never answered /health with 200 (last: {status}):\n"
                                 f"{hub.output()[-5000:]}")
        time.sleep(0.1)
    hub.wait_for_output(READY_LINE, timeout)
    return hub


def start_hub_on_emptied_redis(workdir: Path, redis_url: str, *args: str, **options: Any) -> HubProcess:
    """`start_hub` on a shared Redis emptied first, for a hub one test module shares: a hub refuses
    a Redis holding secrets under another hub's generated key, and earlier modules' queued jobs
    would run on its workers."""
    client = redis_lib.Redis.from_url(redis_url)
    try:
        client.flushall()
    finally:
        client.close()
    return start_hub(workdir, *args, redis_url=redis_url, **options)

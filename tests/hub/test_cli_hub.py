"""`rsnotify hub` and `rsnotify worker` as a user runs them: options and variables with CliRunner,
then the real command as a subprocess (embedded Redis, restart on the same data dir, clean stop)."""
from __future__ import annotations

import gc
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest
import redis as redis_lib
from redis.backoff import NoBackoff
from redis.retry import Retry

from rsnotify.hub import keys, records, store
from rsnotify.hub.embedded import stop_stale_redis
from rsnotify.hub.redis_server import SERVER_NAMES, start_redis_server
from rsnotify.hub.settings import HubSettings, env_name
from tests.support import cli
from tests.support.http import http
from tests.support.hubproc import HubProcess, start_hub
from tests.support.ports import free_port
from tests.support.waiting import wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTIFICATION = (FIXTURES / "change-notification-1.0.1" / "notification_ex_1.xml").read_bytes()
TOPIC = "http://publisher.example/dataset1/change/"


# --- options ------------------------------------------------------------------------------


def test_hub_help_documents_every_option_with_its_variable():
    result = cli.invoke("hub", "--help", terminal_width=200)
    assert result.exit_code == 0
    for option in ("--host", "--port", "--public-url", "--redis-url", "--data-dir", "--workers", "--lease-default",
                   "--lease-min", "--lease-max", "--max-body", "--publish-token", "--tokens-file", "--allow-network",
                   "--secret-key", "--log-level"):
        assert option in result.output, option
    for f in fields(HubSettings):
        assert env_name(f.name) in result.output, f.name
    assert "RSNOTIFY_PUBLISH_TOKEN" in result.output and "RSNOTIFY_ALLOW_NETWORK" in result.output


def test_worker_help_lists_only_worker_options():
    result = cli.invoke("worker", "--help", terminal_width=200)
    assert result.exit_code == 0
    for option in ("--redis-url", "--burst", "--queues", "--concurrency", "--name", "--public-url",
                   "--delivery-timeout", "--max-attempts"):
        assert option in result.output
    for web_only in ("--workers", "--host", "--port", "--max-body", "--tokens-file", "--publish-token",
                     "--admin-token", "--lease-min"):
        assert f"{web_only} " not in result.output, web_only
    assert "runs its own" not in result.output     # the hub's --redis-url help, not a worker's


def test_help_shows_essential_options_before_tuning_and_choices():
    for command, first, tuned in (("hub", "--public-url", "--retry-base"), ("worker", "--redis-url", "--lock-ttl")):
        text = cli.invoke(command, "--help", terminal_width=200).output
        essential, tuning = text.index("Essential options:"), text.index("Tuning options:")
        assert essential < text.index(first) < tuning < text.index(tuned)
        assert "[sha1|sha256|sha384|sha512]" in text and "[text|json]" in text


def test_a_worker_still_reads_web_settings_from_the_environment():
    """The embedded hub hands its whole settings to its child workers as RSNOTIFY_* variables."""
    result = cli.invoke("worker", "--redis-url", "redis://127.0.0.1:1/0", "--burst",
                        env={"RSNOTIFY_HOST": "0.0.0.0", "RSNOTIFY_MAX_BODY": "1000"})
    assert result.exit_code == 2 and "--public-url" in result.output    # RSNOTIFY_HOST was read


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--host", "::"],
                                  ["--public-url", "http://0.0.0.0:8080/"], ["--public-url", "http://[::]:8080/"]])
def test_a_public_url_on_every_address_is_refused(args):
    for command in ("hub", "worker"):
        result = cli.invoke(command, "--redis-url", "redis://127.0.0.1:1/0", *args)
        assert result.exit_code == 2, result.output
        assert "--public-url" in result.output and "Traceback" not in result.output
    ok = cli.invoke("hub", "--host", "0.0.0.0", "--public-url", "https://hub.example.org/", "--help")
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
    result = cli.invoke("hub", *args, env=env)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_the_token_itself_never_shows_in_an_error():
    result = cli.invoke("hub", "--publish-token", "sup3rs3cret=ftp://x/")
    assert result.exit_code == 2 and "sup3rs3cret" not in result.output


def test_unreadable_tokens_file_is_a_clear_error(tmp_path, redis_url):
    result = cli.invoke("hub", "--redis-url", redis_url, "--workers", "0", "--port", "0",
                        "--data-dir", str(tmp_path), "--tokens-file", str(tmp_path / "missing"))
    assert result.exit_code == 1
    assert "cannot read tokens file" in result.output and "Traceback" not in result.output


def test_worker_without_redis_url_is_a_usage_error():
    result = cli.invoke("worker", env={"RSNOTIFY_REDIS_URL": ""})
    assert result.exit_code == 2 and "needs --redis-url" in result.output


def test_unreachable_redis_is_a_clear_error(tmp_path):
    port = free_port()
    gc.disable()        # the port is let go by the hub, not by the garbage collector later
    try:
        result = cli.invoke("hub", "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--workers", "0",
                            "--port", str(port), "--data-dir", str(tmp_path))
        assert result.exit_code == 1
        assert "Redis" in result.output and "Traceback" not in result.output
        with socket.socket() as again:      # nothing listens on the hub's port any more
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", port))
            again.listen(1)
    finally:
        gc.enable()


# --- the real command -----------------------------------------------------------------------


def submit(hub_process: HubProcess) -> tuple[int, bytes]:
    return http("POST", hub_process.url, NOTIFICATION, {"Content-Type": "application/xml",
                                                        "Link": f'<{TOPIC}>; rel="self", <{hub_process.url}>; rel="hub"'})


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


def test_hub_runs_embedded_and_restarts_with_its_data(tmp_path, data_dir):
    first = start_hub(tmp_path, data_dir=data_dir, workers=0)
    try:
        status, body = http("GET", first.url + "health")
        assert status == 200 and b'"redis": true' in body
        assert str(data_dir) in first.output()  # says where its data lives
        assert submit(first)[0] == 200
        form = (f"hub.mode=subscribe&hub.topic={TOPIC}&hub.callback=http://127.0.0.1:9/cb&hub.secret=abc").encode()
        status, _ = http("POST", first.url, form, {"Content-Type": "application/x-www-form-urlencoded"})
        assert status == 202
        client = redis_lib.Redis(unix_socket_path=str(data_dir / "redis.sock"))
        assert client.config_get("hash-max-ziplist-value")["hash-max-ziplist-value"] == "1024"  # compact hashes
        sid, _ = _activate(client, data_dir)
        client.close()
    finally:
        assert first.stop(signal.SIGINT) == 0
    assert not (data_dir / "redis.sock").exists() or not _answers(data_dir / "redis.sock")
    second = start_hub(tmp_path, data_dir=data_dir, workers=0)
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


@pytest.fixture(scope="module")
def running_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """An embedded hub that the next two tests try to start a second hub beside: on its data dir,
    then on its port. Neither attempt may disturb it, so they share it."""
    workdir = tmp_path_factory.mktemp("running")
    hub = start_hub(workdir, data_dir=workdir / "data", workers=0)
    yield hub
    hub.stop()


def test_two_hubs_cannot_share_a_data_dir(running_hub):
    second = cli.run("hub", "--port", "0", "--workers", "0", "--data-dir", str(running_hub.data_dir), timeout=30)
    assert second.returncode == 1
    assert "another rsnotify hub is using the data dir" in second.stderr
    assert http("GET", running_hub.url + "health")[0] == 200


def test_address_in_use_is_a_clear_error(tmp_path, running_hub):
    port = str(running_hub.port)
    second = cli.run("hub", "--port", port, "--workers", "0", "--data-dir", str(tmp_path / "other"), timeout=30)
    assert second.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in second.stderr
    assert not _answers(tmp_path / "other" / "redis.sock")  # its Redis was stopped again
    assert http("GET", running_hub.url + "health")[0] == 200


def _redis_child(pid: int) -> int:
    """The embedded Redis (redis-server or valkey-server) that process `pid` started."""
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        # "PID (COMM) STATE PPID ...": COMM is the executable's name (Redis rewrites its cmdline)
        name, _, rest = stat.partition(" (")[2].rpartition(")")
        if stat and int(rest.split()[1]) == pid and name in SERVER_NAMES:
            return int(entry.name)
    raise AssertionError(f"process {pid} has no Redis child")


def _is_gone(pid: int) -> bool:
    """Exited (a zombie counts: where nothing reaps orphans, that is all that is left of it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_embedded_redis_stops_with_a_killed_hub_and_keeps_what_was_acknowledged(tmp_path, data_dir):
    first = start_hub(tmp_path, data_dir=data_dir, workers=0)
    try:
        redis_pid = _redis_child(first.pid)
        status, body = submit(first)
        assert status == 200 and b'"sequence": 1' in body
    finally:
        first.kill()  # SIGKILL: the hub runs no cleanup of its own
    try:
        wait_until(lambda: _is_gone(redis_pid), 10, "the killed hub's Redis to stop")
    finally:
        stop_stale_redis(data_dir.resolve())     # should it have outlived the hub, it goes now
    assert not _answers(data_dir / "redis.sock")
    second = start_hub(tmp_path, data_dir=data_dir, workers=0)
    try:
        status, body = submit(second)
        assert status == 200 and b'"sequence": 2' in body   # the acknowledged first one was kept
        client = redis_lib.Redis(unix_socket_path=str(data_dir / "redis.sock"))
        try:
            assert [fields[b"seq"] for _, fields in client.xrange(keys.topic_log_key(keys.topic_id(TOPIC)))] == [
                b"1", b"2"]
        finally:
            client.close()
    finally:
        assert second.stop() == 0


def test_hub_recovers_from_a_redis_left_running_on_its_data_dir(tmp_path, data_dir):
    first = start_hub(tmp_path, data_dir=data_dir, workers=0)
    try:
        assert submit(first)[0] == 200
    finally:
        assert first.stop() == 0
    # a Redis still running on the folder (one that outlived a killed hub where the system
    # cannot tie it to the hub's life): the next hub shuts it down and uses the same data
    left = start_redis_server(data_dir, unix_socket=True, new_session=True)
    try:
        assert _answers(data_dir / "redis.sock")
        second = start_hub(tmp_path, data_dir=data_dir, workers=0)
        try:
            status, body = submit(second)
            assert status == 200 and b'"sequence": 2' in body  # the same data, no second Redis on it
        finally:
            assert second.stop() == 0
        assert not _answers(data_dir / "redis.sock")
        left.process.wait(10)       # the second hub shut it down (waited for here, not left a zombie)
    finally:
        left.stop()


def test_a_stopped_redis_server_leaves_no_descriptor_open(tmp_path):
    def open_files() -> int:
        return len(list(Path("/proc/self/fd").iterdir()))

    # closed by stop(), not by the garbage collector finding the process object unreachable later
    gc.disable()
    try:
        before = open_files()
        for n in range(5):
            start_redis_server(tmp_path / str(n), port=free_port(), unix_socket=False).stop()
        after = open_files()
    finally:
        gc.enable()
    # a margin for what another thread of the run opens or closes meanwhile (one left each)
    assert after - before < 3, f"{after - before} descriptors left open by 5 started and stopped servers"


def test_shared_redis_mode_uses_the_given_url(redis_url, tmp_path):
    hub_process = start_hub(tmp_path, data_dir=tmp_path / "d", redis_url=redis_url, workers=0)
    try:
        assert submit(hub_process)[0] == 200
        assert redis_url in hub_process.output()
    finally:
        assert hub_process.stop() == 0
    assert not (tmp_path / "d" / "redis.sock").exists()


def test_web_processes_on_a_shared_redis_share_a_data_dir_and_key(redis_url, tmp_path):
    shared = {"data_dir": tmp_path / "d", "redis_url": redis_url, "workers": 0}
    first, second = start_hub(tmp_path, **shared), start_hub(tmp_path, **shared)
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
    other = cli.invoke("hub", *args, "--secret-key", Fernet.generate_key().decode())
    assert other.exit_code == 1 and "encrypted with a different secret key" in other.output
    bad = cli.invoke("hub", *args, "--secret-key", "not-a-key")
    assert bad.exit_code == 1 and "is not a Fernet key" in bad.output
    assert "not-a-key" not in bad.output

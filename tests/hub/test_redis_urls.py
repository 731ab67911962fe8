"""--redis-url in every form the hub takes (redis://, rediss://, unix://, redis+sentinel://,
rediss+sentinel://) and its companions: a bad one is one line naming what is wrong and exit 2,
for the web process and the worker alike, before anything starts; a good one reaches Redis."""
from __future__ import annotations

import asyncio

import pytest

from rsnotify.hub import redis_clients
from rsnotify.hub.redis_url import parse_redis_url
from rsnotify.hub.settings import HubSettings
from tests.support import cli

BAD_URLS = [
    ("http://127.0.0.1:6379/0", "must start with redis://, rediss://, unix://, redis+sentinel://"),
    ("redis+sentinel://127.0.0.1:26379", "names no service"),
    ("redis+sentinel:///rsnotify", "names no Sentinel"),
    ("redis+sentinel://127.0.0.1:26379,127.0.0.1:x/rsnotify", "bad address '127.0.0.1:x'"),
    ("redis+sentinel://127.0.0.1:99999/rsnotify", "bad address '127.0.0.1:99999'"),
    ("redis+sentinel://127.0.0.1:26379/rsnotify/zero", "names database 'zero'"),
    ("redis+sentinel://127.0.0.1:26379/rsnotify/0/extra", "a path of 3 parts"),
    ("redis://127.0.0.1:6379/0?ssl_cert_reqs=none", "sets ssl_cert_reqs without TLS"),
    ("rediss://127.0.0.1:6379/0?ssl_cert_reqs=maybe", "ssl_cert_reqs='maybe'"),
    ("redis://127.0.0.1:6379/0?timeout=3", "unknown argument 'timeout'"),
    ("unix://", "names no socket path"),
]


@pytest.mark.parametrize("command", ["hub", "worker"])
@pytest.mark.parametrize(("url", "problem"), BAD_URLS)
def test_a_bad_redis_url_is_one_line_and_exit_2(command: str, url: str, problem: str) -> None:
    result = cli.invoke(command, "--redis-url", url, "--secret-key", "x" * 44)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --redis-url") and problem in lines[0], result.output


def test_a_bad_url_never_shows_its_password() -> None:
    result = cli.invoke("hub", "--redis-url", "redis+sentinel://:hunter2@127.0.0.1:26379")
    assert result.exit_code == 2 and "hunter2" not in result.output and ":***@" in result.output


def test_tls_files_need_a_tls_url_and_exist(tmp_path) -> None:
    result = cli.invoke("worker", "--redis-url", "redis://127.0.0.1:6379/0", "--redis-ca-file", str(tmp_path))
    assert result.exit_code == 2 and "--redis-ca-file needs a rediss://" in result.output
    result = cli.invoke("worker", "--redis-url", "rediss://127.0.0.1:6379/0", "--redis-ca-file",
                        str(tmp_path / "missing.pem"))
    assert result.exit_code == 2 and "is not a readable file" in result.output
    result = cli.invoke("worker", "--redis-url", "rediss://127.0.0.1:6379/0", "--redis-cert-file",
                        str(tmp_path / "missing.pem"))
    assert result.exit_code == 2 and "--redis-cert-file and --redis-key-file go together" in result.output


def test_a_sentinel_url_names_its_sentinels_service_db_and_data_credentials() -> None:
    address = parse_redis_url("rediss+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2,[::1]:26380/hub-redis/3"
                              "?ssl_cert_reqs=none")
    assert address.is_sentinel and address.is_tls
    assert address.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 26380))
    assert (address.service, address.db, address.username, address.password) == ("hub-redis", 3, "app", "s@cret")
    assert "s@cret" not in repr(address) and "s%40cret" not in address.shown


def test_min_replicas_defaults_to_one_on_sentinel_and_zero_on_plain_redis() -> None:
    sentinel = HubSettings.from_env({"RSNOTIFY_REDIS_URL": "redis+sentinel://127.0.0.1:26379/rsnotify",
                                     "RSNOTIFY_SENTINEL_PASSWORD": "s3"})
    assert sentinel.replicas_to_wait_for == 1 and sentinel.sentinel_password == "s3"
    assert "s3" not in repr(sentinel)
    assert HubSettings(redis_url="redis://127.0.0.1:6379/0").replicas_to_wait_for == 0
    chosen = HubSettings.from_env({"RSNOTIFY_REDIS_URL": "redis+sentinel://h/rsnotify", "RSNOTIFY_MIN_REPLICAS": "2"})
    assert chosen.replicas_to_wait_for == 2
    assert HubSettings.from_env({"RSNOTIFY_MIN_REPLICAS": "0",
                                 "RSNOTIFY_REDIS_URL": "redis+sentinel://h/rsnotify"}).replicas_to_wait_for == 0


def test_replica_timeout_must_be_below_redis_timeout() -> None:
    result = cli.invoke("hub", "--redis-url", "redis://127.0.0.1:6379/0", "--redis-timeout", "1",
                        "--replica-timeout", "2")
    assert result.exit_code == 2 and "--replica-timeout must be above 0 and below --redis-timeout" in result.output


def test_every_client_of_a_plain_url_reaches_redis(redis_url: str) -> None:
    """The web process's clients (async and RQ's sync one) and a worker's, from one URL."""
    sync = redis_clients.sync_client(redis_url, 2, command_timeout=True)
    try:
        sync.set("rsnotify:test:url", "1")
    finally:
        sync.close()

    async def read() -> bytes | None:
        client = redis_clients.async_client(redis_url, 2)
        try:
            return await client.get("rsnotify:test:url")
        finally:
            await client.aclose()
    assert asyncio.run(read()) == b"1"

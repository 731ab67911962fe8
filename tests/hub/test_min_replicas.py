"""A publish answered 200 is on at least --min-replicas replicas: with fewer, the hub answers 503
with Retry-After (the notification is stored on the primary, not acknowledged), and the
publisher's retry with the same Idempotency-Key, once a replica holds it, is answered 200 from the
entry already stored: one entry in the topic's log. Real servers: a primary and a replica
attached to it during the test."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib
from cryptography.fernet import Fernet

from rsnotify.hub import keys
from rsnotify.hub.redis_server import RedisServer, start_redis_server
from rsnotify.hub.settings import HubSettings
from rsnotify.hub.web.app import build_app

TOPIC = "http://source.example.org/changes/rs"
BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
        b' xmlns:rs="http://www.openarchives.org/rs/terms/">\n  <rs:md capability="change-notification"'
        b' from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>\n'
        b'  <url><loc>http://example.com/res1</loc><rs:md change="updated" datetime="2013-01-03T00:08:52Z"/></url>\n'
        b'</urlset>\n')


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[RedisServer]:
    server = start_redis_server(tmp_path / "primary", unix_socket=False, appendonly=False)
    yield server
    server.stop()


def attach_replica(tmp_path: Path, primary: RedisServer) -> RedisServer:
    """A second server, made a replica of `primary`, in sync once this returns."""
    replica = start_redis_server(tmp_path / "replica", unix_socket=False, appendonly=False)
    host, port = primary.url.removeprefix("redis://").split("/")[0].split(":")
    client = redis_lib.Redis.from_url(replica.url)
    try:
        client.replicaof(host, int(port))
        deadline = time.monotonic() + 15
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synchronised"
            time.sleep(0.05)
    finally:
        client.close()
    return replica


async def test_a_publish_not_on_enough_replicas_is_503_and_its_retry_is_stored_once(
        aiohttp_client, primary: RedisServer, tmp_path: Path) -> None:
    settings = HubSettings(redis_url=primary.url, data_dir=str(tmp_path / "data"), workers=0,
                           secret_key=Fernet.generate_key().decode(), min_replicas=1, replica_timeout=0.3)
    client = await aiohttp_client(build_app(settings))
    headers = {"Content-Type": "application/xml", "Idempotency-Key": "publish-1",
               "Link": f'<{TOPIC}>; rel="self", <{settings.hub_url}>; rel="hub"'}

    started = time.monotonic()
    refused = await client.post("/", data=BODY, headers=headers)
    assert refused.status == 503 and int(refused.headers["Retry-After"]) >= 1
    assert "only 0 of 1 replicas" in await refused.text() and "same Idempotency-Key" in await refused.text()
    assert time.monotonic() - started < settings.redis_timeout       # the wait is bounded, never a hang
    health = await (await client.get("/health")).json()
    assert health["replication"]["replicas"] == [] and health["replication"]["min_replicas"] == 1

    replica = await asyncio.to_thread(attach_replica, tmp_path, primary)
    try:
        # The publisher retries with the same key, as it would after a 503: the primary counts the
        # new replica in WAIT once it has acknowledged the stream (Redis 7.0 takes up to a second
        # after its link is up; valkey is quicker), and from then the retry is answered 200.
        deadline = time.monotonic() + 15
        while (accepted := await client.post("/", data=BODY, headers=headers)).status == 503:
            assert time.monotonic() < deadline, await accepted.text()
            await asyncio.sleep(0.2)
        assert accepted.status == 200, await accepted.text()
        assert accepted.headers.get("Idempotent-Replayed") == "true"     # the stored one, not a second
        log_key = keys.topic_log_key(keys.topic_id(TOPIC))
        for server in (primary, replica):
            redis = redis_lib.Redis.from_url(server.url)
            try:
                assert redis.xlen(log_key) == 1, server.url
            finally:
                redis.close()
        health = await (await client.get("/health")).json()
        [seen] = health["replication"]["replicas"]
        assert seen["state"] == "online" and seen["address"].endswith(replica.url.split(":")[2].split("/")[0])
    finally:
        replica.stop()


async def test_without_min_replicas_plain_redis_answers_at_once(aiohttp_client, primary: RedisServer,
                                                                tmp_path: Path) -> None:
    """The default on a plain URL: 0 replicas waited for, today's behaviour."""
    settings = HubSettings(redis_url=primary.url, data_dir=str(tmp_path / "data"), workers=0,
                           secret_key=Fernet.generate_key().decode())
    assert settings.replicas_to_wait_for == 0
    client = await aiohttp_client(build_app(settings))
    answer = await client.post("/", data=BODY, headers={
        "Content-Type": "application/xml", "Link": f'<{TOPIC}>; rel="self", <{settings.hub_url}>; rel="hub"'})
    assert answer.status == 200, await answer.text()


async def test_a_primary_demoted_under_the_hub_gets_503_never_a_write(aiohttp_client, primary: RedisServer,
                                                                     tmp_path: Path) -> None:
    """A managed service's endpoint still pointing at the old primary, now a replica: READONLY is
    noticed (the connection is dropped, the request answered 503 + Retry-After), nothing is
    acknowledged; once the endpoint leads to a primary again, publishes go on."""
    settings = HubSettings(redis_url=primary.url, data_dir=str(tmp_path / "data"), workers=0,
                           secret_key=Fernet.generate_key().decode())
    client = await aiohttp_client(build_app(settings))
    headers = {"Content-Type": "application/xml",
               "Link": f'<{TOPIC}>; rel="self", <{settings.hub_url}>; rel="hub"'}
    assert (await client.post("/", data=BODY, headers=headers)).status == 200
    other = start_redis_server(tmp_path / "other", unix_socket=False, appendonly=False)
    admin = redis_lib.Redis.from_url(primary.url)
    try:
        host, port = other.url.removeprefix("redis://").split("/")[0].split(":")
        admin.replicaof(host, int(port))                      # demoted: it follows another primary now
        deadline = time.monotonic() + 15
        while admin.info("replication").get("master_link_status") != "up":   # and holds what that one has
            assert time.monotonic() < deadline, "the demoted primary never synchronised"
            await asyncio.sleep(0.05)
        refused = await client.post("/", data=BODY, headers=headers)
        assert refused.status == 503 and refused.headers["Retry-After"], await refused.text()
        health = await client.get("/health")
        assert health.status == 503 and "not the primary" in (await health.json())["error"]
        admin.replicaof("NO", "ONE")                          # the endpoint leads to a primary again
        answer = await client.post("/", data=BODY, headers=headers)
        assert answer.status == 200, await answer.text()
        # the refused publish is nowhere: the log holds the last one only (the demotion emptied it)
        assert admin.xlen(keys.topic_log_key(keys.topic_id(TOPIC))) == 1
    finally:
        admin.close()
        other.stop()

"""What an operator is told at start, and the probes a supervisor relies on: a real `rsnotify hub`
process on its embedded Redis, and a hub app whose own Redis server is stopped under it."""
from __future__ import annotations

import redis as redis_lib
from aiohttp.test_utils import TestClient, TestServer

from rsnotify.hub.cli import warn_without_workers
from rsnotify.hub.settings import HubSettings
from rsnotify.hub.web.app import build_app
from rsnotify.hub.redis_server import start_redis_server
from tests.support.ports import free_port


def test_no_workers_on_the_embedded_redis_says_how_to_add_one(hub_process) -> None:
    hub = hub_process("--workers", "0")
    output = hub.output()
    assert "warning: --workers 0 with the embedded Redis" in output
    sock = next(word for word in output.split() if word.startswith("unix://"))
    assert sock.endswith("/redis.sock")
    client = redis_lib.Redis.from_url(sock)       # the command it prints reaches this hub's Redis
    try:
        assert client.ping()
    finally:
        client.close()


def test_only_a_hub_without_any_worker_warns(capsys, tmp_path) -> None:
    warn_without_workers(HubSettings(data_dir=str(tmp_path), workers=2))
    warn_without_workers(HubSettings(data_dir=str(tmp_path), workers=0, redis_url="redis://127.0.0.1:1/0"))
    assert capsys.readouterr().err == ""


async def test_live_answers_while_redis_is_down_and_health_does_not(tmp_path) -> None:
    server = start_redis_server(tmp_path / "redis", port=free_port(), unix_socket=False)
    settings = HubSettings(redis_url=server.url, data_dir=str(tmp_path / "data"), workers=0)
    client = TestClient(TestServer(build_app(settings), host="127.0.0.1"))
    await client.start_server()
    try:
        assert (await client.get("/health")).status == 200
        assert (await client.get("/live")).status == 200
        server.stop()
        health = await client.get("/health")
        assert health.status == 503 and (await health.json())["redis"] is False
        live = await client.get("/live")
        assert live.status == 200 and await live.json() == {"status": "alive"}
    finally:
        await client.close()
        server.stop()

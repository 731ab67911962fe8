"""A subscriber reads the hub's view of its own subscriptions from a real `rsnotify hub`: signed
with the secret, or through the link the hub sends to the callback (hub.mode=diagnostics), and
with `rsnotify subscribe --status`."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest

from rsnotify.hub.redis_server import RedisServer
from rsnotify.subscriber import DiagnosticsError
from rsnotify.subscriber.store import JsonFileStore
from tests.support import cli
from tests.support.http import get_json
from tests.support.hubproc import HubProcess, start_hub_on_emptied_redis
from tests.support.waiting import eventually


@pytest.fixture(scope="module")
def hub(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    process = start_hub_on_emptied_redis(tmp_path_factory.mktemp("hub"), redis_server.url, workers=1)
    yield process
    process.stop()


async def held_by_hub(hub: HubProcess, topic: str, count: int) -> None:
    def held() -> bool:
        status, answer = get_json(hub.url + "admin/subscriptions?" + urlencode({"topic": topic}))
        return status == 200 and len(answer["subscriptions"]) == count

    await eventually(held, what=f"the hub to hold {count} subscription(s) to {topic}", logs=[hub.log])


async def test_diagnostics_signed_by_link_and_from_the_command_line(hub: HubProcess, make_subscriber, tmp_path):
    state_file = tmp_path / "subscriptions.json"
    subscriber = await make_subscriber(JsonFileStore(state_file))
    topic = f"http://example.org/{tmp_path.name}/changes"
    signed = await subscriber.subscribe(topic, hub.url, secret=True)
    unsigned = await subscriber.subscribe(topic, hub.url, secret=False)
    await held_by_hub(hub, topic, 2)

    report = await subscriber.diagnostics(signed)
    assert (report["state"], report["has_secret"], report["callback"]) == ("active", True, signed.callback)
    report = await subscriber.diagnostics(unsigned)  # the hub sends a link to the callback first
    assert (report["state"], report["has_secret"], report["callback"]) == ("active", False, unsigned.callback)
    assert unsigned.id in subscriber.lifecycle.diagnostics_links
    assert (await subscriber.diagnostics(unsigned))["callback"] == unsigned.callback  # the link is reused

    status = await cli.start_async("subscribe", "--status", "--state-file", str(state_file))
    out, err = await asyncio.wait_for(status.communicate(), 60)
    lines = {line["callback"]: line for line in map(json.loads, out.decode().splitlines())}
    assert status.returncode == 1, err.decode()  # the unsigned one cannot be read without serving its callback
    assert lines[signed.callback]["at_hub"]["state"] == "active" and lines[signed.callback]["status"] == "active"
    assert "has no secret" in lines[unsigned.callback]["error"]


async def test_diagnostics_of_a_subscription_the_hub_does_not_hold_says_so(hub: HubProcess, make_subscriber, tmp_path):
    subscriber = await make_subscriber()
    topic = f"http://example.org/{tmp_path.name}/changes"
    signed = await subscriber.subscribe(topic, hub.url, secret=True)
    await held_by_hub(hub, topic, 1)
    await subscriber.store.put(signed.evolve(secret="not-the-secret-the-hub-has"))
    with pytest.raises(DiagnosticsError, match="answered 401 .* not a valid signature") as caught:
        await subscriber.diagnostics(signed)
    assert caught.value.status == 401

"""A hub re-sends a subscribe verification whose answer it lost: the subscriber (the library, served
by aiohttp) confirms it for a subscription it holds as active, and still refuses one it never
asked for. The re-sent verifications come from a real `rsnotify hub` with a worker."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.support.http import FORM, fetch
from tests.support.hubproc import HubProcess, start_hub

TOPIC = "http://data.example.org/ds1/changes"


@pytest.fixture
async def rsnotify_hub(redis_url: str, tmp_path: Path) -> AsyncIterator[HubProcess]:
    hub = await asyncio.to_thread(start_hub, tmp_path, "--log-level", "info", redis_url=redis_url, workers=1)
    yield hub
    await asyncio.to_thread(hub.stop)


async def ask_hub(hub: HubProcess, callback: str) -> None:
    """A subscribe request for `callback` sent to the hub as any client can: the hub verifies it."""
    form = urlencode({"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": callback})
    answer = await asyncio.to_thread(fetch, hub.url, "POST", form, {"Content-Type": FORM})
    assert answer.status == 202, answer.text


async def test_a_repeated_verification_of_an_active_subscription_is_confirmed(rsnotify_hub, make_subscriber):
    hub = rsnotify_hub
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, hub.url)
    assert subscription.status == "active"
    await asyncio.to_thread(hub.wait_for_output, r"subscription \w+ activated")
    since = len(hub.output())
    await ask_hub(hub, subscription.callback)      # the hub verifies the same subscription again
    await asyncio.to_thread(hub.wait_for_output, r"subscription \w+ renewed|not verified", since=since)
    assert "not verified" not in hub.output()[since:], hub.output()[since:]
    assert (await subscriber.store.get(subscription.id)).status == "active"
    # a callback URL the subscriber never handed out is still refused
    since = len(hub.output())
    await ask_hub(hub, subscription.callback.rsplit("/", 1)[0] + "/never-asked")
    found = await asyncio.to_thread(hub.wait_for_output, r"not verified: .*", since=since)
    assert "404" in found.group(0)

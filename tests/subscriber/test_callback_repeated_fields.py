"""A verification GET that repeats a hub.* field with different values gets the same answer from
every adapter under its real server (aiohttp, ASGI under uvicorn, WSGI under wsgiref; the README's
Flask and Django examples against a real hub): 400 naming
the field, nothing echoed and the subscription unchanged, as the hub refuses such a form. A field
repeated with the same value is one value. (Before, aiohttp echoed the first hub.challenge and
the ASGI/WSGI adapters the last.)"""
from __future__ import annotations

import asyncio
import urllib.parse

import pytest

from tests.support.http import http

from .test_subscriber_adapters import TOPIC, harness  # noqa: F401  (the adapters under real servers)
from .test_subscriber_frameworks import (  # noqa: F401
    hub,
    make_app,
    readme_example,
    start_and_wait_verified,
)


async def get(callback: str, pairs: list[tuple[str, str]]) -> tuple[int, str]:
    # a blocking client off the test's loop: the aiohttp adapter's server runs on that loop
    status, body = await asyncio.to_thread(http, "GET", callback + "?" + urllib.parse.urlencode(pairs))
    return status, body.decode()


async def test_every_adapter_refuses_a_hub_field_repeated_with_different_values(harness, fake_hub):  # noqa: F811
    subscription = await harness.subscribe(fake_hub.url)
    await fake_hub.settle()
    status, body = await get(subscription.callback, [
        ("hub.mode", "subscribe"), ("hub.topic", TOPIC), ("hub.challenge", "first"), ("hub.challenge", "second"),
        ("hub.lease_seconds", "600")])
    assert (status, body) == (400, "hub.challenge is given 2 times with different values; send it once"), harness.name

    status, body = await get(subscription.callback, [
        ("hub.mode", "unsubscribe"), ("hub.mode", "subscribe"), ("hub.topic", TOPIC), ("hub.topic", TOPIC + "x"),
        ("hub.challenge", "c")])
    assert status == 400, harness.name
    assert body.splitlines() == ["hub.mode is given 2 times with different values; send it once",
                                 "hub.topic is given 2 times with different values; send it once"], harness.name
    current = await harness.subscriber.store.get(subscription.id)
    assert current is not None and current.status == "active", harness.name


async def test_every_adapter_takes_a_field_repeated_with_one_value_and_ignores_other_names(harness, fake_hub):  # noqa: F811
    subscription = await harness.subscribe(fake_hub.url)
    await fake_hub.settle()
    status, body = await get(subscription.callback, [
        ("hub.mode", "subscribe"), ("hub.topic", TOPIC), ("hub.challenge", "same"), ("hub.challenge", "same"),
        ("hub.lease_seconds", "600"), ("token", "a"), ("token", "b")])   # the callback's own fields: not ours
    assert (status, body) == (200, "same"), harness.name


@pytest.mark.parametrize("framework", ["flask", "django"])
def test_the_flask_and_django_examples_refuse_it_too(framework, make_app, hub):  # noqa: F811
    app = make_app(framework, readme_example(f"{framework}_app.py"))
    start_and_wait_verified(app, hub)
    [subscription] = [s for s in app.subscriptions() if s.status == "active"]
    query = urllib.parse.urlencode([("hub.mode", "subscribe"), ("hub.topic", subscription.topic),
                                    ("hub.challenge", "first"), ("hub.challenge", "second")])
    status, body = http("GET", subscription.callback + "?" + query)
    assert (status, body.decode()) == (400, "hub.challenge is given 2 times with different values; send it once")
    query = urllib.parse.urlencode([("hub.mode", "subscribe"), ("hub.topic", subscription.topic),
                                    ("hub.challenge", "same"), ("hub.challenge", "same"), ("hub.lease_seconds", "600")])
    assert http("GET", subscription.callback + "?" + query) == (200, b"same")

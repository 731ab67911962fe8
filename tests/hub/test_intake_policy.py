"""Lease clamping and expiry (injected clock), bad subscription input (4xx, nothing stored),
denials, and the outbound-address guard, against the real app, Redis and loopback servers."""
from __future__ import annotations

import ipaddress

import pytest

from rsnotify.hub import keys, store
from rsnotify.hub.netguard import is_allowed_address
from rsnotify.hub.settings import HubSettings
from rsnotify.hub.web.app import build_app
from rsnotify.hub.worker.verification import sweep_expired

TOPIC = "http://publisher.example/feeds/changes"


async def subscribe(client, callback, topic=TOPIC, **extra):
    form = {"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": callback, **extra}
    return await client.post("/", data=form)


async def stored_keys(redis) -> list[bytes]:
    return sorted([k async for k in redis.scan_iter("*") if not k.startswith(b"rsnotify:keycheck")])


@pytest.mark.parametrize(("requested", "granted"), [
    (None, 864000), ("1", 300), ("299", 300), ("3600", 3600), ("99999999", 2678400),
])
async def test_lease_is_clamped_to_the_policy(hub_client, intake_ctx, callback_server, run_jobs, requested, granted):
    extra = {} if requested is None else {"hub.lease_seconds": requested}
    await subscribe(hub_client, callback_server.url(), **extra)
    await run_jobs(intake_ctx)
    assert callback_server.requests[0].query["hub.lease_seconds"] == str(granted)
    sub = await store.get_subscription(intake_ctx.redis, keys.subscription_id(TOPIC, callback_server.url()))
    assert sub.lease_seconds == granted


async def test_expired_subscriptions_are_swept(hub_client, intake_ctx, callback_server, run_jobs, clock):
    await subscribe(hub_client, callback_server.url("/short"), **{"hub.lease_seconds": "300"})
    await subscribe(hub_client, callback_server.url("/long"), **{"hub.lease_seconds": "3000"})
    await run_jobs(intake_ctx)
    short = await store.get_subscription(intake_ctx.redis, keys.subscription_id(TOPIC, callback_server.url("/short")))
    clock.advance(300)
    assert not short.is_expired(clock()) and await sweep_expired(intake_ctx) == 0
    clock.advance(1)
    assert short.is_expired(clock())
    assert await sweep_expired(intake_ctx) == 1
    assert await store.get_subscription(intake_ctx.redis, short.sid) is None
    assert await store.count_subscriptions(intake_ctx.redis) == 1
    tid = keys.topic_id(TOPIC)
    assert await intake_ctx.redis.smembers(keys.topic_subs_key(tid)) == {
        keys.subscription_id(TOPIC, callback_server.url("/long")).encode()}


async def test_sweep_spares_a_subscription_renewed_meanwhile(hub_client, intake_ctx, callback_server, run_jobs, clock):
    await subscribe(hub_client, callback_server.url(), **{"hub.lease_seconds": "300"})
    await run_jobs(intake_ctx)
    sid = keys.subscription_id(TOPIC, callback_server.url())
    clock.advance(400)
    assert await store.expired_subscriptions(intake_ctx.redis, clock()) == [sid]
    await subscribe(hub_client, callback_server.url(), **{"hub.lease_seconds": "300"})
    await run_jobs(intake_ctx)  # renewed at the new time
    assert not await store.remove_subscription(intake_ctx.redis, sid, if_expired_at=clock())
    assert await store.get_subscription(intake_ctx.redis, sid) is not None


BAD_FORMS = [
    ({"hub.mode": "subscribe", "hub.topic": TOPIC}, "hub.callback is required"),
    ({"hub.mode": "subscribe", "hub.callback": "http://127.0.0.1/cb"}, "hub.topic is required"),
    ({"hub.mode": "subscribe", "hub.topic": "/relative", "hub.callback": "http://127.0.0.1/cb"},
     "hub.topic must be an absolute http or https URL"),
    ({"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": "ftp://127.0.0.1/cb"},
     "hub.callback must be an absolute http or https URL"),
    ({"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": "http://127.0.0.1:99999/cb"},
     "invalid port"),
    ({"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": "http://127.0.0.1/cb", "hub.lease_seconds": "-5"},
     "hub.lease_seconds must be a positive integer, got '-5'"),
    ({"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": "http://127.0.0.1/cb", "hub.lease_seconds": "ten"},
     "hub.lease_seconds must be a positive integer"),
    ({"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": "http://127.0.0.1/cb", "hub.secret": "é" * 100},
     "hub.secret must be less than 200 bytes in UTF-8, got 200 bytes"),
    ({"hub.mode": "watch", "hub.topic": TOPIC, "hub.callback": "http://127.0.0.1/cb"},
     "hub.mode must be subscribe, unsubscribe or publish, got 'watch'"),
    ({"hub.topic": TOPIC}, "hub.mode must be subscribe, unsubscribe or publish, got no hub.mode field"),
]


@pytest.mark.parametrize(("form", "reason"), BAD_FORMS)
async def test_bad_subscription_forms_get_400_with_a_reason_and_store_nothing(hub_client, intake_ctx, form, reason):
    response = await hub_client.post("/", data=form)
    assert response.status == 400
    assert response.content_type == "text/plain"
    assert reason in await response.text()
    assert await stored_keys(intake_ctx.redis) == []
    assert intake_ctx.queue.count == 0


async def test_every_problem_is_listed_at_once(hub_client):
    response = await hub_client.post("/", data={"hub.mode": "subscribe", "hub.topic": "x", "hub.callback": "y",
                                                "hub.lease_seconds": "0"})
    lines = (await response.text()).strip().splitlines()
    assert response.status == 400 and len(lines) == 3


async def test_secret_just_under_the_byte_limit_is_accepted(hub_client, intake_ctx, callback_server, run_jobs):
    secret = "é" * 99 + "a"  # 199 bytes in UTF-8
    assert (await subscribe(hub_client, callback_server.url(), **{"hub.secret": secret})).status == 202
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "activated"


async def test_unknown_content_types_get_415(hub_client, intake_ctx):
    for headers, body in (({"Content-Type": "text/plain"}, b"hub.mode=subscribe"), ({}, b"")):
        response = await hub_client.post("/", data=body, headers=headers, skip_auto_headers={"Content-Type"})
        assert response.status == 415
        assert "Content-Type must be application/x-www-form-urlencoded" in await response.text()
    assert await stored_keys(intake_ctx.redis) == []


async def test_other_methods_and_paths_are_refused(hub_client):
    assert (await hub_client.put("/", data=b"x")).status == 405
    assert (await hub_client.post("/elsewhere", data=b"x")).status == 404


async def test_topic_outside_every_token_prefix_is_denied(aiohttp_client, hub_settings, intake_ctx, callback_server,
                                                          run_jobs, clock):
    settings = hub_settings.with_values(publish_tokens=(("tok", "http://publisher.example/feeds/"),))
    client = await aiohttp_client(build_app(settings, now=clock))
    other = "http://elsewhere.example/topic"
    assert (await subscribe(client, callback_server.url("/denied"), topic=other)).status == 202
    assert (await subscribe(client, callback_server.url("/served"))).status == 202
    outcomes = {o.callback.rsplit("/", 1)[-1]: o for o in await run_jobs(intake_ctx)}
    assert outcomes["denied"].result == "denial-sent"
    [denial] = callback_server.seen("/denied")
    assert denial.query["hub.mode"] == "denied" and denial.query["hub.topic"] == other
    assert "does not carry that topic" in denial.query["hub.reason"]
    assert "hub.challenge" not in denial.query
    assert await store.get_subscription(intake_ctx.redis, keys.subscription_id(other, callback_server.url("/denied"))) \
        is None
    assert outcomes["served"].result == "activated"


async def test_callback_on_a_refused_network_is_never_contacted(aiohttp_client, hub_settings, intake_ctx,
                                                                callback_server, run_jobs, clock):
    public = hub_settings.with_values(host="0.0.0.0")  # not loopback-only: loopback callbacks are refused
    client = await aiohttp_client(build_app(public, now=clock))
    await intake_ctx.use_settings(public)
    # an address literal is refused at intake: nothing is stored, so no verification (or denial) is sent
    response = await subscribe(client, callback_server.url())
    assert response.status == 400
    assert "127.0.0.1 refused: not a public address" in await response.text()
    assert await run_jobs(intake_ctx) == []
    assert callback_server.requests == []
    assert await store.count_subscriptions(intake_ctx.redis) == 0


async def test_allow_network_opens_a_refused_network(aiohttp_client, hub_settings, intake_ctx, callback_server,
                                                     run_jobs, clock):
    allowed = hub_settings.with_values(host="0.0.0.0", allow_networks=("127.0.0.0/8",))
    await intake_ctx.use_settings(allowed)
    client = await aiohttp_client(build_app(allowed, now=clock))
    await subscribe(client, callback_server.url().replace("127.0.0.1", "localhost"))
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "activated"


@pytest.mark.parametrize(("address", "allowed"), [
    ("8.8.8.8", True), ("2606:4700:4700::1111", True),
    ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("100.64.0.1", False), ("224.0.0.1", False), ("240.0.0.1", False),
    ("0.0.0.0", False), ("255.255.255.255", False), ("::1", False), ("fe80::1", False), ("fc00::1", False),
    ("ff02::1", False), ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("::ffff:8.8.8.8", True),
])
def test_outbound_guard_refuses_non_public_addresses(address, allowed):
    assert is_allowed_address(address) is allowed


def test_allowed_networks_open_exactly_their_range():
    nets = (ipaddress.ip_network("10.0.0.0/8"),)
    assert is_allowed_address("10.9.9.9", nets)
    assert not is_allowed_address("192.168.0.1", nets)
    assert HubSettings(host="127.0.0.1").allowed_networks  # loopback-only hubs may reach loopback
    assert HubSettings(host="0.0.0.0").allowed_networks == ()

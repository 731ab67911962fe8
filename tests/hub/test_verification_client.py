"""Verification and denial GETs through the worker's outbound client (rsnotify/outbound.py): what the
callback gets, what its answer may be (exact identity echo, no redirect followed, bounded body),
the guard's and the time bound's messages, and one keep-alive connection per callback host,
against the real app, Redis and loopback callbacks."""
from __future__ import annotations

import asyncio
import gzip
import secrets

import pytest
from aiohttp import web

from rsnotify.hub import keys, store
from rsnotify.hub.netguard import HINT, USER_AGENT
from rsnotify.hub.records import Intent
from rsnotify.hub.web.app import build_app
from rsnotify.hub.worker.verification import send_denial, verify
from rsnotify.netguard import refusal_message

TOPIC = "http://publisher.example/feeds/changes"


async def subscribe(client, callback, topic=TOPIC, mode="subscribe"):
    form = {"hub.mode": mode, "hub.topic": topic, "hub.callback": callback}
    response = await client.post("/", data=form)
    assert response.status == 202, await response.text()


async def active(ctx, callback):
    return await store.get_subscription(ctx.redis, keys.subscription_id(TOPIC, callback))


async def test_the_get_carries_the_exact_callback_identity_and_no_body(hub_client, intake_ctx, callback_server,
                                                                      run_jobs):
    callback = callback_server.url("/cb/%7Euser") + "?list=a%2Cb&empty="
    await subscribe(hub_client, callback)
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "activated"
    [get] = callback_server.seen("/cb/~user")
    assert get.raw_query.startswith("list=a%2Cb&empty=&hub.mode=subscribe&hub.topic=")
    assert get.headers["Accept-Encoding"] == "identity"
    assert get.headers["User-Agent"] == USER_AGENT
    assert get.headers["Host"] == callback_server.base.removeprefix("http://")
    assert "Content-Length" not in get.headers and "Transfer-Encoding" not in get.headers and get.body == b""


async def test_a_gzipped_echo_is_refused(hub_client, intake_ctx, callback_server, run_jobs):
    def gzipped(request):
        coded = gzip.compress(request.query["hub.challenge"].encode())
        return web.Response(body=coded, headers={"Content-Encoding": "gzip"})

    callback_server.on("/gz", gzipped, method="GET")
    await subscribe(hub_client, callback_server.url("/gz"))
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "refused" and outcome.status == 200
    assert outcome.reason.startswith("callback answered 200 with a body that is not the challenge")
    assert await active(intake_ctx, callback_server.url("/gz")) is None


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_never_followed(hub_client, intake_ctx, callback_server, run_jobs, status):
    def moved(request):
        # the redirect's target would echo: following it would activate the subscription
        return web.Response(status=status, headers={"Location": f"/followed?{request.query_string}"})

    callback_server.on("/moved", moved, method="GET")
    await subscribe(hub_client, callback_server.url("/moved"))
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "refused"
    assert outcome.reason == f"callback answered {status}; expected 2xx with the challenge"
    assert callback_server.seen("/followed") == []
    assert await active(intake_ctx, callback_server.url("/moved")) is None


async def test_a_denial_is_sent_once_and_its_redirect_not_followed(aiohttp_client, hub_settings, intake_ctx,
                                                                  callback_server, run_jobs, clock):
    settings = hub_settings.with_values(publish_tokens=(("tok", "http://publisher.example/feeds/"),))
    client = await aiohttp_client(build_app(settings, now=clock))
    callback_server.on("/denied", lambda r: web.Response(status=302, headers={"Location": "/followed"}), method="GET")
    await subscribe(client, callback_server.url("/denied"), topic="http://elsewhere.example/topic")
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "denial-sent" and outcome.status == 302
    [denial] = callback_server.seen("/denied")
    assert denial.query["hub.mode"] == "denied" and denial.headers["Accept-Encoding"] == "identity"
    assert callback_server.seen("/followed") == []


async def test_a_long_answer_is_read_one_byte_past_the_challenge(hub_client, intake_ctx, callback_server, run_jobs):
    def flood(request):
        return web.Response(body=request.query["hub.challenge"].encode() + b"x" * (8 * 1024 * 1024))

    callback_server.on("/flood", flood, method="GET")
    await subscribe(hub_client, callback_server.url("/flood"))
    [outcome] = await run_jobs(intake_ctx)
    [get] = callback_server.seen("/flood")
    size = len(get.query["hub.challenge"]) + 1
    assert outcome.result == "refused"
    assert outcome.reason == f"callback answered 200 with a body that is not the challenge ({size} bytes)"


async def test_a_slow_callback_is_refused_at_the_time_bound(hub_client, intake_ctx, callback_server, run_jobs):
    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(text=request.query["hub.challenge"])

    callback_server.on("/slow", slow, method="GET")
    await intake_ctx.use_settings(intake_ctx.settings.with_values(fetch_timeout=0.3))
    await subscribe(hub_client, callback_server.url("/slow"))
    started = asyncio.get_running_loop().time()
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "refused" and outcome.status is None
    assert outcome.reason == "callback unreachable: no answer within 0.3 s"
    assert asyncio.get_running_loop().time() - started < 2


async def test_a_callback_at_a_refused_address_gets_only_the_guards_message(hub_settings, intake_ctx,
                                                                           callback_server):
    # a host name is judged by the address it resolves to, when the GET connects: intake took it
    await intake_ctx.use_settings(hub_settings.with_values(host="0.0.0.0"))
    callback = callback_server.url("/cb").replace("127.0.0.1", "localhost")
    challenge = secrets.token_urlsafe(32)
    outcome = await verify(intake_ctx, challenge, Intent("subscribe", TOPIC, callback, lease_seconds=3600))
    assert outcome.result == "refused" and outcome.status is None
    assert outcome.reason == refusal_message("127.0.0.1", HINT)
    denial = await send_denial(intake_ctx, Intent("denied", TOPIC, callback, reason="not here"))
    assert denial.result == "denial-failed" and denial.reason == refusal_message("127.0.0.1", HINT)
    assert callback_server.requests == []
    assert await active(intake_ctx, callback) is None


async def test_verifications_of_one_host_share_a_keep_alive_connection(hub_client, intake_ctx, callback_server,
                                                                      run_jobs):
    peers: list[tuple[str, int]] = []

    def echo(request):
        peers.append(request.transport.get_extra_info("peername")[:2])
        return web.Response(text=request.query["hub.challenge"])

    for path in ("/a", "/b"):
        callback_server.on(path, echo, method="GET")
    results = []
    for path, mode in (("/a", "subscribe"), ("/b", "subscribe"), ("/a", "subscribe"), ("/a", "unsubscribe")):
        await subscribe(hub_client, callback_server.url(path), mode=mode)
        results += [outcome.result for outcome in await run_jobs(intake_ctx)]
    assert results == ["activated", "activated", "renewed", "unsubscribed"]
    assert len(peers) == 4 and len(set(peers)) == 1      # one connection, from one client port

"""The three publish forms (ResourceSync submission, thin ping by hub.url / hub.topic),
authentication, size bounds and bad input, against the real app, Redis and loopback topics."""
from __future__ import annotations

import asyncio
import gzip
import json
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web
from multidict import CIMultiDict

from rsnotify.hub import keys, store
from rsnotify.hub.errors import IdempotencyConflictError
from rsnotify.hub.records import AppendedNotification
from rsnotify.hub.web.app import build_app
from rsnotify.hub.web.appkeys import SETTINGS
from rsnotify.notification import ChangeNotification, ChangeType, ResourceChange
from rsnotify.websub import NOTIFICATION_ID_HEADER, build_link_header
from rsnotify.xml import to_xml
from tests.support.ports import free_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTIFICATION = (FIXTURES / "change-notification-1.0.1" / "notification_ex_1.xml").read_bytes()
TOPIC = "http://publisher.example/dataset1/change/"
CAPABILITIES = "http://publisher.example/dataset1/capabilitylist.xml"


def links(hub_url, topic=TOPIC, rs=None):
    pairs = [(topic, "self"), (hub_url, "hub")] + ([(rs, "resourcesync")] if rs else [])
    return build_link_header(pairs)


def hub_url(client) -> str:
    return client.server.app[SETTINGS].hub_url


async def submit(client, body=NOTIFICATION, *, link=None, content_type="application/xml", headers=None):
    all_headers = {"Content-Type": content_type, **(headers or {})}
    if link is not False:
        all_headers["Link"] = link or links(hub_url(client))
    return await client.post("/", data=body, headers=all_headers)


async def log_entries(redis, topic=TOPIC):
    return await redis.xrange(keys.topic_log_key(keys.topic_id(topic)))


async def nothing_stored(redis) -> bool:
    return [k async for k in redis.scan_iter("rsnotify:topic*")] == []


@pytest.fixture
async def hub_with_public_url(aiohttp_client, hub_settings, clock):
    """A hub whose public URL differs from its listening address (as behind a proxy)."""
    settings = hub_settings.with_values(public_url="http://Hub.Example.org:80")
    return await aiohttp_client(build_app(settings, now=clock))


# --- ResourceSync submissions ---------------------------------------------------------------


async def test_valid_submission_is_stored_byte_for_byte_and_answered_200(hub_client, intake_ctx, clock):
    response = await submit(hub_client, link=links(hub_url(hub_client), rs=CAPABILITIES),
                            content_type="application/xml; charset=UTF-8")
    assert response.status == 200
    answer = await response.json()
    assert answer == {"notification_id": answer["notification_id"], "topic": TOPIC, "sequence": 1}
    assert response.headers[NOTIFICATION_ID_HEADER] == answer["notification_id"]
    [(entry_id, fields)] = await log_entries(intake_ctx.redis)
    assert entry_id.decode() == answer["notification_id"]
    assert fields[b"body"] == NOTIFICATION
    assert fields[b"ctype"] == b"application/xml; charset=UTF-8"
    assert fields[b"rs"] == CAPABILITIES.encode()
    assert fields[b"seq"] == b"1" and fields[b"at"] == str(int(clock() * 1000)).encode()
    assert [job.func_name for job in intake_ctx.queue.get_jobs()] and \
        any(tuple(job.args) == (keys.topic_id(TOPIC),) for job in intake_ctx.queue.get_jobs())  # JSON: a list


async def test_sequence_numbers_grow_per_topic(hub_client, intake_ctx):
    answers = [await (await submit(hub_client)).json() for _ in range(3)]
    other = await (await submit(hub_client, link=links(hub_url(hub_client), topic=TOPIC + "other"))).json()
    assert [a["sequence"] for a in answers] == [1, 2, 3] and other["sequence"] == 1
    assert len({a["notification_id"] for a in answers}) == 3


async def test_hub_link_is_compared_normalized(hub_with_public_url, intake_ctx):
    for named in ("http://hub.example.org/", "HTTP://HUB.EXAMPLE.ORG", "http://hub.example.org:80/"):
        response = await submit(hub_with_public_url, link=build_link_header([(TOPIC, "self"), (named, "hub")]))
        assert response.status == 200, await response.text()
    response = await submit(hub_with_public_url, link=build_link_header([(TOPIC, "self"),
                                                                         ("http://hub.example.org:8080/", "hub")]))
    assert response.status == 400
    assert 'rel="hub" must name this hub (http://hub.example.org/)' in await response.text()


async def test_links_may_come_in_several_headers(hub_client, intake_ctx):
    headers = [("Content-Type", "application/xml"), ("Link", f'<{TOPIC}>; rel="self"'),
               ("Link", f'<{hub_url(hub_client)}>; rel="hub"')]
    from multidict import CIMultiDict
    response = await hub_client.post("/", data=NOTIFICATION, headers=CIMultiDict(headers))
    assert response.status == 200


BAD_LINKS = [
    (False, 'a submission needs a Link header with <topic>; rel="self"'),
    ('<http://h/>; rel="hub"', 'the Link header must carry rel="self" (the topic), got none'),
    (f'<{TOPIC}>; rel="self"', 'the Link header must carry rel="hub" naming this hub'),
    (f'<{TOPIC}>; rel="self", <http://other.example/>; rel="hub"', 'rel="hub" must name this hub'),
    ('<relative/path>; rel="self", <HUB>; rel="hub"', 'the rel="self" link must be an absolute http or https URL'),
    (f'<{TOPIC}>; rel="self", <http://x/b>; rel="self", <HUB>; rel="hub"', 'must carry one rel="self" topic'),
    ('not a link header', "Link header must be '<uri>; rel=...' links"),
]


@pytest.mark.parametrize(("link", "reason"), BAD_LINKS)
async def test_bad_link_headers_get_400_and_store_nothing(hub_client, intake_ctx, link, reason):
    if isinstance(link, str):
        link = link.replace("HUB", hub_url(hub_client))
    response = await submit(hub_client, link=link)
    assert response.status == 400
    assert reason in await response.text()
    assert await nothing_stored(intake_ctx.redis)


BAD_BODIES = [
    (b"", "the body is empty"),
    (b"<urlset", "not a change notification"),
    (b"<html><body>hi</body></html>", "not a change notification"),
    (b'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY x "boom">]><urlset>&x;</urlset>', "not a change notification"),
    (NOTIFICATION.replace(b'change="created"', b'change="moved"'), "not a valid change notification"),
    (NOTIFICATION.replace(b'type="text/html"', b'type="text/html&#13;&#10;X-Injected: 1"'),
     "with a control character; expected a media type"),
    (NOTIFICATION.replace(b'capability="change-notification"', b'capability="resourcelist"'), "change notification"),
]


@pytest.mark.parametrize(("body", "reason"), BAD_BODIES)
async def test_invalid_documents_get_400_with_the_problems_and_store_nothing(hub_client, intake_ctx, body, reason):
    response = await submit(hub_client, body)
    text = await response.text()
    assert response.status == 400, text
    assert response.content_type == "text/plain"
    assert reason in text
    assert await nothing_stored(intake_ctx.redis)
    assert intake_ctx.queue.count == 0


@pytest.mark.parametrize("charset", ["latin-1", "ISO-8859-1", '"utf-16"', "x-bogus"])
async def test_a_submission_labelled_with_another_charset_than_utf8_gets_400(hub_client, intake_ctx, charset):
    # subscribers get the Content-Type as published, and its charset outranks the XML declaration
    response = await submit(hub_client, content_type=f"application/xml; charset={charset}")
    text = await response.text()
    assert response.status == 400, text
    assert f"must be UTF-8; got Content-Type charset '{charset.strip(chr(34))}'" in text
    assert await nothing_stored(intake_ctx.redis)
    assert (await submit(hub_client, content_type='application/xml; charset="utf-8"')).status == 200


def dated(clock, ahead: float) -> bytes:
    """A notification whose one change (and until) lies `ahead` seconds after the hub's clock."""
    now = datetime.fromtimestamp(clock.peek(), UTC)
    when = now + timedelta(seconds=ahead)
    return to_xml(ChangeNotification(now - timedelta(hours=1), when,
                                     (ResourceChange("http://publisher.example/res1", ChangeType.UPDATED, when),)))


async def test_a_notification_dated_past_the_future_skew_gets_400_and_stores_nothing(hub_client, intake_ctx, clock):
    # 2099 (or a day ahead) would put every later, truthfully dated notification of the topic
    # before it: each Destination's checkpoint and the Source's chain would be stuck there
    response = await submit(hub_client, dated(clock, 86400))
    text = await response.text()
    assert response.status == 400, text
    assert "the notification is dated in the future" in text
    assert "<rs:md> for http://publisher.example/res1 has datetime=2023-11-15T22:13:20Z in the future" in text
    assert "until=2023-11-15T22:13:20Z in the future" in text
    assert await nothing_stored(intake_ctx.redis)
    assert intake_ctx.queue.count == 0
    # a Source's clock a little fast (within --future-skew, 300 s) is fine
    assert (await submit(hub_client, dated(clock, 240))).status == 200


async def test_the_future_skew_is_a_setting(aiohttp_client, hub_settings, intake_ctx, clock):
    strict = await aiohttp_client(build_app(hub_settings.with_values(future_skew=0), now=clock))
    assert (await submit(strict, dated(clock, 1))).status == 400
    assert (await submit(strict, dated(clock, 0))).status == 200
    lenient = await aiohttp_client(build_app(hub_settings.with_values(future_skew=2 * 86400), now=clock))
    assert (await submit(lenient, dated(clock, 86400))).status == 200


async def test_bodies_over_max_body_get_413(aiohttp_client, hub_settings, intake_ctx, clock):
    client = await aiohttp_client(build_app(hub_settings.with_values(max_body=len(NOTIFICATION) - 1), now=clock))
    response = await submit(client)  # Content-Length says it all: refused before reading
    assert response.status == 413
    assert "larger than the hub's limit" in await response.text()

    async def chunks():  # no Content-Length: refused once the limit is passed
        for start in range(0, len(NOTIFICATION), 100):
            yield NOTIFICATION[start:start + 100]

    response = await submit(client, body=chunks())
    assert response.status == 413
    assert await nothing_stored(intake_ctx.redis)
    ok = await aiohttp_client(build_app(hub_settings.with_values(max_body=len(NOTIFICATION)), now=clock))
    assert (await submit(ok)).status == 200


async def test_other_xml_like_types_get_415(hub_client, intake_ctx):
    for content_type in ("text/xml", "application/atom+xml", "application/json"):
        response = await submit(hub_client, content_type=content_type)
        assert response.status == 415, content_type
    assert await nothing_stored(intake_ctx.redis)


async def test_publishing_to_a_topic_without_subscribers_succeeds(hub_client, intake_ctx):
    assert await store.count_subscriptions(intake_ctx.redis) == 0
    assert (await submit(hub_client)).status == 200


# --- authentication -------------------------------------------------------------------------


@pytest.fixture
async def token_hub(aiohttp_client, hub_settings, clock, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("# publishers\nfiletoken http://files.example/\n\nother=http://other.example/x/\n")
    settings = hub_settings.with_values(
        publish_tokens=(("alpha", "http://publisher.example/dataset1/"), ("alpha", "https://mirror.example/")),
        tokens_file=str(tokens))
    return await aiohttp_client(build_app(settings, now=clock))


async def test_tokens_bind_publishers_to_topic_prefixes(token_hub, intake_ctx):
    def auth(token):
        return {"Authorization": f"Bearer {token}"}

    missing = await submit(token_hub)
    assert missing.status == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert "Authorization: Bearer <token>" in await missing.text()
    unknown = await submit(token_hub, headers=auth("nope"))
    assert unknown.status == 401 and "not a publisher token" in await unknown.text()
    outside = await submit(token_hub, headers=auth("filetoken"))
    assert outside.status == 403 and f"may not publish to {TOPIC}" in await outside.text()
    assert await nothing_stored(intake_ctx.redis)
    assert (await submit(token_hub, headers=auth("alpha"))).status == 200
    mirror = links(hub_url(token_hub), topic="https://MIRROR.example/feed")
    assert (await submit(token_hub, link=mirror, headers=auth("alpha"))).status == 200
    from_file = links(hub_url(token_hub), topic="http://files.example/feed")
    assert (await submit(token_hub, link=from_file, headers=auth("filetoken"))).status == 200


async def test_prefix_host_boundary_is_respected(token_hub):
    sneaky = links(hub_url(token_hub), topic="http://files.example.evil.org/feed")
    response = await submit(token_hub, link=sneaky, headers={"Authorization": "Bearer filetoken"})
    assert response.status == 403


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


async def test_without_tokens_only_loopback_clients_may_publish(aiohttp_server, hub_settings, clock):
    import aiohttp

    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to publish from")
    server = await aiohttp_server(build_app(hub_settings, now=clock), host="0.0.0.0")
    headers = {"Content-Type": "application/xml", "Link": links(hub_settings.hub_url)}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{address}:{server.port}/", data=NOTIFICATION, headers=headers) as response:
            assert response.status == 403
            assert "only loopback clients may publish" in await response.text()
        async with session.post(f"http://127.0.0.1:{server.port}/", data=NOTIFICATION, headers=headers) as response:
            assert response.status == 200


# --- thin pings -----------------------------------------------------------------------------


@pytest.fixture
async def topic_server(aiohttp_server):
    """Loopback topics: /feed (XML with a resourcesync link), /text, /moved (302), /big, /streamed
    (big, chunked), /gzip (coded), /links (two Link fields), /slow, /gone."""
    hits: list[str] = []

    async def handle(request):
        hits.append(request.path)
        match request.path:
            case "/feed":
                return web.Response(body=NOTIFICATION, content_type="application/xml", charset="utf-8",
                                    headers={"Link": f'<{CAPABILITIES}>; rel="resourcesync"'})
            case "/text":
                return web.Response(text="plain news")
            case "/moved":
                raise web.HTTPFound("/feed")
            case "/big":
                return web.Response(body=b"x" * 5000)
            case "/streamed":       # chunked: no Content-Length tells its size in advance
                response = web.StreamResponse()
                await response.prepare(request)
                for _ in range(5):
                    await response.write(b"x" * 400)
                await response.write_eof()
                return response
            case "/gzip":           # coded although identity was asked for: it cannot be relayed as sent
                return web.Response(body=gzip.compress(NOTIFICATION), content_type="application/xml",
                                    headers={"Content-Encoding": "gzip"})
            case "/links":          # two Link fields, the resourcesync link in the second
                return web.Response(body=NOTIFICATION, content_type="application/xml", headers=CIMultiDict(
                    [("Link", '<http://example.org/a>; rel="alternate"'),
                     ("Link", f'<{CAPABILITIES}>; rel="resourcesync"')]))
            case "/slow":
                await asyncio.sleep(5)
                return web.Response(text="late")
        return web.Response(status=410)

    app = web.Application()
    app.router.add_get("/{name}", handle)
    server = await aiohttp_server(app, host="127.0.0.1")
    server.hits = hits
    return server


async def ping(client, **fields):
    form = [("hub.mode", "publish")] + [(k.replace("_", "."), v) for k, vs in fields.items() for v in vs]
    return await client.post("/", data=form)


async def test_thin_ping_fetches_each_topic_and_appends_body_and_type(hub_client, intake_ctx, topic_server, run_jobs):
    feed, text = str(topic_server.make_url("/feed")), str(topic_server.make_url("/text"))
    response = await ping(hub_client, hub_url=[feed], hub_topic=[text, feed])
    assert response.status == 202
    outcomes = await run_jobs(intake_ctx)
    assert [o.topic for o in outcomes] == [feed, text]  # one fetch per distinct topic
    [(_, fed)] = await log_entries(intake_ctx.redis, feed)
    assert fed[b"body"] == NOTIFICATION and fed[b"ctype"] == b"application/xml; charset=utf-8"
    assert fed[b"rs"] == CAPABILITIES.encode()
    [(_, plain)] = await log_entries(intake_ctx.redis, text)
    assert plain[b"body"] == b"plain news" and plain[b"ctype"].startswith(b"text/plain")
    fan_outs = [job.args[0] for job in intake_ctx.queue.get_jobs()]
    assert set(fan_outs) == {keys.topic_id(feed), keys.topic_id(text)}


async def test_thin_ping_fetch_reads_every_link_field_of_the_answer(hub_client, intake_ctx, topic_server, run_jobs):
    linked = str(topic_server.make_url("/links"))
    await ping(hub_client, hub_url=[linked])
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.notification is not None, outcome.reason
    [(_, entry)] = await log_entries(intake_ctx.redis, linked)
    assert entry[b"body"] == NOTIFICATION and entry[b"rs"] == CAPABILITIES.encode()


async def test_thin_ping_fetch_is_bounded_and_never_redirected(hub_client, intake_ctx, topic_server, run_jobs):
    intake_ctx.settings = intake_ctx.settings.with_values(fetch_max_bytes=1000, fetch_timeout=0.5)
    names = ("moved", "big", "streamed", "gzip", "slow", "gone")
    await ping(hub_client, hub_url=[str(topic_server.make_url("/" + n)) for n in names])
    outcomes = {o.topic.rsplit("/", 1)[-1]: o for o in await run_jobs(intake_ctx)}
    assert all(o.notification is None for o in outcomes.values())
    assert "302" in outcomes["moved"].reason and "410" in outcomes["gone"].reason
    assert "over the limit of 1000" in outcomes["big"].reason
    assert "over the limit of 1000" in outcomes["streamed"].reason
    assert "Content-Encoding gzip" in outcomes["gzip"].reason
    assert "within 0.5 s" in outcomes["slow"].reason
    assert "/feed" not in topic_server.hits
    assert await nothing_stored(intake_ctx.redis)


async def test_thin_ping_to_a_refused_network_fetches_nothing(aiohttp_client, hub_settings, intake_ctx, topic_server,
                                                              run_jobs, clock):
    public = hub_settings.with_values(host="0.0.0.0")
    await intake_ctx.use_settings(public)
    client = await aiohttp_client(build_app(public, now=clock))
    # a hub not on loopback takes pings only from loopback clients when it has no tokens: the test client is one;
    # a topic at a refused address literal is refused at intake, so no fetch is ever queued
    response = await ping(client, hub_url=[str(topic_server.make_url("/feed"))])
    assert response.status == 400
    assert "refused: not a public address" in await response.text()
    assert await run_jobs(intake_ctx) == []
    assert topic_server.hits == []


BAD_PINGS = [
    ({}, "needs at least one hub.url or hub.topic"),
    ({"hub_url": ["not a url"]}, "hub.url must be an absolute http or https URL"),
    ({"hub_topic": ["ftp://x/"], "hub_url": ["http://ok.example/"]}, "hub.topic must be an absolute http"),
    ({"hub_url": [f"http://x.example/{i}" for i in range(101)]}, "at most 100 topics"),
]


@pytest.mark.parametrize(("fields", "reason"), BAD_PINGS)
async def test_bad_pings_get_400_and_queue_nothing(hub_client, intake_ctx, fields, reason):
    response = await ping(hub_client, **fields)
    assert response.status == 400
    assert reason in await response.text()
    assert intake_ctx.queue.count == 0


async def test_pings_need_a_token_for_every_topic(token_hub, intake_ctx):
    allowed, other = "http://publisher.example/dataset1/a", "http://elsewhere.example/b"
    form = [("hub.mode", "publish"), ("hub.url", allowed), ("hub.url", other)]
    assert (await token_hub.post("/", data=form)).status == 401
    response = await token_hub.post("/", data=form, headers={"Authorization": "Bearer alpha"})
    assert response.status == 403 and other in await response.text()
    assert intake_ctx.queue.count == 0
    form = [("hub.mode", "publish"), ("hub.url", allowed)]
    assert (await token_hub.post("/", data=form, headers={"Authorization": "Bearer alpha"})).status == 202


# --- health ---------------------------------------------------------------------------------


async def test_health_reports_redis_workers_and_queues(hub_client, intake_ctx):
    await submit(hub_client)
    response = await hub_client.get("/health")
    assert response.status == 200
    body = await response.json()
    assert body["status"] == "ok" and body["redis"] is True and body["workers"] == 0
    assert body["queues"]["rsnotify"]["queued"] == 1
    assert set(body["queues"]["rsnotify"]) == {"queued", "started", "scheduled", "failed"}
    assert body["topics"] == 1 and body["subscriptions"] == 0


async def test_health_is_503_while_no_worker_is_seen(aiohttp_client, hub_settings, clock):
    client = await aiohttp_client(build_app(hub_settings.with_values(workers=2), now=clock))
    response = await client.get("/health")
    assert response.status == 503 and (await response.json())["status"] == "starting"


async def test_health_is_503_when_redis_is_gone(aiohttp_client, hub_settings, clock, tmp_path, monkeypatch):
    from rsnotify.hub.redis_server import start_redis_server
    from rsnotify.hub.store import logs
    # a publish retries its append for 20 s before it answers 503: 1 s here (still several tries)
    monkeypatch.setitem(logs.append_notification_once.__kwdefaults__, "retry_for", 1.0)
    server = start_redis_server(tmp_path / "own-redis", port=free_port(), unix_socket=False)
    try:
        client = await aiohttp_client(build_app(hub_settings.with_values(redis_url=server.url), now=clock))
        assert (await client.get("/health")).status == 200
    finally:
        server.stop()
    response = await client.get("/health")
    body = json.loads(await response.text())
    assert response.status == 503 and body["redis"] is False and body["status"] == "unavailable"
    submission = await submit(client)
    assert submission.status == 503 and submission.headers["Retry-After"] == "5"


async def test_a_local_proxy_does_not_make_remote_clients_loopback(hub_client, intake_ctx):
    for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
        response = await submit(hub_client, headers={header: "203.0.113.9"})
        assert response.status == 403, header
        assert "through a proxy" in await response.text() and "--publish-token" in await response.text()
    assert await nothing_stored(intake_ctx.redis)


async def test_the_public_urls_path_is_served_too(aiohttp_client, hub_settings, intake_ctx, clock):
    settings = hub_settings.with_values(public_url="http://hub.example.org/websub/")
    client = await aiohttp_client(build_app(settings, now=clock))
    response = await client.post("/websub/", data=NOTIFICATION, headers={
        "Content-Type": "application/xml", "Link": links("http://hub.example.org/websub/")})
    assert response.status == 200
    assert (await client.post("/", data=NOTIFICATION, headers={
        "Content-Type": "application/xml", "Link": links("http://hub.example.org/websub/")})).status == 200


async def test_a_submission_flags_its_fan_out_in_the_append_and_queues_one_job(hub_client, intake_ctx):
    flag = keys.fanout_queued_key(keys.topic_id(TOPIC))
    assert (await submit(hub_client)).status == 200
    assert intake_ctx.queue.count == 1 and await intake_ctx.redis.ttl(flag) > 0
    assert (await submit(hub_client, headers={"Idempotency-Key": "second"})).status == 200
    assert intake_ctx.queue.count == 1                  # the queued job will read both
    await intake_ctx.redis.delete(flag)                 # the job started (it clears the flag first)
    repeat = await submit(hub_client, headers={"Idempotency-Key": "second"})
    assert repeat.status == 200 and repeat.headers["Idempotent-Replayed"] == "true"
    assert intake_ctx.queue.count == 2                  # a repeat makes sure of its fan-out too


async def test_an_append_whose_answer_was_lost_still_has_its_fan_out_queued(intake_ctx, clock):
    flag = keys.fanout_queued_key(keys.topic_id(TOPIC))

    async def append(token: str, key: str = "retried") -> AppendedNotification:
        return await store.append_notification(intake_ctx.redis, TOPIC, NOTIFICATION, content_type="application/xml",
                                               now=clock(), max_len=100, publish_key=key, key_ttl=60,
                                               fan_out_flag_ttl=60, fan_out_token=token)

    first = await append("attempt")
    assert first.is_fan_out_flagged and not first.is_repeat
    # the answer was lost; the retry of the same publish (same token) must still queue the job
    retried = await append("attempt")
    assert retried.is_repeat and retried.is_fan_out_flagged and retried.sequence == first.sequence
    other = await append("another publish", key="other")
    assert not other.is_fan_out_flagged and other.sequence == first.sequence + 1   # one job is queued already
    await intake_ctx.redis.set(flag, "following")       # a worker follows the topic's log
    assert not (await append("a third", key="third")).is_fan_out_flagged
    await intake_ctx.redis.delete(flag)
    with pytest.raises(IdempotencyConflictError):       # another body: nothing stored, nothing to fan out
        await store.append_notification(intake_ctx.redis, TOPIC, b"<other/>", content_type="application/xml",
                                        now=clock(), max_len=100, publish_key="retried", key_ttl=60,
                                        fan_out_flag_ttl=60, fan_out_token="x")
    assert not await intake_ctx.redis.exists(flag)


async def test_a_retry_under_the_hubs_own_key_finds_the_first_attempt(intake_ctx, clock):
    # a publish without an Idempotency-Key is stored under a token the hub drew for it: the first
    # attempt sets the key without reading it, a retry (its answer lost) reads it and stores nothing
    async def append(token: str, *, first: bool) -> AppendedNotification:
        return await store.append_notification(intake_ctx.redis, TOPIC, NOTIFICATION, content_type="application/xml",
                                               now=clock(), max_len=100, key_ttl=60, fan_out_flag_ttl=60,
                                               fan_out_token=token, own_key=token, is_first_attempt=first)

    first = await append("p1", first=True)
    retried = await append("p1", first=False)
    assert not first.is_repeat and retried.is_repeat and retried.is_fan_out_flagged
    assert (retried.notification_id, retried.sequence) == (first.notification_id, first.sequence)
    other = await append("p2", first=True)
    assert not other.is_repeat and other.sequence == first.sequence + 1
    tid = keys.topic_id(TOPIC)
    assert await intake_ctx.redis.xlen(keys.topic_log_key(tid)) == 2
    assert 0 < await intake_ctx.redis.ttl(keys.topic_publish_key(tid, "hub.p1")) <= 60


async def test_appends_register_their_topic_and_count_each_minute_that_then_expires(intake_ctx, clock):
    # the append makes few calls for a steady publish (the topic is registered by its first entry,
    # a minute's activity gets its expiry when it is created): what the status page reads stays
    tid = keys.topic_id(TOPIC)
    for n in range(3):
        await store.append_notification(intake_ctx.redis, TOPIC, NOTIFICATION, content_type="application/xml",
                                        now=clock(), max_len=100, publish_key=f"k{n}", key_ttl=60)
    redis = intake_ctx.redis
    minute = keys.activity_key(int(clock()) // 60)
    assert await redis.smembers(keys.topics_key()) == {tid.encode()}
    assert await redis.hget(keys.topic_key(tid), "url") == TOPIC.encode()
    assert await redis.zscore(minute, tid) == 3 and await redis.zscore(minute, "*") == 3
    assert 3600 < await redis.ttl(minute) <= 3720
    assert await redis.hget(keys.stats_key(), "publishes") == b"3"

"""Subscription lifecycle through the real hub app, real Redis and a real loopback subscriber:
202 always, verification afterwards, exact echo only, renewals, secrets, unsubscription, denial."""
from __future__ import annotations

from aiohttp import web

from rsnotify.hub import keys, store
from rsnotify.hub.crypto import decrypt_secret
from tests.support.ports import free_port

TOPIC = "http://publisher.example/feeds/changes"


async def subscribe(client, callback, topic=TOPIC, **extra):
    form = {"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": callback, **extra}
    return await client.post("/", data=form)


async def active_subscription(ctx, callback, topic=TOPIC):
    return await store.get_subscription(ctx.redis, keys.subscription_id(topic, callback))


async def test_subscribe_answers_202_then_verified_echo_activates(hub_client, intake_ctx, callback_server, run_jobs,
                                                                  clock):
    callback = callback_server.url("/callback") + "?user=7&x=a%20b"
    response = await subscribe(hub_client, callback, **{"hub.lease_seconds": "3600"})
    assert response.status == 202
    assert callback_server.requests == []  # the answer never waits for verification
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "activated"
    [get] = callback_server.seen("/callback")
    assert get.method == "GET"
    assert get.raw_query.startswith("user=7&x=a%20b&")  # the callback's own query kept as sent
    assert get.query["hub.mode"] == "subscribe" and get.query["hub.topic"] == TOPIC
    assert get.query["hub.lease_seconds"] == "3600"
    assert len(get.query["hub.challenge"]) >= 40
    sub = await active_subscription(intake_ctx, callback)
    assert sub.callback == callback and sub.topic == TOPIC
    assert sub.lease_seconds == 3600 and sub.expires == int(clock()) + 3600
    assert sub.cursor == "0-0" and not sub.has_secret
    assert await intake_ctx.redis.smembers(keys.topic_subs_key(keys.topic_id(TOPIC))) == {sub.sid.encode()}


async def test_new_subscription_starts_at_the_log_end(hub_client, intake_ctx, callback_server, run_jobs, clock):
    done = await store.append_notification(intake_ctx.redis, TOPIC, b"<old/>", content_type="application/xml",
                                           now=clock(), max_len=100)
    await subscribe(hub_client, callback_server.url())
    await run_jobs(intake_ctx)
    assert (await active_subscription(intake_ctx, callback_server.url())).cursor == done.notification_id


async def test_notification_published_while_the_subscriber_answers_is_not_lost(hub_client, intake_ctx,
                                                                                callback_server, run_jobs, clock):
    published = []

    async def publish_then_echo(request):
        # The subscriber has said yes; a publish lands before the hub reads the answer.
        published.append(await store.append_notification(intake_ctx.redis, TOPIC, b"<during/>",
                                                         content_type="application/xml", now=clock(), max_len=100))
        return web.Response(text=request.query["hub.challenge"])

    callback_server.on("/callback", publish_then_echo, method="GET")
    await subscribe(hub_client, callback_server.url())
    await run_jobs(intake_ctx)
    sub = await active_subscription(intake_ctx, callback_server.url())
    assert published and sub.cursor == "0-0"  # the entry published during verification is still ahead


async def test_challenges_are_random_and_single_use(hub_client, intake_ctx, callback_server, run_jobs):
    await subscribe(hub_client, callback_server.url("/a"))
    await subscribe(hub_client, callback_server.url("/b"))
    assert intake_ctx.queue.count == 1  # one job verifies the whole line
    challenges = [c.decode() for c in await intake_ctx.redis.lrange(keys.verify_pending_key(), 0, -1)]
    assert len(set(challenges)) == 2
    await run_jobs(intake_ctx)
    sent = [r.query["hub.challenge"] for r in callback_server.requests]
    assert sorted(sent) == sorted(challenges)
    from rsnotify.hub.worker.verification import verify_intent
    again = await verify_intent(intake_ctx, challenges[0])
    assert again.result == "unknown-challenge"
    assert len(callback_server.requests) == 2  # a used challenge is never sent again


def _answer(status=200, text=None, headers=None):
    def answer(request):
        body = request.query.get("hub.challenge", "") if text is None else text
        return web.Response(status=status, text=body, headers=headers)
    return answer


async def test_only_an_exact_2xx_echo_verifies(hub_client, intake_ctx, callback_server, run_jobs):
    cases = {
        "/wrong": _answer(text="nope"),
        "/padded": lambda r: web.Response(text=r.query["hub.challenge"] + "\n"),
        "/empty": _answer(text=""),
        "/error": _answer(status=500),
        "/notfound": _answer(status=404),
        "/redirect": _answer(status=302, text="", headers={"Location": "/followed"}),
        "/accepted": _answer(status=202),  # any 2xx with the exact echo is fine
    }
    for path, answer in cases.items():
        callback_server.on(path, answer, method="GET")
        assert (await subscribe(hub_client, callback_server.url(path))).status == 202
    outcomes = {o.callback.rsplit("/", 1)[-1]: o for o in await run_jobs(intake_ctx)}
    assert outcomes["accepted"].result == "activated"
    for name in ("wrong", "padded", "empty", "error", "notfound", "redirect"):
        assert outcomes[name].result == "refused", name
        assert await active_subscription(intake_ctx, callback_server.url("/" + name)) is None
    assert callback_server.seen("/followed") == []  # redirects are never followed
    assert "302" in outcomes["redirect"].reason


async def test_unreachable_callback_changes_nothing(hub_client, intake_ctx, run_jobs):
    callback = f"http://127.0.0.1:{free_port()}/cb"
    await subscribe(hub_client, callback)
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "refused" and "unreachable" in outcome.reason
    assert await active_subscription(intake_ctx, callback) is None


async def test_slow_callback_is_cut_off_by_the_time_bound(hub_client, intake_ctx, callback_server, run_jobs):
    import asyncio

    async def slow(request):
        await asyncio.sleep(5)
        return web.Response(text=request.query["hub.challenge"])

    callback_server.on("/slow", slow, method="GET")
    intake_ctx.settings = intake_ctx.settings.with_values(fetch_timeout=0.3)
    await subscribe(hub_client, callback_server.url("/slow"))
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "refused"
    assert await active_subscription(intake_ctx, callback_server.url("/slow")) is None


async def test_renewal_updates_the_one_subscription_and_keeps_its_cursor(hub_client, intake_ctx, callback_server,
                                                                        run_jobs, clock):
    callback = callback_server.url()
    await subscribe(hub_client, callback, **{"hub.lease_seconds": "1000"})
    await run_jobs(intake_ctx)
    first = await active_subscription(intake_ctx, callback)
    await store.append_notification(intake_ctx.redis, TOPIC, b"<n/>", content_type="application/xml",
                                    now=clock(), max_len=100)
    clock.advance(500)
    await subscribe(hub_client, callback, **{"hub.lease_seconds": "2000"})
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "renewed"
    renewed = await active_subscription(intake_ctx, callback)
    assert renewed.sid == first.sid and renewed.cursor == first.cursor  # not re-started at the log end
    assert renewed.expires == int(clock()) + 2000 and renewed.created == first.created
    assert await intake_ctx.redis.zcard(keys.leases_key()) == 1
    assert await intake_ctx.redis.scard(keys.topic_subs_key(keys.topic_id(TOPIC))) == 1


async def test_failed_renewal_leaves_the_previous_state(hub_client, intake_ctx, callback_server, run_jobs, clock):
    callback = callback_server.url()
    await subscribe(hub_client, callback, **{"hub.lease_seconds": "1000", "hub.secret": "old secret"})
    await run_jobs(intake_ctx)
    before = await intake_ctx.redis.hgetall(keys.sub_key(keys.subscription_id(TOPIC, callback)))
    callback_server.on("/callback", _answer(text="not the challenge"), method="GET")
    clock.advance(10)
    await subscribe(hub_client, callback, **{"hub.lease_seconds": "5000", "hub.secret": "new secret"})
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "refused"
    assert await intake_ctx.redis.hgetall(keys.sub_key(keys.subscription_id(TOPIC, callback))) == before


async def test_verified_renewal_sets_changes_and_drops_the_secret(hub_client, intake_ctx, callback_server, run_jobs):
    callback = callback_server.url()

    async def secret_now():
        return decrypt_secret(intake_ctx.fernet, (await active_subscription(intake_ctx, callback)).secret)

    await subscribe(hub_client, callback)
    await run_jobs(intake_ctx)
    assert await secret_now() is None
    await subscribe(hub_client, callback, **{"hub.secret": "first"})
    await run_jobs(intake_ctx)
    assert await secret_now() == "first"
    await subscribe(hub_client, callback, **{"hub.secret": "second ✓"})
    await run_jobs(intake_ctx)
    assert await secret_now() == "second ✓"
    await subscribe(hub_client, callback)
    await run_jobs(intake_ctx)
    assert await secret_now() is None


async def test_secrets_are_encrypted_at_rest(hub_client, intake_ctx, callback_server, run_jobs, hub_settings):
    await subscribe(hub_client, callback_server.url(), **{"hub.secret": "s3cret-value"})
    stored_intent = [await intake_ctx.redis.hgetall(k) async for k in intake_ctx.redis.scan_iter("rsnotify:intent:*")]
    assert stored_intent and b"s3cret-value" not in repr(stored_intent).encode()
    await run_jobs(intake_ctx)
    dump = b"".join([await intake_ctx.redis.dump(k) or b"" async for k in intake_ctx.redis.scan_iter("*")])
    assert b"s3cret-value" not in dump
    sub = await active_subscription(intake_ctx, callback_server.url())
    assert decrypt_secret(intake_ctx.fernet, sub.secret) == "s3cret-value"
    key_file = hub_settings.data_path / "secret.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert "s3cret-value" not in repr(sub)


async def test_unsubscribe_is_verified_then_removes(hub_client, intake_ctx, callback_server, run_jobs):
    callback = callback_server.url()
    await subscribe(hub_client, callback)
    await run_jobs(intake_ctx)
    sid = keys.subscription_id(TOPIC, callback)
    callback_server.on("/callback", _answer(status=404), method="GET")
    form = {"hub.mode": "unsubscribe", "hub.topic": TOPIC, "hub.callback": callback}
    assert (await hub_client.post("/", data=form)).status == 202
    [refused] = await run_jobs(intake_ctx)
    assert refused.result == "refused" and await active_subscription(intake_ctx, callback) is not None
    callback_server.answers.clear()
    assert (await hub_client.post("/", data=form)).status == 202
    [done] = await run_jobs(intake_ctx)
    assert done.result == "unsubscribed"
    assert callback_server.requests[-1].query["hub.mode"] == "unsubscribe"
    assert "hub.lease_seconds" not in callback_server.requests[-1].query
    assert await active_subscription(intake_ctx, callback) is None
    assert await intake_ctx.redis.zscore(keys.leases_key(), sid) is None
    assert await intake_ctx.redis.scard(keys.topic_subs_key(keys.topic_id(TOPIC))) == 0


async def test_unknown_parameters_are_ignored(hub_client, intake_ctx, callback_server, run_jobs):
    response = await subscribe(hub_client, callback_server.url(), **{"hub.extra": "x", "utm": "y"})
    assert response.status == 202
    [outcome] = await run_jobs(intake_ctx)
    assert outcome.result == "activated"


async def test_a_burst_of_requests_queues_one_verification_job(hub_client, intake_ctx, callback_server, run_jobs):
    for i in range(30):
        assert (await subscribe(hub_client, callback_server.url(f"/cb{i}"))).status == 202
    assert intake_ctx.queue.count == 1
    outcomes = await run_jobs(intake_ctx)
    assert sorted(o.result for o in outcomes) == ["activated"] * 30
    assert await store.count_subscriptions(intake_ctx.redis) == 30
    assert await store.pending_verifications(intake_ctx.redis) == 0
    await subscribe(hub_client, callback_server.url("/late"))  # after the job started: a job of its own
    assert intake_ctx.queue.count == 1
    [late] = await run_jobs(intake_ctx)
    assert late.result == "activated"

"""A worker's verification lane on its Redis steps: the intent read in the call that takes its
challenge, the activation ending the challenge in the same script, every write of the lane on the
worker's one pipeline (so answers apply in the order they came), and the "job queued" flag that
a busy lane leaves set. A real worker context (real Redis, the worker's RedisBatcher), and real
subscribers on 127.0.0.1."""
from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from redis.exceptions import ResponseError

from rsnotify.hub import keys, store
from rsnotify.hub.records import Intent
from rsnotify.hub.worker import verification, verifying

TOPIC = "http://publisher.example/feeds/lane"
# a script that keeps Redis busy ~0.3-1 s: the worker's pipeline waits behind it meanwhile
SLOW = "local i = 0 while i < 30000000 do i = i + 1 end return 1"


async def line_up(ctx, challenge: str, intent: Intent) -> bool:
    return await store.queue_intent(ctx.redis, challenge, intent, ttl=60, batch=ctx.batch)


async def counted(ctx, result: str) -> int:
    return int(await ctx.redis.hget(keys.stats_key(), keys.verification_field(result)) or 0)


async def test_the_activation_ends_its_challenge_and_counts_it(fanout_hub, callback_server) -> None:
    ctx = fanout_hub.ctx
    wid = ctx.verifying.wid
    intent = Intent("subscribe", TOPIC, callback_server.url("/cb"), lease_seconds=600)
    assert await line_up(ctx, "challenge-one", intent)
    [(challenge, taken)] = await store.take_challenges(ctx.redis, wid, 10)
    assert (challenge, taken) == ("challenge-one", intent)      # read in the call that took it

    outcome = await verification.verify(ctx, challenge, taken, taken_by=wid, batch=ctx.batch)

    assert outcome.result == "activated"
    [get] = callback_server.verifications("/cb")
    assert get.query["hub.challenge"] == "challenge-one"
    assert (await store.get_subscription(ctx.redis, outcome.subscription_id)).lease_seconds == 600
    assert await ctx.redis.lrange(keys.verify_taken_key(wid), 0, -1) == []
    assert not await ctx.redis.exists(keys.intent_key(challenge))     # single use
    assert await counted(ctx, "activated") == 1


async def test_a_failed_activation_leaves_the_challenge_taken_and_uncounted(fanout_hub, callback_server) -> None:
    ctx = fanout_hub.ctx
    wid = ctx.verifying.wid
    intent = Intent("subscribe", TOPIC, callback_server.url("/cb"), lease_seconds=600)
    sid = keys.subscription_id(TOPIC, intent.callback)
    await ctx.redis.set(keys.sub_key(sid), "not a hash")   # the activation script fails on its first write
    await line_up(ctx, "challenge-two", intent)
    [(challenge, taken)] = await store.take_challenges(ctx.redis, wid, 10)

    with pytest.raises(ResponseError):
        await verification.verify(ctx, challenge, taken, taken_by=wid, batch=ctx.batch)

    # still this worker's to verify again (or the line's, once it stops): nothing lost, nothing counted
    assert await ctx.redis.lrange(keys.verify_taken_key(wid), 0, -1) == [b"challenge-two"]
    assert await ctx.redis.exists(keys.intent_key(challenge))
    assert await counted(ctx, "activated") == 0 and await counted(ctx, "renewed") == 0


async def test_an_unsubscribe_answered_after_the_subscribe_is_applied_after_it(fanout_hub, callback_server) -> None:
    """The subscribe's activation waits for the worker's pipeline (a slow script holds it); the
    unsubscribe, answered later, must not overtake it: the subscription ends removed."""
    ctx = fanout_hub.ctx
    wid = ctx.verifying.wid
    callback = callback_server.url("/cb")
    subscribe_answered = asyncio.Event()
    slow: list[asyncio.Future] = []

    async def answer(request: web.Request) -> web.Response:
        if request.query["hub.mode"] == "subscribe":
            slow.append(ctx.batch.execute("EVAL", SLOW, 0))   # the pipeline is busy when the echo arrives
            subscribe_answered.set()
        else:
            await subscribe_answered.wait()
            await asyncio.sleep(0.05)
        return web.Response(text=request.query["hub.challenge"])

    callback_server.on("/cb", answer, method="GET")
    await line_up(ctx, "challenge-sub", Intent("subscribe", TOPIC, callback, lease_seconds=600))
    await line_up(ctx, "challenge-unsub", Intent("unsubscribe", TOPIC, callback))
    taken = dict(await store.take_challenges(ctx.redis, wid, 10))
    # connections to spare, as a busy worker has: a command sent outside the pipeline would leave at once
    await asyncio.gather(*(ctx.redis.ping() for _ in range(4)))

    sub, unsub = await asyncio.gather(
        *(verification.verify(ctx, c, i, taken_by=wid, batch=ctx.batch) for c, i in taken.items() if i))

    assert (sub.result, unsub.result) == ("activated", "unsubscribed")
    assert slow and slow[0].done()
    assert await store.get_subscription(ctx.redis, keys.subscription_id(TOPIC, callback)) is None
    assert await store.count_subscriptions(ctx.redis) == 0
    assert await ctx.redis.lrange(keys.verify_taken_key(wid), 0, -1) == []


async def test_a_busy_lane_needs_no_job_and_an_idle_one_lets_the_next_request_queue_one(
        fanout_hub, callback_server, monkeypatch) -> None:
    ctx = fanout_hub.ctx
    monkeypatch.setattr(verifying, "LINGER", 5.0)      # busy throughout the burst, however loaded the machine
    lane = asyncio.get_running_loop().create_task(verifying.run_lane(ctx))
    try:
        jobs_wanted = []
        for i in range(40):        # a request every ~20 ms: the lane finds the line empty between them
            intent = Intent("subscribe", TOPIC, callback_server.url(f"/cb/{i}"), lease_seconds=600)
            jobs_wanted.append(await line_up(ctx, f"challenge-{i}", intent))
            if jobs_wanted[-1]:
                ctx.verifying.wake()            # what the queued verify_pending job does
            await asyncio.sleep(0.02)
        await wait_for(lambda: store.count_subscriptions(ctx.redis), 40)
        # the first request queued the one job; the busy lane saw the rest without any
        assert jobs_wanted == [True] + [False] * 39

        monkeypatch.setattr(verifying, "LINGER", 0.0)
        await asyncio.sleep(0.5)                            # the lane has gone idle
        late = Intent("subscribe", TOPIC, callback_server.url("/cb/late"), lease_seconds=600)
        assert await line_up(ctx, "challenge-late", late)  # so this request queues a job
        ctx.verifying.wake()
        await wait_for(lambda: store.count_subscriptions(ctx.redis), 41)
    finally:
        lane.cancel()
        with pytest.raises(asyncio.CancelledError):
            await lane


async def wait_for(read, expected: int, within: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while (seen := await read()) != expected:
        assert asyncio.get_running_loop().time() < deadline, f"{seen} of {expected}"
        await asyncio.sleep(0.01)

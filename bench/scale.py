"""Scale: many subscriptions over many topics: Redis memory used, and the fan-out rate of one
topic with 1,000 subscribers among them.

The background subscriptions are stored with `hub.store.activate_subscription`, the very call
the hub's verification makes once a callback echoed its challenge (a WebSub round trip for each
of 100,000 would only re-measure the subscribe scenario); the measured topic's subscribers
subscribe through the hub for real.
"""
from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis

from rsnotify.hub import keys, store

from .scenarios import Bench, fanout_run, setup_topic

SEED_BATCH = 200
SAMPLE = 50  # subscriptions whose keys are sized with MEMORY USAGE


async def used_memory(redis: Redis) -> int:
    info = await redis.info("memory")
    return int(info["used_memory"])


async def dataset_memory(redis: Redis) -> int:
    """Redis's own count of the bytes its data takes (used_memory less clients, buffers, startup)."""
    return int((await redis.info("memory"))["used_memory_dataset"])


async def subscription_bytes(redis: Redis, topic: str, callbacks: list[str]) -> float:
    """Mean bytes (MEMORY USAGE) of a subscription's own keys: its hash and every delivery key."""
    sample = callbacks[:SAMPLE]
    total = 0
    for callback in sample:
        sid = keys.subscription_id(topic, callback)
        for key in (keys.sub_key(sid), *keys.delivery_keys(sid)):
            total += await redis.memory_usage(key) or 0
    return total / max(1, len(sample))


async def seed_subscriptions(redis_url: str, bench: Bench, count: int, topics: int) -> float:
    """`count` active subscriptions spread evenly over `topics` topics; seconds taken. The seeding
    client (and the query buffers of its connections) is closed before anything is measured."""
    now = time.time()
    started = time.perf_counter()
    redis = Redis.from_url(redis_url, max_connections=SEED_BATCH)
    try:
        for first in range(0, count, SEED_BATCH):
            await asyncio.gather(*(
                store.activate_subscription(redis, f"http://bench.example.org/scale/{i % topics}",
                                            bench.sink.url(f"scale-{i % topics}-{i}"), secret="",
                                            lease_seconds=864000, now=now)
                for i in range(first, min(count, first + SEED_BATCH))))
    finally:
        await redis.aclose()
    return time.perf_counter() - started


async def scenario_scale(bench: Bench) -> list[dict]:
    s = bench.sizes
    hub = bench.start_hub()
    redis: Redis | None = None
    try:
        await hub.wait_ready(bench.session)
        background = s.scale_subscriptions - s.scale_hot_subscribers
        memory: dict[str, float] = {}
        if hub.redis_url:
            redis = Redis.from_url(hub.redis_url, max_connections=1)
            before = await used_memory(redis)
            seeded_in = await seed_subscriptions(hub.redis_url, bench, background, max(1, s.scale_topics - 1))
        else:
            seeded_in = float("nan")  # a hub given by URL only: its Redis is out of reach
        topic, names, subscribed_in = await setup_topic(bench, hub, "scale-hot", s.scale_hot_subscribers)
        total = (await hub.health(bench.session))["subscriptions"]
        if redis is not None:
            after = await used_memory(redis)
            memory = {"used_memory_mb": round(after / 2**20, 2), "subscriptions_mb": round((after - before) / 2**20, 2),
                      "dataset_mb": round(await dataset_memory(redis) / 2**20, 2),
                      "bytes_per_subscription": round((after - before) / max(1, total))}
        results = []
        idle_topic = "http://bench.example.org/scale/0"
        stride = max(1, s.scale_topics - 1)  # seed_subscriptions' topic count
        idle_callbacks = [bench.sink.url(f"scale-0-{i}") for i in range(0, min(background, SAMPLE * stride), stride)]
        hot_callbacks = [bench.sink.url(n) for n in names]
        for run in range(1, s.runs + 1):
            result = await fanout_run(bench, hub, topic, names, s.scale_notifications, run, scenario="scale")
            result.update(memory, subscriptions=total, topics=(await hub.health(bench.session))["topics"],
                          seed_seconds=round(seeded_in, 2), hot_subscribe_seconds=round(subscribed_in, 2))
            if redis is not None:
                used = await used_memory(redis)
                idle = await subscription_bytes(redis, idle_topic, idle_callbacks) if background else 0.0
                active = await subscription_bytes(redis, topic, hot_callbacks)
                # every subscription as the measured topic's are now (delivery state and history kept)
                projected = used + (active - idle) * background
                result.update(used_memory_after_mb=round(used / 2**20, 2), idle_subscription_bytes=round(idle),
                              active_subscription_bytes=round(active), deliveries_per_subscription=(
                                  1 + run * s.scale_notifications),
                              projected_all_active_mb=round(projected / 2**20, 1))
            bench.emit(result)
            results.append(result)
        return results
    finally:
        if redis is not None:
            await redis.aclose()
        hub.stop()

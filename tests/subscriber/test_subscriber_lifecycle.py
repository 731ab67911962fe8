"""The subscription lifecycle: intent before POST, secrets, callback URLs, hub redirects,
refusals, renewal on an injected clock, verified unsubscribe, state across a restart."""
from __future__ import annotations

import asyncio
import random
import stat
from datetime import timedelta

import pytest
from aiohttp import web

from rsnotify.subscriber.client import Subscriber
from rsnotify.subscriber.discovery import discover_topic
from rsnotify.subscriber.errors import SubscriberError, SubscriptionError
from rsnotify.subscriber.settings import SubscriberSettings
from rsnotify.subscriber.store import (
    ACTIVE,
    EXPIRED,
    FAILED,
    UNSUBSCRIBED,
    JsonFileStore,
    MemoryStore,
)
from rsnotify.websub import build_link_header
from tests.support.clock import Clock
from tests.support.ports import free_port

from .conftest import T0, Recorder, make_notification

TOPIC = "http://example.com/dataset1/change/"


async def test_intent_is_recorded_before_the_post_so_a_hub_may_verify_at_once(fake_hub, make_subscriber):
    fake_hub.mode = "verify-before"  # like websub.rocks: verifies before answering the POST
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    assert fake_hub.verifications[0].status == 200
    assert subscription.status == ACTIVE


async def test_each_subscription_gets_its_own_unguessable_callback_and_strong_secret(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    first = await subscriber.subscribe(TOPIC, fake_hub.url)
    second = await subscriber.subscribe(TOPIC, fake_hub.url)
    assert first.callback != second.callback
    for subscription in (first, second):
        assert subscription.callback.startswith(subscriber.callback_base_url + "/")
        assert len(subscription.callback.rsplit("/", 1)[1]) >= 43  # 256 random bits
        assert len(subscription.secret) >= 43
    assert first.secret != second.secret
    assert fake_hub.requests[0]["hub.secret"] == first.secret
    assert "secret" not in repr(first).replace("has_secret", "")


async def test_given_secret_is_used_and_an_oversized_one_refused(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url, secret="my own secret")
    assert fake_hub.requests[-1]["hub.secret"] == "my own secret" == subscription.secret
    with pytest.raises(SubscriptionError, match="less than 200 bytes"):
        await subscriber.subscribe(TOPIC, fake_hub.url, secret="x" * 200)


@pytest.mark.parametrize("status", [307, 308])
async def test_hub_redirect_is_followed_and_remembered(fake_hub, make_subscriber, status):
    fake_hub.redirect = status
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    assert fake_hub.request_paths == ["/hub", "/hub2"]
    assert fake_hub.requests[1]["hub.callback"] == subscription.callback
    assert subscription.hub.endswith("/hub2") and subscription.status == ACTIVE
    await subscriber.unsubscribe(subscription)
    assert fake_hub.request_paths[-1] == "/hub2"


async def test_hub_refusal_raises_with_status_and_reason(fake_hub, make_subscriber):
    fake_hub.mode = "refuse"
    subscriber = await make_subscriber()
    with pytest.raises(SubscriptionError) as caught:
        await subscriber.subscribe(TOPIC, fake_hub.url)
    assert caught.value.status == 400
    assert "not served by this hub" in str(caught.value)
    [stored] = await subscriber.subscriptions()
    assert stored.status == FAILED


async def test_unverified_subscription_times_out_with_a_hint(fake_hub, make_subscriber):
    fake_hub.mode = "no-verify"
    subscriber = await make_subscriber(settings=SubscriberSettings(verification_timeout=0.3))
    with pytest.raises(SubscriptionError, match="did not verify.*reachable"):
        await subscriber.subscribe(TOPIC, fake_hub.url)


async def test_bad_urls_are_refused_before_anything_is_sent(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    with pytest.raises(SubscriptionError, match="topic must be an absolute http"):
        await subscriber.subscribe("ftp://example.com/x", fake_hub.url)
    subscriber.callback_base_url = None
    with pytest.raises(SubscriberError, match="callback base URL"):
        await subscriber.subscribe(TOPIC, fake_hub.url)
    assert fake_hub.requests == []


async def test_renewal_happens_before_the_lease_ends_with_jitter(fake_hub, make_subscriber):
    clock = Clock(T0)
    subscriber = await make_subscriber(now=clock, rng=random.Random(1))
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    lease = timedelta(seconds=600)
    assert subscription.expires_at == T0 + lease
    assert T0 + lease * 0.75 <= subscription.renew_at <= T0 + lease * 0.9
    other = await (await make_subscriber(now=clock, rng=random.Random(2))).subscribe(TOPIC, fake_hub.url)
    assert other.renew_at != subscription.renew_at  # jitter: not everyone renews at once

    clock.set(subscription.renew_at - timedelta(seconds=1))
    assert await subscriber.renew_due() == []
    assert len(fake_hub.requests) == 2

    clock.set(subscription.renew_at + timedelta(seconds=1))
    assert len(await subscriber.renew_due()) == 1
    await fake_hub.settle()
    renewal = fake_hub.requests[-1]
    assert renewal["hub.mode"] == "subscribe"
    assert renewal["hub.callback"] == subscription.callback  # same callback: the hub keeps its place
    assert renewal["hub.secret"] == subscription.secret
    [stored] = await subscriber.subscriptions()
    assert stored.status == ACTIVE and stored.pending_mode is None
    assert stored.verified_at == clock.peek() and stored.expires_at == clock.peek() + lease
    assert clock.peek() < stored.renew_at < stored.expires_at


async def test_failed_renewal_is_retried_and_an_ended_lease_marked_expired(fake_hub, make_subscriber):
    clock = Clock(T0)
    subscriber = await make_subscriber(now=clock, settings=SubscriberSettings(
        verification_timeout=5, renew_retry_seconds=30))
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    fake_hub.mode = "refuse"
    clock.set(subscription.renew_at)
    [retry] = await subscriber.renew_due()
    assert retry.renew_at == clock.peek() + timedelta(seconds=30) and retry.pending_mode is None
    clock.set(subscription.expires_at + timedelta(seconds=1))
    await subscriber.renew_due()
    [stored] = await subscriber.subscriptions()
    assert stored.status == EXPIRED  # and still being renewed:
    fake_hub.mode = "verify-after"
    clock.advance(31)
    await subscriber.renew_due()
    await fake_hub.settle()
    [stored] = await subscriber.subscriptions()
    assert stored.status == ACTIVE


async def test_unsubscribe_is_verified(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    ended = await subscriber.unsubscribe(subscription)
    assert ended.status == UNSUBSCRIBED
    form = fake_hub.requests[-1]
    assert form["hub.mode"] == "unsubscribe" and form["hub.callback"] == subscription.callback
    assert "hub.secret" not in form
    await fake_hub.settle()
    unsubscribe_check = fake_hub.verifications[-1]
    assert unsubscribe_check.query["hub.mode"] == "unsubscribe" and unsubscribe_check.status == 200
    assert subscription.callback not in fake_hub.subscriptions
    with pytest.raises(SubscriptionError, match="no subscription"):
        await subscriber.unsubscribe("unknown-subscription-id")


async def test_state_survives_a_restart(fake_hub, make_subscriber, tmp_path):
    path = tmp_path / "state" / "subscriptions.json"
    first = await make_subscriber(JsonFileStore(path))
    subscription = await first.subscribe(TOPIC, fake_hub.url)
    port = first.test_server.port
    await first.close()
    await first.test_server.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds secrets

    recorder = Recorder()
    second = await make_subscriber(JsonFileStore(path), port=port, on_notification=recorder)
    [restored] = await second.subscriptions()
    assert restored == subscription.evolve(recent_ids=restored.recent_ids)
    status, _ = await fake_hub.deliver(subscription.callback, make_notification(), sequence=1)
    assert status == 403  # the secret survived
    status, _ = await fake_hub.deliver(subscription.callback, make_notification(), secret=subscription.secret,
                                       notification_id="n-1", sequence=1)
    assert status == 200
    await recorder.wait(1)
    assert (await second.unsubscribe(subscription.id)).status == UNSUBSCRIBED


async def test_a_cancelled_close_stops_at_once_and_can_be_called_again():
    """A shutdown that cancels close() (a timeout around it, a runner cancelling every task) is
    obeyed while close() waits for the renewal loop to end, instead of being taken for the
    renewal loop's own cancellation and ignored."""
    subscriber = Subscriber(f"http://127.0.0.1:{free_port()}/websub", MemoryStore())
    await subscriber.start()                        # the renewal loop runs
    await asyncio.sleep(0)
    closing = asyncio.create_task(subscriber.close())
    await asyncio.sleep(0)                          # close() has cancelled the renewal loop and waits for it
    assert not closing.done()
    closing.cancel()
    await asyncio.wait({closing}, timeout=5)
    assert closing.cancelled()
    await asyncio.wait_for(subscriber.close(), 5)  # a second close finishes the job (closes the session)


async def test_corrupt_state_file_is_reported_clearly(tmp_path):
    path = tmp_path / "subscriptions.json"
    path.write_text("{not json")
    with pytest.raises(SubscriberError, match="unreadable"):
        await JsonFileStore(path).all()


async def test_renewal_discovers_again_and_follows_a_moved_topic(fake_hub, make_subscriber, aiohttp_server):
    advertised = {"self": "http://example.com/old-topic"}

    async def topic(request):
        return web.Response(content_type="application/xml", headers={
            "Link": build_link_header([(advertised["self"], "self"), (fake_hub.url, "hub")])})

    app = web.Application()
    app.router.add_get("/topic", topic)
    topic_url = str((await aiohttp_server(app)).make_url("/topic"))
    clock = Clock(T0)
    subscriber = await make_subscriber(now=clock)
    found = await discover_topic(subscriber.session, topic_url)
    old = await subscriber.subscribe(found.topic, found.hubs[0], discovered_from=found.discovered_from,
                                     discovery=found.discovery)
    assert old.topic == "http://example.com/old-topic"

    clock.set(old.renew_at)  # nothing moved: a plain renewal of the same callback
    [same] = await subscriber.renew_due()
    await fake_hub.settle()
    assert same.id == old.id and fake_hub.requests[-1]["hub.callback"] == old.callback

    advertised["self"] = "http://example.com/new-topic"  # the publisher moved the topic (§6.1)
    clock.set((await subscriber.store.get(old.id)).renew_at)
    [moved] = await subscriber.renew_due()
    await fake_hub.settle()
    assert moved.topic == "http://example.com/new-topic" and moved.callback != old.callback
    by_mode = {form["hub.mode"]: form for form in fake_hub.requests[-2:]}
    assert by_mode["subscribe"]["hub.topic"] == "http://example.com/new-topic"
    assert by_mode["unsubscribe"]["hub.callback"] == old.callback
    states = {s.topic: s.status for s in await subscriber.subscriptions()}
    assert states == {"http://example.com/old-topic": UNSUBSCRIBED, "http://example.com/new-topic": ACTIVE}

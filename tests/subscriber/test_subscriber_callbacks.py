"""The callback core seen from a hub: verification, denial, signatures, repeats, gaps, bounds."""
from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from rsnotify.subscriber.errors import SubscriptionDeniedError
from rsnotify.subscriber.settings import SubscriberSettings
from rsnotify.subscriber.store import DENIED

from .conftest import T0, Recorder, make_notification

TOPIC = "http://example.com/dataset1/change/"


async def test_verification_echoes_the_challenge_exactly_as_text_plain(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url, lease_seconds=900)
    await fake_hub.settle()
    [verification] = fake_hub.verifications
    assert verification.status == 200
    assert verification.body == verification.query["hub.challenge"]
    assert verification.content_type == "text/plain"
    assert subscription.status == "active"
    assert subscription.lease_seconds == 600  # what the hub granted, not what was asked
    assert fake_hub.requests[0]["hub.lease_seconds"] == "900"


async def test_verification_for_an_unknown_topic_is_refused_with_404(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    renewal = subscription.evolve(pending_mode="subscribe")
    await subscriber.store.put(renewal)  # even with an intent pending, the topic must match
    verification = await fake_hub.verify(subscription.callback, {
        "hub.mode": "subscribe", "hub.topic": "http://example.com/other/", "hub.challenge": "abc",
        "hub.lease_seconds": "600"})
    assert verification.status == 404
    assert "abc" not in verification.body


async def test_verification_without_a_pending_intent_is_refused_with_404(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    # verified already, nothing pending: an unsubscribe it never asked for, or a subscribe to
    # another topic at this callback, is refused (a repeated subscribe of the same topic is
    # confirmed: tests/subscriber/test_repeated_verification.py)
    for mode, topic in (("unsubscribe", TOPIC), ("subscribe", "http://example.com/other/")):
        verification = await fake_hub.verify(subscription.callback, {
            "hub.mode": mode, "hub.topic": topic, "hub.challenge": "abc", "hub.lease_seconds": "600"})
        assert verification.status == 404
    assert (await subscriber.store.get(subscription.id)).status == "active"
    unknown = subscriber.callback_base_url + "/" + "x" * 43
    verification = await fake_hub.verify(unknown, {"hub.mode": "subscribe", "hub.topic": TOPIC,
                                                   "hub.challenge": "abc"})
    assert verification.status == 404


async def test_a_repeated_subscribe_verification_of_a_wanted_subscription_is_confirmed(fake_hub, make_subscriber):
    # Issue 21 item 7: a hub may verify an active subscription again (same topic, same
    # callback), e.g. a renewal it started itself; the callback still wants it, so it says yes
    # and takes the new lease. One it ended, or another topic, stays refused.
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    verification = await fake_hub.verify(subscription.callback, {
        "hub.mode": "subscribe", "hub.topic": TOPIC, "hub.challenge": "again", "hub.lease_seconds": "900"})
    assert (verification.status, verification.body) == (200, "again")
    renewed = await subscriber.store.get(subscription.id)
    assert renewed.status == "active" and renewed.lease_seconds == 900
    assert renewed.expires_at == renewed.verified_at + timedelta(seconds=900)
    assert renewed.verified_at >= subscription.verified_at
    other = await fake_hub.verify(subscription.callback, {
        "hub.mode": "subscribe", "hub.topic": "http://example.com/other/", "hub.challenge": "abc"})
    assert other.status == 404
    await subscriber.unsubscribe(subscription)
    after_end = await fake_hub.verify(subscription.callback, {
        "hub.mode": "subscribe", "hub.topic": TOPIC, "hub.challenge": "abc", "hub.lease_seconds": "600"})
    assert after_end.status == 404
    assert (await subscriber.store.get(subscription.id)).status == "unsubscribed"


async def test_denial_is_recorded_and_reported(fake_hub, make_subscriber):
    recorder = Recorder()
    subscriber = await make_subscriber(on_denial=recorder.denied)
    fake_hub.mode = "deny"
    with pytest.raises(SubscriptionDeniedError, match="topic not allowed"):
        await subscriber.subscribe(TOPIC, fake_hub.url)
    await recorder.wait(1)
    [denied] = recorder.denials
    assert denied.status == DENIED and denied.denial_reason == "topic not allowed"
    [stored] = await subscriber.subscriptions()
    assert stored.status == DENIED
    await fake_hub.settle()
    assert fake_hub.verifications[0].status == 200


@pytest.mark.parametrize("algorithm", ["sha1", "sha256", "sha384", "sha512"])
async def test_valid_signature_is_accepted_with_every_algorithm(fake_hub, make_subscriber, algorithm):
    recorder = Recorder()
    subscriber = await make_subscriber(on_notification=recorder)
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    await fake_hub.settle()
    secret = fake_hub.subscriptions[subscription.callback].secret
    assert secret == subscription.secret
    body = make_notification()
    status, _ = await fake_hub.deliver(subscription.callback, body, secret=secret, algorithm=algorithm)
    assert status == 200
    await recorder.wait(1)
    assert recorder.received[0].body == body
    assert recorder.received[0].notification.changes[0].loc == "http://example.com/res1"


@pytest.mark.parametrize("signature", [None, "sha256=" + "0" * 64, "md5=abc", "garbage"])
async def test_missing_or_wrong_signature_is_refused_and_never_seen(fake_hub, make_subscriber, signature):
    recorder = Recorder()
    subscriber = await make_subscriber(on_notification=recorder)
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    status, reply = await fake_hub.deliver(subscription.callback, make_notification(), signature=signature)
    assert status == 403
    assert "X-Hub-Signature" in reply
    # A signature made with another secret is refused too.
    status, _ = await fake_hub.deliver(subscription.callback, make_notification(), secret="not-the-secret")
    assert status == 403
    await subscriber.drain(2)
    assert recorder.received == []


async def test_subscription_without_secret_takes_unsigned_deliveries(fake_hub, make_subscriber):
    recorder = Recorder()
    subscriber = await make_subscriber(on_notification=recorder)
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url, secret=False)
    assert "hub.secret" not in fake_hub.requests[0]
    status, _ = await fake_hub.deliver(subscription.callback, make_notification())
    assert status == 200
    await recorder.wait(1)


async def test_repeated_notification_id_is_acknowledged_but_dropped(fake_hub, make_subscriber):
    recorder = Recorder()
    subscriber = await make_subscriber(on_notification=recorder)
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    body = make_notification()
    for _ in range(3):
        status, _ = await fake_hub.deliver(subscription.callback, body, secret=subscription.secret,
                                           notification_id="n-1", sequence=1)
        assert status == 200
    await subscriber.drain(2)
    assert [r.notification_id for r in recorder.received] == ["n-1"]


async def test_gaps_in_sequence_and_interval_chain_are_reported(fake_hub, make_subscriber):
    recorder = Recorder()
    subscriber = await make_subscriber(on_notification=recorder)
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    deliveries = [  # (sequence, from): 1 and 2 chain; 5 skips 3..4 and an interval
        (1, T0), (2, T0 + timedelta(minutes=10)), (5, T0 + timedelta(minutes=40)),
    ]
    for sequence, start in deliveries:
        status, _ = await fake_hub.deliver(subscription.callback, make_notification(start),
                                           secret=subscription.secret, notification_id=f"n-{sequence}",
                                           sequence=sequence)
        assert status == 200
    await recorder.wait(3)
    first, second, third = recorder.received
    assert first.gaps == () and second.gaps == ()
    kinds = {gap.kind: gap.message for gap in third.gaps}
    assert "3..4 missing" in kinds["sequence"]
    assert "2024-05-01T12:20:00Z" in kinds["interval"] and "12:40:00Z" in kinds["interval"]


async def test_other_content_types_are_handed_over_as_bytes(fake_hub, make_subscriber):
    recorder = Recorder()
    subscriber = await make_subscriber(on_notification=recorder)
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    status, _ = await fake_hub.deliver(subscription.callback, b'{"hello": 1}', secret=subscription.secret,
                                       content_type="application/json")
    assert status == 200
    await recorder.wait(1)
    [received] = recorder.received
    assert received.notification is None and received.body == b'{"hello": 1}'
    assert received.to_json()["content_type"] == "application/json"


async def test_invalid_change_notification_is_reported_with_its_problems(fake_hub, make_subscriber):
    recorder = Recorder()
    subscriber = await make_subscriber(on_notification=recorder)
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    body = make_notification().replace(b'change="updated"', b'change="moved"')
    status, _ = await fake_hub.deliver(subscription.callback, body, secret=subscription.secret)
    assert status == 200  # received; the Source's mistake is the application's to see
    await recorder.wait(1)
    assert recorder.received[0].notification is None
    assert any("moved" in problem for problem in recorder.received[0].problems)


async def test_body_over_the_limit_is_refused_with_413(fake_hub, make_subscriber):
    recorder = Recorder()
    subscriber = await make_subscriber(on_notification=recorder,
                                       settings=SubscriberSettings(max_body_bytes=1000, verification_timeout=5))
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    status, reply = await fake_hub.deliver(subscription.callback, b"<x/>" * 1000, secret=subscription.secret)
    assert status == 413 and "1000" in reply
    await subscriber.drain(2)
    assert recorder.received == []


async def test_slow_application_never_makes_the_hub_wait(fake_hub, make_subscriber):
    release = asyncio.Event()
    seen = []

    async def slow(received):
        await release.wait()
        seen.append(received.notification_id)

    subscriber = await make_subscriber(on_notification=slow)
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    for n in (1, 2):
        status, _ = await asyncio.wait_for(fake_hub.deliver(
            subscription.callback, make_notification(T0 + timedelta(minutes=10 * n)),
            secret=subscription.secret, notification_id=f"n-{n}", sequence=n), 2)
        assert status == 200
    assert seen == []
    release.set()
    await subscriber.drain(2)
    assert seen == ["n-1", "n-2"]  # in order


async def test_plain_function_handler_runs_too(fake_hub, make_subscriber):
    seen = []
    subscriber = await make_subscriber(on_notification=lambda received: seen.append(received.sequence))
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    await fake_hub.deliver(subscription.callback, make_notification(), secret=subscription.secret, sequence=7)
    await subscriber.drain(2)
    assert seen == [7]


async def test_head_and_other_methods_change_nothing(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    await subscriber.store.put(subscription.evolve(pending_mode="unsubscribe"))
    query = {"hub.mode": "unsubscribe", "hub.topic": TOPIC, "hub.challenge": "c"}
    async with fake_hub.session.head(subscription.callback, params=query) as response:
        assert response.status == 405
    async with fake_hub.session.put(subscription.callback, data=b"x") as response:
        assert response.status == 405
    assert (await subscriber.store.get(subscription.id)).status == "active"


async def test_delivery_after_unsubscribe_gets_410(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    await subscriber.unsubscribe(subscription)
    status, _ = await fake_hub.deliver(subscription.callback, make_notification(), secret=subscription.secret)
    assert status == 410

"""The toolkit as an application uses it: idempotent ensure, follow, subscribing once the server
listens, hooks, and ack="after_handler", against the loopback fake hub of conftest.py."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from rsnotify.subscriber import DiscoveryError, Subscriber, discover, discover_topic
from rsnotify.subscriber.callback.aiohttp_adapter import (
    add_callback_routes,
    subscriber_context,
)
from rsnotify.subscriber.errors import SettingsError, SubscriptionDeniedError
from rsnotify.subscriber.settings import SubscriberSettings
from rsnotify.subscriber.store import MemoryStore
from rsnotify.websub import build_link_header
from tests.support.ports import free_port
from tests.support.sources import source_documents

from .conftest import T0, make_notification

TOPIC = "http://example.com/dataset1/change/"


async def test_ensure_reuses_the_stored_subscription_across_restarts(fake_hub, make_subscriber):
    store = MemoryStore()
    first = await make_subscriber(store)
    made = await first.ensure(TOPIC, fake_hub.url, wait=True)
    # A restart: a new Subscriber on the same store and callback base URL.
    second = Subscriber(first.callback_base_url, store, settings=first.settings)
    await second.start(renew=False)
    try:
        reused = await second.ensure(TOPIC, fake_hub.url)
    finally:
        await second.close()
    assert reused.id == made.id and reused.callback == made.callback and reused.secret == made.secret
    assert [s.id for s in await store.all()] == [made.id]
    assert [form["hub.callback"] for form in fake_hub.requests] == [made.callback, made.callback]


async def test_ensure_unsubscribes_duplicates_left_by_subscribe_at_every_start(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    one = await subscriber.subscribe(TOPIC, fake_hub.url)
    two = await subscriber.subscribe(TOPIC, fake_hub.url)
    kept = await subscriber.ensure(TOPIC, fake_hub.url, wait=True)
    await fake_hub.settle()
    assert kept.id in (one.id, two.id)
    assert list(fake_hub.subscriptions) == [kept.callback]  # the hub holds one
    statuses = {s.id: s.status for s in await subscriber.subscriptions()}
    assert sorted(statuses.values()) == ["active", "unsubscribed"]


async def test_ensure_for_another_topic_makes_a_new_subscription(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    one = await subscriber.ensure(TOPIC, fake_hub.url, wait=True)
    other = await subscriber.ensure("http://example.com/dataset2/change/", fake_hub.url, wait=True)
    assert other.id != one.id and len(fake_hub.subscriptions) == 2


async def test_ensure_when_listening_waits_for_the_server_to_bind(fake_hub):
    port = free_port()
    base = f"http://127.0.0.1:{port}/websub"
    subscriber = Subscriber(base, MemoryStore(), settings=SubscriberSettings(verification_timeout=5))
    subscriber.ensure_when_listening(TOPIC, fake_hub.url)   # before start, as module-level code does
    app = web.Application()
    add_callback_routes(app, subscriber.core, "/websub")
    app.cleanup_ctx.append(subscriber_context(subscriber))
    runner = web.AppRunner(app)
    await runner.setup()   # the subscriber starts here, before the site binds
    try:
        [task] = subscriber.startup_tasks
        await asyncio.sleep(0.3)
        assert not task.done() and fake_hub.requests == []  # nothing asked of the hub yet
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        subscription = await asyncio.wait_for(task, 10)
        await fake_hub.settle()
        assert list(fake_hub.subscriptions) == [subscription.callback]
    finally:
        await runner.cleanup()


async def test_follow_discovers_a_source_and_subscribes_once(fake_hub, make_subscriber, aiohttp_server):
    app = web.Application()
    documents: dict[str, str] = {}

    async def serve(request: web.Request) -> web.Response:
        if request.path not in documents:
            return web.Response(status=404)
        return web.Response(text=documents[request.path], content_type="application/xml")

    app.router.add_get("/{path:.*}", serve)
    server = await aiohttp_server(app)
    base = str(server.make_url("")).rstrip("/")
    documents.update(source_documents(base, fake_hub.url))
    subscriber = await make_subscriber()
    [first] = await subscriber.follow(base + "/", wait=True)
    [again] = await subscriber.follow(base + "/capabilitylist.xml", wait=True)
    assert first.topic == again.topic == base + "/changes" and first.id == again.id
    assert first.discovery == "capability-list"
    assert len(fake_hub.subscriptions) == 1


async def test_discovery_takes_the_url_first_and_a_session_only_if_given(aiohttp_server):
    async def topic(request: web.Request) -> web.Response:
        return web.Response(headers={"Link": build_link_header([(str(request.url), "self"),
                                                                  ("http://hub.example.org/", "hub")])})

    app = web.Application()
    app.router.add_get("/topic", topic)
    server = await aiohttp_server(app)
    url = str(server.make_url("/topic"))
    assert (await discover_topic(url)).hubs == ("http://hub.example.org/",)
    async with aiohttp.ClientSession() as session:
        assert (await discover_topic(url, session)).topic == url
        assert (await discover_topic(session, url)).topic == url  # the earlier (session, url) order
    [found] = await discover(url)
    assert found.found_in == "link-header"
    with pytest.raises(DiscoveryError, match="no change-notification channel found from .*: as a topic: .*; "
                                             "as a Capability List: .*; as a Source: .*answered 404"):
        await discover(str(server.make_url("/nothing")))


async def test_hooks_are_called_for_verified_denied_and_gap(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    seen: list[tuple[str, object]] = []

    @subscriber.on_verified
    async def verified(subscription):
        seen.append(("verified", subscription.status))

    @subscriber.on_denied
    def denied(subscription):
        seen.append(("denied", subscription.denial_reason))

    @subscriber.on_gap
    async def gap(received):
        seen.append(("gap", [g.kind for g in received.gaps]))

    @subscriber.on_notification
    async def handle(received):
        seen.append(("notification", received.sequence))

    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    for sequence in (1, 3):  # 2 is missing
        status, _ = await fake_hub.deliver(subscription.callback, make_notification(T0 if sequence == 1 else
                                           T0.replace(minute=10)), secret=subscription.secret,
                                           notification_id=f"n{sequence}", sequence=sequence)
        assert status == 200
    fake_hub.mode = "deny"
    with pytest.raises(SubscriptionDeniedError):
        await subscriber.subscribe("http://example.com/dataset2/change/", fake_hub.url)
    await subscriber.drain(5)
    # Gap and notification hooks run in delivery order; the others in the background.
    assert [item for item in seen if item[0] in ("gap", "notification")] == [
        ("notification", 1), ("gap", ["sequence"]), ("notification", 3)]
    assert sorted(item for item in seen if item[0] in ("verified", "denied")) == [
        ("denied", "topic not allowed"), ("verified", "active")]


async def test_renewal_failed_hook_gets_the_subscription_and_the_error(fake_hub, make_subscriber):
    subscriber = await make_subscriber()
    failures = []
    subscriber.on_renewal_failed(lambda subscription, error: failures.append((subscription.id, str(error))))
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    fake_hub.mode = "refuse"
    await subscriber.renew(subscription)
    await subscriber.drain(5)
    assert failures == [(subscription.id, failures[0][1])] and "400" in failures[0][1]


async def test_after_handler_answers_503_while_the_handler_raises_then_handles_the_retry(fake_hub, make_subscriber):
    subscriber = await make_subscriber(ack="after_handler")
    calls: list[str] = []

    @subscriber.on_notification
    def handle(received):  # a plain function: runs in a worker thread before the answer
        calls.append(received.notification_id)
        if len(calls) == 1:
            raise RuntimeError("database is down")

    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    body = make_notification(T0)
    first = await fake_hub.deliver(subscription.callback, body, secret=subscription.secret,
                                   notification_id="n1", sequence=1)
    assert first == (503, first[1]) and "RuntimeError" in first[1] and "database" not in first[1]
    assert (await subscriber.store.get(subscription.id)).recent_ids == ()  # not recorded: the retry counts
    again = await fake_hub.deliver(subscription.callback, body, secret=subscription.secret,
                                   notification_id="n1", sequence=1)
    repeat = await fake_hub.deliver(subscription.callback, body, secret=subscription.secret,
                                    notification_id="n1", sequence=1)
    assert again[0] == 200 and repeat == (200, "notification n1 already handled")
    assert calls == ["n1", "n1"]
    stored = await subscriber.store.get(subscription.id)
    assert stored.last_sequence == 1 and stored.last_until is not None


async def test_default_ack_answers_before_the_handler_and_only_logs_its_error(fake_hub, make_subscriber, caplog):
    subscriber = await make_subscriber()

    @subscriber.on_notification
    async def handle(received):
        raise RuntimeError("database is down")

    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    status, _ = await fake_hub.deliver(subscription.callback, make_notification(T0), secret=subscription.secret,
                                       notification_id="n1")
    await subscriber.drain(5)
    assert status == 200 and "notification handler failed" in caplog.text


def test_an_unknown_ack_mode_is_refused():
    with pytest.raises(SettingsError, match="ack must be after_response or after_handler, got 'later'"):
        Subscriber("http://127.0.0.1/websub", MemoryStore(), ack="later")


async def test_a_receiver_of_its_own_gets_each_accepted_delivery_as_one_value(fake_hub, make_subscriber):
    # The receive seam: the core answers the hub (lookup, signature) and hands what it accepted
    # to the one receiver it was built with; the receiver's answer is the hub's answer.
    from rsnotify.subscriber import CallbackResponse, Delivery

    class Keep:
        def __init__(self) -> None:
            self.deliveries: list[Delivery] = []

        async def receive(self, delivery: Delivery) -> CallbackResponse:
            self.deliveries.append(delivery)
            return CallbackResponse(202, "kept")

        async def close(self) -> None:
            pass

    keep = Keep()
    subscriber = await make_subscriber(receiver=keep)
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    body = make_notification()
    assert await fake_hub.deliver(subscription.callback, body, secret="wrong") == (403, "X-Hub-Signature does not match the body")
    assert await fake_hub.deliver(subscription.callback, body, secret=subscription.secret, notification_id="n-1",
                                  sequence=7) == (202, "kept")
    [delivery] = keep.deliveries
    assert (delivery.subscription.id, delivery.notification_id, delivery.sequence, delivery.body) == \
        (subscription.id, "n-1", 7, body)
    assert delivery.content_type == "application/xml"
    with pytest.raises(SettingsError, match="default receiver"):
        subscriber.on_notification(lambda received: None)
    with pytest.raises(SettingsError, match="default receiver"):
        Subscriber("http://127.0.0.1:9/websub", MemoryStore(), receiver=keep, on_notification=lambda r: None)

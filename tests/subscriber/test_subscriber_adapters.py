"""The three adapters serve the same behaviour through real servers: aiohttp, ASGI under
uvicorn, WSGI under wsgiref in a thread."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
import uvicorn

from rsnotify.subscriber.callback.asgi import ASGICallbackApp
from rsnotify.subscriber.callback.wsgi import SubscriberThread
from rsnotify.subscriber.client import Subscriber
from rsnotify.subscriber.errors import SubscriberError
from rsnotify.subscriber.settings import SubscriberSettings
from rsnotify.subscriber.store import MemoryStore, Subscription
from tests.support.http import http
from tests.support.subscribers import RecordingSubscriber, hang
from tests.support.waiting import wait_until

from .conftest import Recorder, make_notification

TOPIC = "http://example.com/dataset1/change/"
SETTINGS = SubscriberSettings(verification_timeout=5.0, max_body_bytes=20_000)


class Harness:
    """One adapter under a real server; subscribe/unsubscribe/drain from the test's loop."""

    name = ""
    subscriber: Subscriber
    recorder: Recorder

    async def subscribe(self, hub: str) -> Subscription:
        return await self.subscriber.subscribe(TOPIC, hub)

    async def unsubscribe(self, subscription: Subscription) -> Subscription:
        return await self.subscriber.unsubscribe(subscription)

    async def drain(self) -> None:
        await self.subscriber.drain(5)


class AiohttpHarness(Harness):
    name = "aiohttp"


class ASGIHarness(Harness):
    name = "asgi"


class WSGIHarness(Harness):
    name = "wsgi"
    runner: SubscriberThread

    # The subscriber lives on the runner's loop: calls go through it, off the test's loop. The
    # runner does not wait for verifications unless asked (a WSGI request must not); this
    # threaded server can answer them meanwhile.
    async def subscribe(self, hub: str) -> Subscription:
        return await asyncio.to_thread(self.runner.subscribe, TOPIC, hub, wait=True)

    async def unsubscribe(self, subscription: Subscription) -> Subscription:
        return await asyncio.to_thread(self.runner.unsubscribe, subscription, wait=True)

    async def drain(self) -> None:
        await asyncio.to_thread(self.runner.call, self.subscriber.drain(5))


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_wsgi(subscriber: Subscriber, runner: SubscriberThread) -> tuple[WSGIServer, threading.Thread]:
    """The runner's WSGI callback served on a free loopback port in a thread, and the subscriber
    told its callback base URL there."""
    httpd = make_server("127.0.0.1", 0, runner.wsgi_app(), server_class=_ThreadingWSGIServer,
                        handler_class=_QuietHandler)
    serving = threading.Thread(target=httpd.serve_forever, daemon=True)
    serving.start()
    subscriber.callback_base_url = f"http://127.0.0.1:{httpd.server_port}/websub"
    return httpd, serving


@pytest.fixture(params=["aiohttp", "asgi", "wsgi"])
async def harness(request, make_subscriber) -> AsyncIterator[Harness]:
    recorder = Recorder()
    if request.param == "aiohttp":
        h: Harness = AiohttpHarness()
        h.subscriber = await make_subscriber(settings=SETTINGS, on_notification=recorder)
        h.recorder = recorder
        yield h
        return
    subscriber = Subscriber(store=MemoryStore(), settings=SETTINGS, on_notification=recorder)
    if request.param == "asgi":
        server = uvicorn.Server(uvicorn.Config(ASGICallbackApp(subscriber), host="127.0.0.1", port=0,
                                               lifespan="on", log_level="warning"))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            assert not serving.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        subscriber.callback_base_url = f"http://127.0.0.1:{port}/websub"
        h = ASGIHarness()
        h.subscriber, h.recorder = subscriber, recorder
        yield h
        server.should_exit = True
        await serving
        return
    runner = SubscriberThread(subscriber, renew=False).start()
    httpd, thread = serve_wsgi(subscriber, runner)
    w = WSGIHarness()
    w.subscriber, w.recorder, w.runner = subscriber, recorder, runner
    yield w
    httpd.shutdown()
    thread.join(5)
    httpd.server_close()
    await asyncio.to_thread(runner.stop)


async def test_adapter_verifies_only_pending_intents(harness, fake_hub):
    subscription = await harness.subscribe(fake_hub.url)
    await fake_hub.settle()  # the hub may still be reading the answer that activated it
    [verification] = fake_hub.verifications
    assert (verification.status, verification.content_type) == (200, "text/plain")
    assert verification.body == verification.query["hub.challenge"]
    refused = await fake_hub.verify(subscription.callback, {
        "hub.mode": "subscribe", "hub.topic": "http://example.com/elsewhere/", "hub.challenge": "c"})
    assert refused.status == 404
    bad_mode = await fake_hub.verify(subscription.callback, {"hub.mode": "publish", "hub.topic": TOPIC})
    assert bad_mode.status == 400 and "hub.mode" in bad_mode.body


async def test_adapter_checks_signatures_drops_repeats_and_bounds_bodies(harness, fake_hub):
    subscription = await harness.subscribe(fake_hub.url)
    await fake_hub.settle()  # the hub may still be reading the answer that activated it
    body = make_notification()
    assert (await fake_hub.deliver(subscription.callback, body))[0] == 403
    assert (await fake_hub.deliver(subscription.callback, body, secret="wrong"))[0] == 403
    for _ in range(2):
        status, _ = await fake_hub.deliver(subscription.callback, body, secret=subscription.secret,
                                           algorithm="sha512", notification_id="n-1", sequence=1)
        assert status == 200
    status, reply = await fake_hub.deliver(subscription.callback, b"x" * 30_000, secret=subscription.secret)
    assert status == 413 and "20000" in reply
    await harness.drain()
    [received] = harness.recorder.received
    assert received.notification_id == "n-1" and received.sequence == 1
    assert received.notification.changes[0].loc == "http://example.com/res1"
    assert received.topic == TOPIC and received.hub == fake_hub.url


async def test_adapter_unsubscribes_verified_then_answers_410(harness, fake_hub):
    subscription = await harness.subscribe(fake_hub.url)
    await fake_hub.settle()  # the hub may still be reading the answer that activated it
    ended = await harness.unsubscribe(subscription)
    await fake_hub.settle()
    assert ended.status == "unsubscribed"
    assert fake_hub.verifications[-1].query["hub.mode"] == "unsubscribe"
    assert fake_hub.verifications[-1].status == 200
    status, _ = await fake_hub.deliver(subscription.callback, make_notification(), secret=subscription.secret)
    assert status == 410


def test_stop_past_its_timeout_answers_a_request_thread_still_waiting_on_the_runner():
    """A request thread waits in the runner for an intent the hub never answers, while the
    application's handler still holds close() up at shutdown: stop() gives up after its timeout
    and the waiting thread is answered, instead of waiting forever on a loop that has stopped
    (a single-threaded server, and its shutdown, would wait with it)."""
    handler_busy, release = threading.Event(), threading.Event()

    def slow_handler(received) -> None:      # the application's handler, still busy at shutdown
        handler_busy.set()
        release.wait(60)

    hubs = RecordingSubscriber()
    hubs.on("/hub", 202)
    hub_server = hubs.serve_in_thread()
    stuck_hubs = RecordingSubscriber()       # another hub, so the first one's connection stays idle
    stuck_hubs.on("/stuck-hub", hang(600))   # takes the intent, never answers
    stuck_server = stuck_hubs.serve_in_thread()
    subscriber = Subscriber(store=MemoryStore(), settings=SubscriberSettings(request_timeout=300),
                            on_notification=slow_handler)
    runner = SubscriberThread(subscriber, renew=False).start()
    httpd, serving = serve_wsgi(subscriber, runner)
    answers: list[BaseException | Subscription] = []

    def request_thread() -> None:
        try:
            answers.append(runner.subscribe(TOPIC, stuck_hubs.url("/stuck-hub")))
        except BaseException as exc:  # noqa: BLE001 - what the request thread got, for the assert
            answers.append(exc)

    waiting = threading.Thread(target=request_thread, daemon=True)
    try:
        subscription = runner.subscribe(TOPIC, hubs.url("/hub"), secret=False)
        status, body = http("POST", subscription.callback, make_notification(),
                            {"Content-Type": "application/xml"})
        assert status == 200, body
        wait_until(handler_busy.is_set, 10, "the handler to run")
        waiting.start()
        wait_until(lambda: stuck_hubs.seen("/stuck-hub"), 10, "the second intent to reach the hub")

        runner.stop(timeout=1)               # close() waits for the handler: stop gives up on it
        waiting.join(10)
        assert not waiting.is_alive(), "the request thread still waits on the stopped runner"
        [answer] = answers
        assert isinstance(answer, SubscriberError) and "stopped" in str(answer), answer
        with pytest.raises(SubscriberError, match="stopped"):
            runner.subscriptions()
        # the close that stop() cut short still closed the HTTP session: its idle keep-alive
        # connection to the first hub does not stay open for the rest of the process
        wait_until(lambda: hub_server.open_connections() == 0, 10, "the stopped subscriber to close its connections")
    finally:
        release.set()
        httpd.shutdown()
        serving.join(5)
        httpd.server_close()
        hub_server.stop()
        stuck_server.stop()


def test_a_stopped_subscriber_thread_starts_again_and_serves_its_callback(tmp_path) -> None:
    """stop() then start() on the same runner (a reload, a pre-fork server's hooks): the same
    callback URL is answered again and the stored subscription (SQLite) is still there."""
    received: list[bytes] = []
    hubs = RecordingSubscriber()
    hubs.on("/hub", 202)
    hub_server = hubs.serve_in_thread()
    subscriber = Subscriber(settings=SubscriberSettings(state_file=str(tmp_path / "subscriptions.db")),
                            on_notification=lambda r: received.append(r.body))
    runner = SubscriberThread(subscriber, renew=False).start()
    httpd, serving = serve_wsgi(subscriber, runner)
    try:
        subscription = runner.subscribe(TOPIC, hubs.url("/hub"), secret=False)
        first, second = make_notification(), make_notification(minutes=20)
        assert http("POST", subscription.callback, first, {"Content-Type": "application/xml"})[0] == 200
        runner.stop()
        runner.start()
        assert http("POST", subscription.callback, second, {"Content-Type": "application/xml"})[0] == 200
        wait_until(lambda: received == [first, second], 10, "both notifications handed over, in order")
        assert [s.id for s in runner.subscriptions()] == [subscription.id]
        runner.stop()
        runner.stop()                          # twice is fine
        with pytest.raises(SubscriberError, match="stopped"):
            runner.subscriptions()
    finally:
        httpd.shutdown()
        serving.join(5)
        httpd.server_close()
        hub_server.stop()
        runner.stop()

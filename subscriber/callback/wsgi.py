"""WSGI adapter (Flask, Django, any WSGI server) and the thread that runs the subscriber.

WSGI servers call applications from their own threads with no event loop, so the
subscriber (its store, renewals and HTTP client) runs on an event loop in one background
thread, `SubscriberThread`, and `WSGICallbackApp` hands each request to it. Flask and Django
users take `rsnotify.subscriber.callback.flask` / `.django`; any other WSGI app mounts the callback app:

    subscriber = Subscriber("https://dest.example.org/websub", on_notification=handle)
    subscriber.ensure_when_listening(topic, hub)     # subscribes once the server answers
    runner = subscriber_thread(subscriber)            # started; stopped at exit
    app.wsgi_app = DispatcherMiddleware(app.wsgi_app, {"/websub": runner.wsgi_app()})

Never wait for a verification inside a request (`wait=True`): on a single-threaded server
the hub's verification GET would queue behind the request that waits for it.
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import parse_qsl

from ..client import Subscriber
from ..errors import SubscriberError
from ..store import Subscription
from .core import CallbackRequest, CallbackResponse, query_fields, too_large

log = logging.getLogger(__name__)

T = TypeVar("T")
StartResponse = Callable[..., Any]
CANCEL_GRACE = 2.0  # s: how long stop() gives what still runs on the loop to end once cancelled

_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 410: "Gone", 413: "Content Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}


class SubscriberThread:
    """Runs a Subscriber on its own event loop in a daemon thread; sync methods for WSGI code."""

    def __init__(self, subscriber: Subscriber, *, renew: bool = True) -> None:
        self.subscriber = subscriber
        self.renew = renew
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="rsnotify-subscriber", daemon=True)
        # What other threads wait for in call(): stop() ends every one of them, so no request
        # thread stays blocked on a loop that no longer runs.
        self._calls: set[concurrent.futures.Future[Any]] = set()
        self._calls_lock = threading.Lock()
        self._stopped = False

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> Self:
        """Start the thread and the subscriber on it; a no-op while it runs. After stop() it starts
        again, on a new loop and thread (a Python thread runs once), with the same subscriber
        and the same WSGI apps: an application that stops its subscriber (a reload, a test,
        a pre-fork server's hooks) starts it again the way it started it the first time.
        SubscriberError while a stop() that gave up on the thread has not seen it end."""
        if self._thread.is_alive():
            if self._stopped:
                raise SubscriberError("the subscriber's thread is still stopping (stop() timed out on it); "
                                      "start it again once it has ended")
            return self
        if self._thread.ident is not None:      # it ran and was stopped
            if not self.loop.is_closed():
                self.loop.close()
            self.loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._run, name="rsnotify-subscriber", daemon=True)
            with self._calls_lock:
                self._stopped = False
        self._thread.start()
        self.call(self.subscriber.start(renew=self.renew))
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Close the subscriber (hands over received notifications) and end the thread.

        What still runs on the loop after `timeout` (a close() held up by a slow handler, a call
        from a request thread) is cancelled, so every thread waiting in call() gets an answer
        (SubscriberError) instead of waiting forever on a stopped loop."""
        if not self._thread.is_alive():
            return
        try:
            self.call(self.subscriber.close(), timeout)
        except TimeoutError:
            log.warning("the subscriber did not close within %g s; cancelling what still runs", timeout)
        finally:
            try:
                self.call(self._cancel_the_rest(), CANCEL_GRACE + 1)
            except (TimeoutError, SubscriberError):
                pass
            with self._calls_lock:
                self._stopped = True
                left = list(self._calls)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
            for future in left:     # a task that ignored its cancellation: its caller is told anyway
                future.cancel()
            if not self._thread.is_alive():
                self.loop.close()

    async def _cancel_the_rest(self) -> None:
        this = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not this]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_GRACE)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the subscriber's loop and wait for its result (from any other thread).
        Raises SubscriberError when the runner is stopped, or stops before `coro` is done."""
        with self._calls_lock:
            if self._stopped:
                coro.close()
                raise SubscriberError("the subscriber's thread is stopped")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self._calls.add(future)
        future.add_done_callback(self._forget_call)
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError:
            raise SubscriberError("the subscriber's thread stopped before the call finished") from None

    def _forget_call(self, future: concurrent.futures.Future[Any]) -> None:
        with self._calls_lock:
            self._calls.discard(future)

    # wait=False by default here: these run in WSGI code, where waiting for the verification
    # GET can deadlock (see the module docstring).

    def subscribe(self, topic: str, hub: str, lease_seconds: int | None = None,
                  secret: bool | str | None = True, *, wait: bool = False, **options: Any) -> Subscription:
        return self.call(self.subscriber.subscribe(topic, hub, lease_seconds, secret, wait=wait, **options))

    def ensure(self, topic: str, hub: str, lease_seconds: int | None = None,
               secret: bool | str | None = True, *, wait: bool = False, **options: Any) -> Subscription:
        return self.call(self.subscriber.ensure(topic, hub, lease_seconds, secret, wait=wait, **options))

    def follow(self, url: str, *, wait: bool = False, **options: Any) -> list[Subscription]:
        return self.call(self.subscriber.follow(url, wait=wait, **options))

    def unsubscribe(self, subscription: Subscription | str, *, wait: bool = False, **options: Any) -> Subscription:
        return self.call(self.subscriber.unsubscribe(subscription, wait=wait, **options))

    def diagnostics(self, subscription: Subscription | str, **options: Any) -> dict[str, Any]:
        """The hub's report on `subscription` (a subscription without a secret needs another
        request thread free for the hub's link: not from a single-threaded server's request)."""
        return self.call(self.subscriber.diagnostics(subscription, **options))

    def subscriptions(self) -> list[Subscription]:
        return self.call(self.subscriber.subscriptions())

    def wsgi_app(self) -> WSGICallbackApp:
        return WSGICallbackApp(self)


_threads: dict[int, SubscriberThread] = {}
_threads_lock = threading.Lock()


def subscriber_thread(subscriber: Subscriber) -> SubscriberThread:
    """The one SubscriberThread of `subscriber`, started on the first call and stopped at exit."""
    with _threads_lock:
        runner = _threads.get(id(subscriber))
        if runner is None or runner.subscriber is not subscriber:
            runner = _threads[id(subscriber)] = SubscriberThread(subscriber)
            atexit.register(runner.stop, 5.0)
        return runner.start()


class WSGICallbackApp:
    """A WSGI app answering the hub's GET and POST at `<mount>/<subscription id>`."""

    def __init__(self, runner: SubscriberThread, *, timeout: float = 30.0) -> None:
        self.runner = runner
        self.core = runner.subscriber.core
        self.timeout = timeout  # seconds to wait for the core's answer

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        body = b""
        if method == "POST":
            limit = self.core.max_body_bytes
            length_text = environ.get("CONTENT_LENGTH") or ""
            if length_text.isdigit():
                length = int(length_text)
                if length > limit:
                    return _respond(start_response, too_large(limit))
                body = environ["wsgi.input"].read(length) if length else b""
            elif environ.get("wsgi.input_terminated"):  # chunked, and the server says reading to EOF is safe
                body = environ["wsgi.input"].read(limit + 1)
                if len(body) > limit:
                    return _respond(start_response, too_large(limit))
        path = environ.get("PATH_INFO", "")
        query, repeated = query_fields(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True))
        request = CallbackRequest(
            method=method,
            subscription_id=path.rstrip("/").rsplit("/", 1)[-1],
            query=query,
            headers=tuple(_headers(environ)),
            body=body,
            repeated=repeated,
        )
        return _respond(start_response, self.runner.call(self.core.handle(request), self.timeout))


def _headers(environ: dict[str, Any]) -> Iterable[tuple[str, str]]:
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            yield key[5:].replace("_", "-").title(), value
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            yield key.replace("_", "-").title(), value


def _respond(start_response: StartResponse, response: CallbackResponse) -> list[bytes]:
    body = response.body
    status = f"{response.status} {_REASONS.get(response.status, 'Unknown')}"
    start_response(status, [("Content-Type", response.content_type), ("Content-Length", str(len(body)))])
    return [body]

"""ASGI adapter: an ASGI app serving callbacks, for Starlette, FastAPI or any ASGI server.

The subscription id is the last segment of the request path, so the app works mounted under
any prefix (`Mount("/websub", app=ASGICallbackApp(subscriber))`). Served on its own, it runs
the subscriber's start/close on the lifespan events; mounted (sub-apps get no lifespan
events), the enclosing app runs them with `subscriber_lifespan`:

    subscriber.ensure_when_listening(topic, hub)      # made once the server answers
    app = FastAPI(lifespan=subscriber_lifespan(subscriber))
    app.mount("/websub", ASGICallbackApp(subscriber, manage_lifespan=False))
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl

from ..client import Subscriber
from .core import CallbackRequest, CallbackResponse, query_fields, too_large

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ASGICallbackApp:
    """Answers the hub's GET and POST at `<mount>/<subscription id>`."""

    def __init__(self, subscriber: Subscriber, *, manage_lifespan: bool = True) -> None:
        self.subscriber = subscriber
        self.core = subscriber.core
        self.manage_lifespan = manage_lifespan  # False when the enclosing app starts the subscriber

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method = scope["method"]
        try:
            body = await _read_body(scope, receive, self.core.max_body_bytes) if method == "POST" else b""
        except _BodyTooLarge:
            await _send(send, too_large(self.core.max_body_bytes))
            return
        path = scope.get("path", "")
        query, repeated = query_fields(parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                                                 keep_blank_values=True))
        request = CallbackRequest(
            method=method,
            subscription_id=path.rstrip("/").rsplit("/", 1)[-1],
            query=query,
            headers=tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])),
            body=body,
            repeated=repeated,
        )
        await _send(send, await self.core.handle(request))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self.manage_lifespan:
                        await self.subscriber.start()
                except Exception as exc:  # noqa: BLE001 - reported to the server, as ASGI asks
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.manage_lifespan:
                    await self.subscriber.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def subscriber_lifespan(subscriber: Subscriber) -> Callable[[Any], AbstractAsyncContextManager[None]]:
    """A lifespan (FastAPI(lifespan=...), Starlette(lifespan=...)) that starts the subscriber
    with the app and closes it at shutdown.

    The server binds only after the lifespan's startup, so nothing here may wait for the hub's
    verification: subscriptions asked for with `ensure_when_listening` / `follow_when_listening`
    are made by a task once the callback URL answers.
    """

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await subscriber.start()
        try:
            yield
        finally:
            await subscriber.close()

    return lifespan


class _BodyTooLarge(Exception):
    pass


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length" and value.isdigit() and int(value) > limit:
            raise _BodyTooLarge
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _send(send: Send, response: CallbackResponse) -> None:
    body = response.body
    await send({
        "type": "http.response.start",
        "status": response.status,
        "headers": [(b"content-type", response.content_type.encode()),
                    (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})

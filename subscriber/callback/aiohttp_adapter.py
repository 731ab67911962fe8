"""aiohttp adapter: callback routes for an existing app, or a sub-app to mount.

    app = web.Application()
    subscriber = Subscriber("https://dest.example.org/websub", on_notification=handle)
    add_callback_routes(app, subscriber.core, "/websub")
    app.cleanup_ctx.append(subscriber_context(subscriber))
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from ..client import Subscriber
from .core import (
    CallbackCore,
    CallbackRequest,
    CallbackResponse,
    header_pairs,
    query_fields,
    too_large,
)

SUBSCRIPTION_ID_PATTERN = "{subscription_id:[A-Za-z0-9_-]+}"


class _BodyTooLarge(Exception):
    pass


def callback_handler(core: CallbackCore) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler for `.../{subscription_id}` routes."""

    async def handle(request: web.Request) -> web.Response:
        try:
            body = await _read_body(request, core.max_body_bytes) if request.method == "POST" else b""
        except _BodyTooLarge:
            return _to_aiohttp(too_large(core.max_body_bytes))
        except web.RequestPayloadError as exc:  # e.g. Content-Encoding: gzip on bytes that are not gzip
            reason = " ".join(str(exc).split()).removeprefix("400, message:").strip()
            return _to_aiohttp(CallbackResponse(400, f"the body cannot be read as sent: {reason or 'broken body'}"))
        query, repeated = query_fields(request.query.items())
        callback_request = CallbackRequest(
            method=request.method,
            subscription_id=request.match_info["subscription_id"],
            query=query,
            headers=header_pairs(request.headers.items()),
            body=body,
            repeated=repeated,
        )
        return _to_aiohttp(await core.handle(callback_request))

    return handle


def add_callback_routes(app: web.Application, core: CallbackCore, path: str = "/websub") -> None:
    """Serve callbacks at `{path}/{subscription_id}` in `app` (GET, HEAD and POST)."""
    handler = callback_handler(core)
    route = f"{path.rstrip('/')}/{SUBSCRIPTION_ID_PATTERN}"
    app.router.add_get(route, handler)  # HEAD comes here too; the core answers it 405
    app.router.add_post(route, handler)


def callback_app(core: CallbackCore) -> web.Application:
    """A sub-app serving callbacks at `/{subscription_id}`: `app.add_subapp("/websub", ...)`."""
    sub_app = web.Application()
    add_callback_routes(sub_app, core, "")
    return sub_app


def subscriber_context(subscriber: Subscriber) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup_ctx entry: start the subscriber with the app, close it on shutdown."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        await subscriber.start()
        yield
        await subscriber.close()

    return context


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise _BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(65536):
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _to_aiohttp(response: CallbackResponse) -> web.Response:
    return web.Response(status=response.status, body=response.body, content_type=response.content_type.split(";")[0],
                        charset="utf-8" if "charset" in response.content_type else None)

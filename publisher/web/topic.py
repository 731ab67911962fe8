"""Make a Source's topic URI answer HEAD/GET as spec §4.1 requires: `200 OK`,
`Content-Type: application/xml`, `Link` rel="self" (the topic) and rel="hub" (each hub); the
body is the latest notification, or empty with `Content-Length: 0`.

One pure `topic_response`, and three thin adapters: an aiohttp handler, an ASGI app and a
WSGI app, for whatever framework the Source runs. Flask and Django apps take
`rsnotify.publisher.web.flask.add_topic_rule` / `rsnotify.publisher.web.django.topic_path`; the WSGI
app is mounted at the topic's path in any other WSGI app, e.g. with werkzeug:

    app.wsgi_app = DispatcherMiddleware(app.wsgi_app, {"/dataset1/change": wsgi_topic_app(topic)})
"""
from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsnotify.errors import WireError
from rsnotify.websub import build_link_header, check_url

from ..errors import SettingsError

if TYPE_CHECKING:
    from aiohttp import web

    from ..client import Publisher

XML_CONTENT_TYPE = "application/xml"
_ALLOWED = ("GET", "HEAD")


@dataclass(frozen=True, slots=True)
class TopicResponse:
    """What the topic URI answers: status, headers (name, value) and body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


class Topic:
    """A topic URI's content: the topic URL, its hub(s), and the latest notification.

    `body` is the latest notification's bytes, or a callable giving them at each request
    (None: no content). `Topic.from_publisher(p)` serves what `p` last published. Thread-safe.
    """

    def __init__(
        self,
        topic_url: str,
        hub_urls: str | Sequence[str],
        capability_list_url: str | None = None,
        body: bytes | Callable[[], bytes | None] | None = None,
    ) -> None:
        hubs = [hub_urls] if isinstance(hub_urls, str) else list(hub_urls)
        if not hubs:
            raise SettingsError("a topic needs at least one hub URL for its Link rel=\"hub\", got none")
        try:
            self.topic_url = check_url("topic URL", topic_url)
            self.hub_urls = tuple(check_url("hub URL", hub) for hub in hubs)
            self.capability_list_url = check_url("Capability List URL", capability_list_url) if capability_list_url else None
        except WireError as exc:
            raise SettingsError(str(exc)) from None
        self._lock = threading.Lock()
        self._body = body

    @classmethod
    def from_publisher(cls, publisher: Publisher) -> Topic:
        """The topic of `publisher`, serving the last document it got accepted."""
        return cls(
            publisher.topic_url,
            publisher.hub_urls,
            publisher.capability_list_url,
            lambda: publisher.latest_document,
        )

    def update(self, body: bytes | None) -> None:
        """Serve `body` (the latest notification's bytes) from now on; None for no content."""
        with self._lock:
            self._body = body

    @property
    def body(self) -> bytes | None:
        with self._lock:
            body = self._body
        return body() if callable(body) else body

    @property
    def link_header(self) -> str:
        links = [(self.topic_url, "self"), *((hub, "hub") for hub in self.hub_urls)]
        if self.capability_list_url:
            links.append((self.capability_list_url, "resourcesync"))
        return build_link_header(links)


def topic_response(topic: Topic, method: str) -> TopicResponse:
    """The answer to `method` on the topic URI. HEAD gets GET's headers and no body."""
    method = method.upper()
    if method not in _ALLOWED:
        reason = f"the topic URI answers GET and HEAD, got {method}\n".encode()
        return TopicResponse(
            405,
            (("Allow", ", ".join(_ALLOWED)), ("Content-Type", "text/plain; charset=utf-8"),
             ("Content-Length", str(len(reason)))),
            reason,
        )
    body = topic.body or b""
    headers = (
        ("Content-Type", XML_CONTENT_TYPE),
        ("Link", topic.link_header),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-cache"),  # the latest notification changes with every publish
    )
    return TopicResponse(200, headers, b"" if method == "HEAD" else body)


# -- aiohttp -------------------------------------------------------------------------------


def topic_handler(topic: Topic) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler for the topic URI: `app.router.add_route("*", path, topic_handler(t))`
    (or `add_get`, which adds HEAD too)."""
    from aiohttp import web  # only aiohttp users need it

    async def handle_topic(request: web.Request) -> web.StreamResponse:
        # aiohttp leaves the body out of a HEAD answer itself, so HEAD is given GET's answer;
        # Content-Length is set explicitly, else aiohttp drops a zero one from HEAD answers.
        answer = topic_response(topic, "GET" if request.method == "HEAD" else request.method)
        response = web.Response(status=answer.status, body=answer.body)
        for name, value in answer.headers:
            response.headers[name] = value
        return response

    return handle_topic


def add_topic_route(app: web.Application, path: str, topic: Topic) -> None:
    """Serve `topic` at `path` of an aiohttp application (GET, HEAD, and 405 for the rest)."""
    app.router.add_route("*", path, topic_handler(topic))


# -- ASGI ----------------------------------------------------------------------------------


def asgi_topic_app(topic: Topic) -> Callable[[dict, Callable, Callable], Awaitable[None]]:
    """A plain ASGI 3 application serving `topic` at whatever path it is mounted on."""

    async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            raise ValueError(f"the topic app serves http, got an ASGI {scope['type']!r} scope")
        answer = topic_response(topic, scope["method"])
        await send({
            "type": "http.response.start",
            "status": answer.status,
            "headers": [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers],
        })
        await send({"type": "http.response.body", "body": answer.body})

    return app


# -- WSGI ----------------------------------------------------------------------------------

_REASONS = {200: "OK", 405: "Method Not Allowed"}


def wsgi_topic_app(topic: Topic) -> Callable[[dict, Callable], Iterable[bytes]]:
    """A plain WSGI application serving `topic` at whatever path it is mounted on."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        answer = topic_response(topic, environ.get("REQUEST_METHOD", "GET"))
        start_response(f"{answer.status} {_REASONS[answer.status]}", list(answer.headers))
        return [answer.body]

    return app

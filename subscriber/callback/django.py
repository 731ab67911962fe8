"""Django glue: a view answering the hub, and the URL patterns to include. No werkzeug.

    subscriber = Subscriber(settings=SubscriberSettings.from_env(os.environ))
    urlpatterns = [path("websub/", include(callback_urls(subscriber)))]

`callback_urls` starts the subscriber on its own thread (`wsgi.subscriber_thread`); Django loads
a project's URLconf at its first request, so call `callback_urls` (or `subscriber_thread`)
where the project starts (wsgi.py or an AppConfig.ready) when subscriptions are to be made
at startup with `subscriber.ensure_when_listening(...)`.
"""
from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.views.decorators.csrf import csrf_exempt

from ..client import Subscriber
from .core import (
    CallbackRequest,
    CallbackResponse,
    header_pairs,
    query_fields,
    too_large,
)
from .wsgi import subscriber_thread

# Seconds a request waits for the callback core (it answers at once unless ack="after_handler").
ANSWER_TIMEOUT = 60.0


def callback_view(subscriber: Subscriber) -> Callable[[HttpRequest, str], HttpResponse]:
    """A Django view for `<prefix><subscription_id>` URLs (csrf-exempt: the hub has no token)."""

    @csrf_exempt
    def callback(request: HttpRequest, subscription_id: str) -> HttpResponse:
        runner = subscriber_thread(subscriber)
        core = runner.subscriber.core
        body = b""
        if request.method == "POST":
            # Read as a stream: request.body would stop at DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB),
            # and a notification may be up to max_body_bytes.
            body = request.read(core.max_body_bytes + 1)
            if len(body) > core.max_body_bytes:
                return _to_django(too_large(core.max_body_bytes))
        query, repeated = query_fields((key, value) for key, values in request.GET.lists() for value in values)
        callback_request = CallbackRequest(
            method=request.method or "GET",
            subscription_id=subscription_id,
            query=query,
            headers=header_pairs(request.headers.items()),
            body=body,
            repeated=repeated,
        )
        return _to_django(runner.call(core.handle(callback_request), ANSWER_TIMEOUT))

    return callback


def callback_urls(subscriber: Subscriber) -> list[URLPattern]:
    """URL patterns for `include()` under the path of the subscriber's callback base URL."""
    subscriber_thread(subscriber)
    return [path("<str:subscription_id>", callback_view(subscriber), name="rsnotify-callback")]


def _to_django(response: CallbackResponse) -> HttpResponse:
    return HttpResponse(response.body, status=response.status, content_type=response.content_type)

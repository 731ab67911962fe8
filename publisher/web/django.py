"""Django glue for a Source: the topic URI as a view (spec §4.1), and changes published after the
database transaction that made them commits (`transaction.on_commit`).

    urlpatterns = [topic_path("dataset1/change/", topic)]
    ...
    with transaction.atomic():
        document.save()
        publish_on_commit(outbox, [(document.url, "updated")])
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path

from ..changes import ChangeLike
from .deferred import Sink, send_changes, take_changes
from .topic import Topic, topic_response


def topic_view(topic: Topic) -> Callable[[HttpRequest], HttpResponse]:
    """A Django view answering GET and HEAD on the topic URI (405 with Allow for the rest)."""

    def view(request: HttpRequest) -> HttpResponse:
        # HEAD: no body, GET's Content-Length (set here, so Django keeps it).
        answer = topic_response(topic, request.method or "GET")
        response = HttpResponse(answer.body, status=answer.status)
        for name, value in answer.headers:
            response[name] = value
        return response

    return view


def topic_path(route: str, topic: Topic, name: str = "rsnotify-topic") -> URLPattern:
    """A URL pattern serving `topic` at `route` (e.g. "dataset1/change/")."""
    return path(route, topic_view(topic), name=name)


def publish_on_commit(sink: Sink, changes: Iterable[ChangeLike], using: str | None = None) -> None:
    """Publish `changes` when the current transaction of database `using` commits (at once
    outside a transaction); a rollback publishes nothing. The changes are checked now
    (ChangeInputError) and dated now when they carry no datetime. With an Outbox the commit
    does not wait on any hub."""
    taken = take_changes(changes)
    transaction.on_commit(lambda: send_changes(sink, taken), using=using)

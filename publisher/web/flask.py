"""Flask glue for a Source: the topic URI as a view (spec §4.1), and changes published once the
request that made them succeeded.

    add_topic_rule(app, "/dataset1/change/", topic)
    ...
    db.session.commit()
    publish_after_request(outbox, [("https://example.org/res1", "updated")])
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from flask import Blueprint, Flask, after_this_request, request
from werkzeug.wrappers import Response

from ..changes import ChangeLike
from .deferred import Sink, send_changes, take_changes
from .topic import Topic, topic_response


def topic_view(topic: Topic) -> Callable[[], Response]:
    """A Flask view answering GET and HEAD on the topic URI."""

    def view() -> Response:
        # HEAD gets GET's answer: werkzeug leaves the body out itself and keeps Content-Length.
        answer = topic_response(topic, "GET" if request.method == "HEAD" else request.method)
        return Response(answer.body, status=answer.status, headers=list(answer.headers))

    return view


def add_topic_rule(app: Flask | Blueprint, rule: str, topic: Topic, endpoint: str = "rsnotify_topic") -> None:
    """Serve `topic` at `rule` (GET and HEAD; Flask answers 405 to the rest)."""
    app.add_url_rule(rule, endpoint, topic_view(topic), methods=["GET", "HEAD"])


def publish_after_request(sink: Sink, changes: Iterable[ChangeLike]) -> None:
    """Publish `changes` once this request's response is ready, if it is a success (< 400).

    Call it in a view after the database commit: a view that raises (500) or answers an error
    publishes nothing. The changes are checked now (ChangeInputError) and dated now when they
    carry no datetime. With an Outbox the response does not wait on any hub.
    """
    taken = take_changes(changes)

    @after_this_request
    def publish(response: Response) -> Response:
        if response.status_code < 400:
            send_changes(sink, taken)
        return response

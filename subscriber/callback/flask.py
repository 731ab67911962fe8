"""Flask glue: a blueprint serving the callbacks of a Subscriber.

    subscriber = Subscriber(settings=SubscriberSettings.from_env(os.environ))
    app.register_blueprint(callback_blueprint(subscriber), url_prefix="/websub")

Registering the blueprint starts the subscriber on its own thread (`wsgi.subscriber_thread`),
so `subscriber.ensure_when_listening(...)` subscribes once the server answers, also on a
single-threaded server (`flask run --without-threads`, one sync gunicorn worker).
"""
from __future__ import annotations

from flask import Blueprint, request
from werkzeug.wrappers import (
    Response,  # Flask's own dependency; what Response.from_app returns
)

from ..client import Subscriber
from .wsgi import subscriber_thread


def callback_blueprint(subscriber: Subscriber, name: str = "rsnotify_callbacks") -> Blueprint:
    """A blueprint answering the hub at `<url_prefix>/<subscription id>` (GET and POST).

    The url_prefix must be the path of the subscriber's callback base URL.
    """
    blueprint = Blueprint(name, __name__)

    @blueprint.route("/<subscription_id>", methods=["GET", "POST"])
    def callback(subscription_id: str) -> Response:
        # The WSGI callback app reads the body within the size limit and takes the id from the path.
        return Response.from_app(subscriber_thread(subscriber).wsgi_app(), request.environ)

    # Started when the app is set up, not at the first request: the subscriptions asked for
    # with *_when_listening are made once the server answers, before any request arrives.
    blueprint.record_once(lambda state: _start(subscriber))
    return blueprint


def _start(subscriber: Subscriber) -> None:
    subscriber_thread(subscriber)

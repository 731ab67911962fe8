"""The Source-side glue inside real Flask and Django apps served on loopback (werkzeug's
single-threaded server, Django under wsgiref) against a real `rsnotify hub`: the topic URI
answers as spec §4.1 asks, a request that succeeds publishes its changes once, and one that
fails (an exception, a rolled-back transaction) publishes nothing."""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

from rsnotify.hub.redis_server import RedisServer
from rsnotify.publisher import Outbox, Publisher, Topic
from rsnotify.websub import parse_link_header
from tests.support.http import fetch, get_json
from tests.support.hubproc import HubProcess, start_hub_on_emptied_redis


@pytest.fixture(scope="module")
def hub(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    process = start_hub_on_emptied_redis(tmp_path_factory.mktemp("hub"), redis_server.url, workers=1)
    yield process
    process.stop()


def published(hub: HubProcess, topic: str) -> int:
    """How many notifications the hub stored for `topic` (its admin API, from loopback)."""
    tid = hashlib.sha256(topic.encode()).hexdigest()[:32]
    status, answer = get_json(f"{hub.url}admin/topics/{tid}")
    if status == 404:
        return 0
    assert status == 200, (status, answer)
    return int(answer["published"])


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(app) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """Serve a WSGI app single-threaded on a free loopback port; yields its base URL."""
    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(10)
    server.server_close()


@pytest.fixture
def outbox(hub: HubProcess, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Outbox]:
    topic = f"http://example.org/{request.node.name.replace('[', '-').rstrip(']')}/changes"
    box = Outbox(tmp_path / "outbox.db", Publisher(hub.url, topic))
    yield box
    box.close()


def check_topic_uri(url: str, topic: Topic) -> None:
    answer = fetch(url)
    assert answer.status == 200 and answer.headers["Content-Type"] == "application/xml" and answer.body == b""
    links = parse_link_header(answer.headers["Link"])
    assert [(link.href, list(link.rels)) for link in links] == [(topic.topic_url, ["self"]), (topic.hub_urls[0], ["hub"])]
    answer = fetch(url, "HEAD")
    assert answer.status == 200 and answer.body == b"" and answer.headers["Content-Length"] == "0"
    assert fetch(url, "POST").status == 405


def test_flask_topic_view_and_publish_after_request(hub: HubProcess, outbox: Outbox):
    from flask import Flask

    from rsnotify.publisher.web.flask import add_topic_rule, publish_after_request

    topic = Topic(outbox.publisher.topic_url, hub.url)
    app = Flask(__name__)
    add_topic_rule(app, "/changes", topic)

    @app.post("/documents/<name>")
    def save(name: str):
        publish_after_request(outbox, [(f"http://example.org/documents/{name}", "updated")])
        if name == "broken":
            raise RuntimeError("the database refused the write")
        return "saved", 201

    for base in serve(app.wsgi_app):
        check_topic_uri(base + "/changes", topic)
        assert fetch(base + "/documents/broken", "POST").status == 500
        assert fetch(base + "/documents/good", "POST").status == 201
        outbox.flush()
        assert published(hub, topic.topic_url) == 1


DJANGO_VIEWS: dict[str, object] = {}


def test_django_topic_view_and_publish_on_commit(hub: HubProcess, outbox: Outbox, tmp_path: Path):
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["127.0.0.1"],
                           DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3",
                                                  "NAME": str(tmp_path / "django.sqlite3")}})
        django.setup()
    from django.core.wsgi import get_wsgi_application
    from django.db import transaction
    from django.http import HttpResponse
    from django.urls import clear_url_caches, path
    from django.views.decorators.csrf import csrf_exempt

    from rsnotify.publisher.web.django import publish_on_commit, topic_path

    topic = Topic(outbox.publisher.topic_url, hub.url)

    @csrf_exempt
    def save(request, name: str) -> HttpResponse:
        try:
            with transaction.atomic():
                publish_on_commit(outbox, [(f"http://example.org/documents/{name}", "updated")])
                if name == "broken":
                    raise ValueError("a constraint failed")
        except ValueError:
            return HttpResponse("rolled back", status=409)
        return HttpResponse("saved", status=201)

    global urlpatterns
    urlpatterns = [topic_path("changes", topic), path("documents/<str:name>", save)]
    clear_url_caches()
    for base in serve(get_wsgi_application()):
        check_topic_uri(base + "/changes", topic)
        assert fetch(base + "/documents/broken", "POST").status == 409
        assert fetch(base + "/documents/good", "POST").status == 201
        outbox.flush()
        assert published(hub, topic.topic_url) == 1


urlpatterns: list = []

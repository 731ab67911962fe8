"""The README's Flask, Django and FastAPI examples, run as written in real servers on loopback
(Flask's dev server single-threaded, Django under wsgiref, FastAPI under uvicorn) against a
real `rsnotify hub`: subscribing at startup survives restarts without duplicates, and with
ack="after_handler" a handler that raises once gets the notification again."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rsnotify.hub.redis_server import RedisServer
from rsnotify.subscriber import Subscriber, SubscriberSettings
from rsnotify.websub import build_link_header
from tests.support import cli
from tests.support.http import fetch, get_json
from tests.support.hubproc import HubProcess, start_hub_on_emptied_redis
from tests.support.ports import free_port
from tests.support.waiting import wait_until

from .conftest import T0, make_notification

README = Path(__file__).resolve().parents[2] / "README.md"
WAIT = 60.0  # s: generous, the machine is shared


def readme_example(name: str) -> str:
    """The python block of the README that starts with `# <name>`, verbatim."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    found = [block for block in blocks if block.startswith(f"# {name}")]
    assert len(found) == 1, f"expected one README example starting with '# {name}', found {len(found)}"
    return found[0]


def command(framework: str, port: int) -> list[str]:
    if framework == "flask":
        return [sys.executable, "-m", "flask", "--app", "flask_app", "run", "--without-threads",
                "--host", "127.0.0.1", "--port", str(port)]
    if framework == "django":
        return [sys.executable, "django_app.py", str(port)]
    return [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--host", "127.0.0.1", "--port", str(port)]


@pytest.fixture(scope="module")
def hub(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """One `rsnotify hub` (one worker, quick retries) for the tests of this file."""
    process = start_hub_on_emptied_redis(tmp_path_factory.mktemp("hub"), redis_server.url, "--retry-base", "0.3",
                                         "--log-level", "info", workers=1)
    yield process
    process.stop()


def wait_for(what: str, check: Callable[[], object], app: App | None = None, hub: HubProcess | None = None) -> object:
    """`wait_until` with the app's and the hub's logs, failing at once if the app exits."""
    def ready() -> object:
        if app is not None and app.process is not None and app.process.poll() is not None:
            raise AssertionError(f"the app exited ({app.process.returncode}) while waiting for {what}:\n"
                                 f"{app.output()}")
        return check()

    logs = [*(app.logs if app else ()), *([hub.log] if hub else [])]
    return wait_until(ready, WAIT, what, logs=logs)


@dataclass
class App:
    """One framework app in its own process, its stdout and stderr appended to two log files
    across restarts; restarts keep the port."""

    framework: str
    folder: Path
    env: dict[str, str]
    port: int
    process: subprocess.Popen | None = None

    @property
    def logs(self) -> tuple[Path, Path]:
        return self.folder / f"{self.framework}-stdout.log", self.folder / f"{self.framework}-stderr.log"

    def start(self) -> None:
        stdout, stderr = self.logs
        with stdout.open("ab") as out, stderr.open("ab") as err:    # the child keeps its own descriptors
            self.process = subprocess.Popen(command(self.framework, self.port), cwd=self.folder, env=self.env,
                                            stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        """Ctrl-C, as a developer would."""
        if self.process is not None:
            cli.stop(self.process, signal.SIGINT, 20)

    @property
    def lines(self) -> list[str]:
        """The whole lines the app printed so far (one it is still writing is left for later)."""
        stdout = self.logs[0]
        lines = stdout.read_text(errors="replace").splitlines(keepends=True) if stdout.exists() else []
        return lines if not lines or lines[-1].endswith("\n") else lines[:-1]

    def output(self) -> str:
        return "".join(path.read_text(errors="replace") for path in self.logs if path.exists())

    def handled(self) -> list[str]:
        return [line for line in self.lines if line.startswith(f"{self.framework}: ")]

    def settings(self) -> SubscriberSettings:
        return SubscriberSettings.from_env(self.env)

    def subscriptions(self) -> list:
        async def read() -> list:
            subscriber = Subscriber(settings=self.settings())
            try:
                return await subscriber.subscriptions()
            finally:
                await subscriber.close()        # its SQLite connection, closed here, not at some gc
        return asyncio.run(read())

    def diagnostics(self, subscription) -> dict:
        async def read() -> dict:
            async with Subscriber(settings=self.settings()) as subscriber:
                return await subscriber.diagnostics(subscription)
        return asyncio.run(read())


@pytest.fixture
def make_app(tmp_path: Path, hub: HubProcess) -> Iterator[Callable[..., App]]:
    apps: list[App] = []

    def make(framework: str, source: str) -> App:
        (tmp_path / f"{framework}_app.py").write_text(source, encoding="utf-8")
        port = free_port()
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "RSNOTIFY_SUBSCRIBER_CALLBACK_URL": f"http://127.0.0.1:{port}/websub",
               "RSNOTIFY_SUBSCRIBER_STATE_FILE": str(tmp_path / "subscriptions.db"),
               "RSNOTIFY_SUBSCRIBER_TOPIC": f"http://example.org/{framework}/{tmp_path.name}/changes",
               "RSNOTIFY_SUBSCRIBER_HUB": hub.url}
        app = App(framework, tmp_path, env, port)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.stop()


def hub_subscriptions(hub: HubProcess, topic: str) -> list[dict]:
    status, answer = get_json(hub.url + "admin/subscriptions?" + urllib.parse.urlencode({"topic": topic}))
    assert status == 200, (status, answer)
    return answer["subscriptions"]


def publish(hub: HubProcess, topic: str, body: bytes) -> None:
    answer = fetch(hub.url, "POST", body, {
        "Content-Type": "application/xml", "Link": build_link_header([(topic, "self"), (hub.url, "hub")])})
    assert answer.status == 200, answer.text


def start_and_wait_verified(app: App, hub: HubProcess) -> None:
    """Start the app; return once the subscription it made or renewed at startup is verified
    (by this start) and active at the hub."""
    started = datetime.now(UTC)
    app.start()
    topic = app.env["RSNOTIFY_SUBSCRIBER_TOPIC"]
    wait_for("the startup subscription to be verified", lambda: [
        s for s in app.subscriptions() if s.status == "active" and s.pending_mode is None
        and s.verified_at and s.verified_at >= started], app, hub)
    wait_for("the hub to hold the subscription", lambda: [
        s for s in hub_subscriptions(hub, topic) if s["state"] == "active"], app, hub)


def delivered(app: App, subscription, count: int) -> Callable[[], dict | None]:
    def check() -> dict | None:
        report = app.diagnostics(subscription)
        return report if report["delivered"] >= count and report["backlog"] == 0 else None
    return check


@pytest.mark.parametrize("framework", ["flask", "django", "fastapi"])
def test_startup_subscription_survives_two_restarts_without_duplicates(framework: str, make_app, hub: HubProcess):
    app = make_app(framework, readme_example(f"{framework}_app.py"))
    topic = app.env["RSNOTIFY_SUBSCRIBER_TOPIC"]
    for _ in range(3):  # the first start, then two restarts
        start_and_wait_verified(app, hub)
        (subscription,) = app.subscriptions()
        if _ < 2:
            app.stop()
    assert len(hub_subscriptions(hub, topic)) == 1
    assert hub_subscriptions(hub, topic)[0]["callback"] == subscription.callback

    publish(hub, topic, make_notification(T0, 10, f"http://example.org/{framework}/res1"))
    wait_for("the notification to be handled", app.handled, app, hub)
    report = wait_for("the hub to confirm the delivery", delivered(app, subscription, 1), app, hub)
    assert report["delivered"] == 1 and report["state"] == "active"
    assert app.handled() == [f"{framework}: updated http://example.org/{framework}/res1\n"]
    assert [s.id for s in app.subscriptions()] == [subscription.id]


FAIL_ONCE = '''

failed = []


@subscriber.on_notification
def fail_once(received):  # registered first: while it raises, the README's handler is not reached
    if not failed:
        failed.append(received.notification_id)
        print("raising once", flush=True)
        raise RuntimeError("the database is down")
'''


@pytest.mark.parametrize("framework", ["flask", "django", "fastapi"])
def test_handler_that_raises_once_gets_the_notification_again(framework: str, make_app, hub: HubProcess):
    source = readme_example(f"{framework}_app.py")
    line = next(line for line in source.splitlines() if line.startswith("subscriber = Subscriber("))
    after_handler = line if "after_handler" in line else line[:-1] + ', ack="after_handler")'
    app = make_app(framework, source.replace(line, after_handler + FAIL_ONCE, 1))
    topic = app.env["RSNOTIFY_SUBSCRIBER_TOPIC"]
    start_and_wait_verified(app, hub)
    (subscription,) = app.subscriptions()

    publish(hub, topic, make_notification(T0, 10, f"http://example.org/{framework}/res2"))
    report = wait_for("the retried delivery to be confirmed", delivered(app, subscription, 1), app, hub)
    assert app.handled() == [f"{framework}: updated http://example.org/{framework}/res2\n"]
    assert [line for line in app.lines if line == "raising once\n"] == ["raising once\n"]
    statuses = [attempt["status"] for attempt in report["attempts_recent"]]
    assert "503" in [str(status) for status in statuses], report["attempts_recent"]


CONNECTION_TIMEOUT = 10.0  # s: the longest a connection may hold the single-threaded server's one thread idle


def serve_single_threaded(app, port: int) -> tuple[Any, threading.Thread]:
    """Flask's dev server without threads (`flask run --without-threads`), bound to `port`, its
    thread not started yet. Each connection gets CONNECTION_TIMEOUT: werkzeug's handler has none,
    so one connection that stalls (connected, request never sent) would hold the one thread, and
    `server.shutdown()` behind it, forever."""
    from werkzeug.serving import WSGIRequestHandler, make_server

    class Handler(WSGIRequestHandler):
        timeout = CONNECTION_TIMEOUT    # socketserver sets it on each connection's socket

    server = make_server("127.0.0.1", port, app, threaded=False, request_handler=Handler)
    return server, threading.Thread(target=server.serve_forever, name="single-threaded-flask", daemon=True)


def stop_serving(server, thread: threading.Thread, timeout: float = WAIT) -> None:
    """`server.shutdown()` waits for the request in progress, and forever when serve_forever never
    ran: bounded here, from a helper thread; then the port is released."""
    if thread.is_alive():
        stopper = threading.Thread(target=server.shutdown, daemon=True)
        stopper.start()
        thread.join(timeout)
    server.server_close()


def test_a_request_on_a_single_threaded_flask_server_subscribes_without_waiting(hub: HubProcess, tmp_path: Path):
    """The runner returns after the hub's 202: the one server thread is then free for the
    hub's verification GET (waiting for it there would deadlock)."""
    from flask import Flask

    from rsnotify.subscriber.callback.flask import callback_blueprint
    from rsnotify.subscriber.callback.wsgi import subscriber_thread

    port = free_port()
    settings = SubscriberSettings(callback_url=f"http://127.0.0.1:{port}/websub",
                                  state_file=str(tmp_path / "subscriptions.db"))
    subscriber = Subscriber(settings=settings)
    topic = f"http://example.org/request/{tmp_path.name}/changes"
    app = Flask(__name__)

    @app.post("/follow")
    def follow():
        subscription = subscriber_thread(subscriber).ensure(topic, hub.url)
        return {"id": subscription.id, "status": subscription.status}

    # Bound before the blueprint starts the subscriber's thread: a port taken meanwhile fails
    # here (werkzeug exits) with nothing left running.
    server, thread = serve_single_threaded(app, port)
    try:
        app.register_blueprint(callback_blueprint(subscriber), url_prefix="/websub")
        thread.start()
        response = fetch(f"http://127.0.0.1:{port}/follow", "POST", timeout=WAIT)
        assert response.status == 200, response.text
        answer = json.loads(response.body)
        assert answer["status"] == "pending"
        runner = subscriber_thread(subscriber)
        wait_for("the verification", lambda: runner.subscriptions()[0].status == "active", hub=hub)
        assert [s.id for s in runner.subscriptions()] == [answer["id"]]
        wait_for("the hub to hold it", lambda: len(hub_subscriptions(hub, topic)) == 1, hub=hub)
    finally:
        try:
            stop_serving(server, thread)
        finally:
            subscriber_thread(subscriber).stop()

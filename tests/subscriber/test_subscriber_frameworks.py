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
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis as redis_lib

from rsnotify.redis_server import RedisServer, free_port
from rsnotify.subscriber import Subscriber, SubscriberSettings
from rsnotify.websub import build_link_header

from ..conftest import HubProcess, start_hub
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
    # A flushed Redis: a hub refuses one that holds secrets under another hub's generated key.
    client = redis_lib.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    process = start_hub(tmp_path_factory.mktemp("hub"), "--redis-url", redis_server.url, "--workers", "1",
                        "--retry-base", "0.3", "--log-level", "info")
    yield process
    process.stop()


def wait_for(what: str, check: Callable[[], object], app: App | None = None, hub: HubProcess | None = None) -> object:
    deadline = time.monotonic() + WAIT
    while not (result := check()):
        if time.monotonic() > deadline:
            detail = (f"\napp output:\n{app.output()}" if app else "") + (f"\nhub log:\n{hub.output()[-4000:]}"
                                                                         if hub else "")
            raise AssertionError(f"timed out waiting for {what}{detail}")
        if app is not None and app.process is not None and app.process.poll() is not None:
            raise AssertionError(f"the app exited ({app.process.returncode}) while waiting for {what}:\n"
                                 f"{app.output()}")
        time.sleep(0.05)
    return result


@dataclass
class App:
    """One framework app in its own process; stdout lines are collected, restarts keep the port."""

    framework: str
    folder: Path
    env: dict[str, str]
    port: int
    process: subprocess.Popen | None = None
    lines: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.process = subprocess.Popen(command(self.framework, self.port), cwd=self.folder, env=self.env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for stream, into in ((self.process.stdout, self.lines), (self.process.stderr, self.log)):
            threading.Thread(target=lambda s=stream, i=into: i.extend(iter(s.readline, "")), daemon=True).start()

    def stop(self) -> None:
        """Ctrl-C, as a developer would."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        return "".join(self.lines) + "".join(self.log)

    def handled(self) -> list[str]:
        return [line for line in self.lines if line.startswith(f"{self.framework}: ")]

    def settings(self) -> SubscriberSettings:
        return SubscriberSettings.from_env(self.env)

    def subscriptions(self) -> list:
        return asyncio.run(Subscriber(settings=self.settings()).subscriptions())

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
    url = hub.url + "admin/subscriptions?" + urllib.parse.urlencode({"topic": topic})
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())["subscriptions"]


def publish(hub: HubProcess, topic: str, body: bytes) -> None:
    request = urllib.request.Request(hub.url, data=body, method="POST", headers={
        "Content-Type": "application/xml", "Link": build_link_header([(topic, "self"), (hub.url, "hub")])})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


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


def test_a_request_on_a_single_threaded_flask_server_subscribes_without_waiting(hub: HubProcess, tmp_path: Path):
    """The runner returns after the hub's 202: the one server thread is then free for the
    hub's verification GET (waiting for it there would deadlock)."""
    from flask import Flask
    from werkzeug.serving import make_server

    from rsnotify.subscriber.flask import callback_blueprint
    from rsnotify.subscriber.wsgi import subscriber_thread

    port = free_port()
    settings = SubscriberSettings(callback_url=f"http://127.0.0.1:{port}/websub",
                                  state_file=str(tmp_path / "subscriptions.db"))
    subscriber = Subscriber(settings=settings)
    topic = f"http://example.org/request/{tmp_path.name}/changes"
    app = Flask(__name__)
    app.register_blueprint(callback_blueprint(subscriber), url_prefix="/websub")

    @app.post("/follow")
    def follow():
        subscription = subscriber_thread(subscriber).ensure(topic, hub.url)
        return {"id": subscription.id, "status": subscription.status}

    server = make_server("127.0.0.1", port, app, threaded=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/follow", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=WAIT) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "pending"
        runner = subscriber_thread(subscriber)
        wait_for("the verification", lambda: runner.subscriptions()[0].status == "active", hub=hub)
        assert [s.id for s in runner.subscriptions()] == [answer["id"]]
        wait_for("the hub to hold it", lambda: len(hub_subscriptions(hub, topic)) == 1, hub=hub)
    finally:
        server.shutdown()
        thread.join(10)
        subscriber_thread(subscriber).stop()

"""`rsnotify hub` with its own workers, as a new user runs it: a subscriber on localhost gets
verified, a submission reaches it, and after a restart on the same data dir the subscription is
still there and still served. Sync on purpose: the hub is a subprocess, the subscriber a thread."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOTIFICATION = (FIXTURES / "change-notification-1.0.1" / "notification_ex_1.xml").read_bytes()
TOPIC = "http://publisher.example/dataset1/change/"
RSNOTIFY = [sys.executable, "-c", "from rsnotify.cli import main; main()"]


class Subscriber(ThreadingHTTPServer):
    """A loopback callback: echoes challenges (unless told to refuse) and records deliveries."""

    def __init__(self) -> None:
        self.verifications: list[dict[str, str]] = []
        self.deliveries: list[tuple[bytes, dict[str, str]]] = []
        self.refuse = False
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/callback?owner=me"


class _Handler(BaseHTTPRequestHandler):
    server: Subscriber

    def do_GET(self) -> None:
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
        self.server.verifications.append(query)
        body = b"no" if self.server.refuse else query.get("hub.challenge", "").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.deliveries.append((body, dict(self.headers)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def wait_until(condition, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_hub(data_dir: Path) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSNOTIFY_")}
    process = subprocess.Popen([*RSNOTIFY, "hub", "--port", "0", "--workers", "1", "--data-dir", str(data_dir),
                                "--log-level", "WARNING"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env)
    url = ""
    for line in process.stdout:
        if "serving at" in line:
            url = line.split("serving at", 1)[1].strip()
        if "Press Ctrl-C" in line:
            break
    threading.Thread(target=process.stdout.read, daemon=True).start()  # keep the pipe drained
    assert url, "the hub did not start"
    wait_until(lambda: http("GET", url + "health")[0] == 200, what="/health 200 (a worker seen)")
    return process, url


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None):
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except urllib.error.URLError:
        return 0, b""


def subscribe(hub_url: str, callback: str, **extra: str) -> int:
    form = urllib.parse.urlencode({"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": callback,
                                   **extra}).encode()
    return http("POST", hub_url, form, {"Content-Type": "application/x-www-form-urlencoded"})[0]


def publish(hub_url: str) -> tuple[int, bytes]:
    return http("POST", hub_url, NOTIFICATION, {"Content-Type": "application/xml",
                                                "Link": f'<{TOPIC}>; rel="self", <{hub_url}>; rel="hub"'})


def stop(process: subprocess.Popen, signum: int = signal.SIGINT) -> int:
    process.send_signal(signum)
    try:
        return process.wait(40)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.fixture
def subscriber():
    server = Subscriber()
    yield server
    server.shutdown()
    server.server_close()


def test_embedded_hub_verifies_delivers_and_keeps_subscriptions_across_a_restart(tmp_path, subscriber):
    data_dir = tmp_path / "data"
    process, hub_url = start_hub(data_dir)
    try:
        assert subscribe(hub_url, subscriber.url, **{"hub.secret": "shh", "hub.lease_seconds": "3600"}) == 202
        wait_until(lambda: b'"subscriptions": 1' in http("GET", hub_url + "health")[1], what="verified subscription")
        [verification] = subscriber.verifications
        assert verification["owner"] == "me" and verification["hub.lease_seconds"] == "3600"
        assert publish(hub_url)[0] == 200
        wait_until(lambda: len(subscriber.deliveries) == 1, what="the first delivery")
        body, headers = subscriber.deliveries[0]
        assert body == NOTIFICATION and headers["X-Hub-Signature"].startswith("sha256=")
    finally:
        assert stop(process, signal.SIGINT) == 0
    process, hub_url = start_hub(data_dir)
    try:
        assert b'"subscriptions": 1' in http("GET", hub_url + "health")[1]
        assert publish(hub_url)[0] == 200
        wait_until(lambda: len(subscriber.deliveries) == 2, what="a delivery after the restart")
        assert subscriber.deliveries[1][0] == NOTIFICATION
        assert len(subscriber.verifications) == 1  # nothing had to be verified again
    finally:
        assert stop(process, signal.SIGTERM) == 0


def test_refused_verification_creates_nothing_with_real_workers(tmp_path, subscriber):
    process, hub_url = start_hub(tmp_path / "data")
    try:
        subscriber.refuse = True
        assert subscribe(hub_url, subscriber.url) == 202
        wait_until(lambda: len(subscriber.verifications) == 1, what="the verification request")
        time.sleep(0.3)  # the worker stores nothing after a refused echo; give it the chance to be wrong
        assert b'"subscriptions": 0' in http("GET", hub_url + "health")[1]
        assert publish(hub_url)[0] == 200
        time.sleep(0.3)
        assert subscriber.deliveries == []
    finally:
        assert stop(process) == 0


def test_worker_command_serves_the_queue_in_burst_mode(redis_url, redis, tmp_path, subscriber):
    import asyncio

    import redis.asyncio as redis_async
    from rq import Queue

    from rsnotify.hub import keys, records, store
    from rsnotify.hub.crypto import encrypt_secret, load_fernet
    from rsnotify.hub.settings import HubSettings
    from rsnotify.hub.worker import jobs

    settings = HubSettings(redis_url=redis_url, data_dir=str(tmp_path / "data"))
    fernet = load_fernet(settings)  # the hub made the key; the worker must find the same one
    intent = records.Intent("subscribe", TOPIC, subscriber.url, 600, encrypt_secret(fernet, "x"))

    async def keep_intent() -> None:
        client = redis_async.Redis.from_url(redis_url)
        await store.store_intent(client, "a-challenge-for-the-worker", intent, 60)
        await client.aclose()

    asyncio.run(keep_intent())
    Queue(settings.queue_name, connection=redis).enqueue(jobs.verify_intent, "a-challenge-for-the-worker")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSNOTIFY_")}
    done = subprocess.run([*RSNOTIFY, "worker", "--burst", "--redis-url", redis_url, "--data-dir", settings.data_dir,
                           "--log-level", "WARNING"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert subscriber.verifications[0]["hub.challenge"] == "a-challenge-for-the-worker"
    assert redis.hget(keys.sub_key(keys.subscription_id(TOPIC, subscriber.url)), "lease_seconds") == b"600"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"main()\x00worker" in cmdline:
                found.append(int(entry.name))
    return found


def test_workers_do_not_outlive_a_killed_hub(tmp_path):
    from rsnotify.hub.embedded import stop_stale_redis

    data_dir = tmp_path / "data"
    process, _ = start_hub(data_dir)
    [worker_pid] = _children(process.pid)
    process.kill()  # SIGKILL: the hub cannot stop its workers itself
    process.wait()
    try:
        wait_until(lambda: not Path(f"/proc/{worker_pid}").exists() or
                   (Path(f"/proc/{worker_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"),
                   timeout=15, what="the orphaned worker to stop")
    finally:
        stop_stale_redis(data_dir.resolve())  # the embedded Redis the killed hub left behind

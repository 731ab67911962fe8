"""Done-when of fan-out, as a new user would try it: `rsnotify hub` (embedded Redis, two worker
children) and two loopback subscribers; every publish reaches both in order, signed where a
secret was given, and a subscriber that was down for a while catches up by itself."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import redis as redis_lib

from rsnotify.hub import keys
from rsnotify.websub import SEQUENCE_HEADER, SIGNATURE_HEADER, verify_signature

NOTIFICATION = (Path(__file__).resolve().parents[1] / "fixtures" / "change-notification-1.0.1"
                / "notification_ex_1.xml").read_bytes()
TOPIC = "http://source.example.org/resourcesync/changes"


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_rsnotify_hub_delivers_to_two_subscribers_and_a_returning_one_catches_up(sink, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSNOTIFY_")}
    env.update(RSNOTIFY_RETRY_BASE="0.2", RSNOTIFY_RETRY_CAP="0.5", RSNOTIFY_LOG_LEVEL="WARNING")
    hub = subprocess.Popen([sys.executable, "-c", "from rsnotify.cli import main; main()", "hub", "--port", "0",
                            "--workers", "2", "--data-dir", str(tmp_path / "data")],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    threading.Thread(target=lambda: output.extend(iter(hub.stdout.readline, "")), daemon=True).start()
    try:
        wait_for(lambda: any("serving at" in line for line in output), 30, f"the hub to start: {output}")
        hub_url = re.search(r"serving at (http://\S+)", "".join(output)).group(1)
        wait_for(lambda: b'"workers": 0' not in _get(hub_url + "health"), 30, "the workers")

        down_until = time.monotonic() + 1.5           # the second subscriber is down for a while
        sink.behave["/down"] = lambda n: 503 if time.monotonic() < down_until else 200
        for path, secret in (("/up", "open sesame"), ("/down", None)):
            form = {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": sink.url(path)}
            if secret:
                form["hub.secret"] = secret
            assert post(hub_url, urllib.parse.urlencode(form).encode(),
                        {"Content-Type": "application/x-www-form-urlencoded"}) == 202
        embedded = redis_lib.Redis.from_url(f"unix://{tmp_path / 'data' / 'redis.sock'}")
        try:
            wait_for(lambda: embedded.scard(keys.topic_subs_key(keys.topic_id(TOPIC))) == 2, 30,
                     "both subscriptions to be verified")
        finally:
            embedded.close()

        link = f'<{TOPIC}>; rel="self", <{hub_url}>; rel="hub"'
        for n in range(20):
            assert post(hub_url, NOTIFICATION, {"Content-Type": "application/xml", "Link": link}) == 200
        wait_for(lambda: len(sink.bodies("/up")) >= 20, 30, "the first subscriber")
        wait_for(lambda: len(set(_seqs(sink, "/down"))) >= 20, 30, "the returning subscriber")
    finally:
        hub.send_signal(signal.SIGINT)
        try:
            hub.wait(30)
        except subprocess.TimeoutExpired:
            hub.kill()
    with sink.lock:
        up = [(data, headers) for p, _, data, headers, _ in sink.received if p == "/up"]
        down = [headers for p, _, _, headers, _ in sink.received if p == "/down"]
    assert [int(h[SEQUENCE_HEADER]) for _, h in up] == list(range(1, 21))
    assert all(data == NOTIFICATION and verify_signature(data, "open sesame", h[SIGNATURE_HEADER]) for data, h in up)
    assert all(SIGNATURE_HEADER not in h for h in down)
    seqs = [int(h[SEQUENCE_HEADER]) for h in down]
    assert [s for k, s in enumerate(seqs) if s not in seqs[:k]] == list(range(1, 21))
    assert len(seqs) > 20                              # it was down: some were tried more than once


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read()
    except urllib.error.HTTPError as error:
        return error.read()
    except OSError:
        return b""


def _seqs(sink, path: str) -> list[int]:
    with sink.lock:
        return [int(h[SEQUENCE_HEADER]) for p, _, _, h, _ in sink.received if p == path]

"""Scale-out, proven with real processes: two `rsnotify hub --redis-url … --workers 0` web
processes and two `rsnotify worker` processes on one Redis. Subscribe through one web process,
publish through the other, SIGKILL the worker that is delivering in the middle of a POST, and
every notification still arrives, in order (at-least-once: the one in flight may come twice)."""
from __future__ import annotations

import asyncio
import json
import signal
import threading
from pathlib import Path

from cryptography.fernet import Fernet

from rsnotify.websub import SEQUENCE_HEADER
from tests.support import cli
from tests.support.http import http, post_form
from tests.support.hubproc import start_hub
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import wait_until

from .conftest import TOPIC, body

NOTIFICATIONS = 40
PUBLIC_URL = "http://hub.rsnotify.test/"
GATE_AT = 10            # the subscriber holds its answer to this POST until the worker is killed


def test_two_web_processes_two_workers_one_killed_mid_delivery(redis_url: str, tmp_path: Path) -> None:
    gate, gate_reached = threading.Event(), threading.Event()

    async def held_at_the_gate(request) -> int:
        if subscriber.count("/scaled") == GATE_AT:
            gate_reached.set()
            while not gate.is_set():
                await asyncio.sleep(0.02)
        return 204

    subscriber = RecordingSubscriber(default_status=204)
    subscriber.on("/scaled", held_at_the_gate)
    server = subscriber.serve_in_thread()
    hubs, workers = [], []
    try:
        env = {"RSNOTIFY_REDIS_URL": redis_url, "RSNOTIFY_SECRET_KEY": Fernet.generate_key().decode(),
               "RSNOTIFY_LOCK_TTL": "2", "RSNOTIFY_RECONCILE_INTERVAL": "0.5", "RSNOTIFY_RETRY_BASE": "0.1",
               # one public URL for every process, as behind a load balancer: publishers name it in rel="hub"
               "RSNOTIFY_PUBLIC_URL": PUBLIC_URL,
               "RSNOTIFY_ALLOW_NETWORK": "127.0.0.0/8"}     # the subscriber listens on loopback
        for name in ("web-a", "web-b"):
            hubs.append(start_hub(tmp_path, data_dir=tmp_path / name, workers=0, env=env))
        webs = [hub.url for hub in hubs]
        workers.append(cli.start("worker", "--name", "worker-a", log=tmp_path / "worker-a.log", env=env))
        worker_a = workers[0]

        callback = subscriber.url("/scaled")
        status, answer = post_form(webs[0], {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": callback})
        assert status == 202, answer

        def subscribed_seen_by_web_b() -> bool:
            status, answer = http("GET", webs[1] + "admin/subscriptions")
            return status == 200 and json.loads(answer)["total"] == 1
        wait_until(subscribed_seen_by_web_b, 30, "the subscription to be verified", logs=tmp_path)

        link = f'<{TOPIC}>; rel="self", <{PUBLIC_URL}>; rel="hub"'
        for n in range(1, NOTIFICATIONS + 1):
            status, answer = http("POST", webs[1], body(n), {"Content-Type": "application/xml", "Link": link})
            assert status == 200, answer
            assert json.loads(answer)["sequence"] == n

        assert gate_reached.wait(30), (tmp_path / "worker-a.log").read_text()
        workers.append(cli.start("worker", "--name", "worker-b", log=tmp_path / "worker-b.log", env=env))
        worker_b = workers[1]

        def two_workers() -> bool:
            status, answer = http("GET", webs[0] + "health")
            return status == 200 and json.loads(answer)["workers"] == 2
        wait_until(two_workers, 30, "worker-b to start", logs=tmp_path)
        worker_a.send_signal(signal.SIGKILL)           # mid-POST: worker-a is waiting for our answer
        worker_a.wait(10)
        gate.set()

        def sequences() -> list[int]:
            return [int(r.headers[SEQUENCE_HEADER]) for r in subscriber.deliveries("/scaled")]
        wait_until(lambda: set(sequences()) >= set(range(1, NOTIFICATIONS + 1)), 60,
                   "every notification to arrive after the kill", logs=tmp_path)
        assert worker_b.poll() is None
    finally:
        gate.set()
        server.stop()
        for process in workers:
            cli.stop(process, signal.SIGTERM, timeout=10)
        for hub in hubs:
            hub.stop(signal.SIGTERM, timeout=10)

    received = sequences()
    highest = 0
    for seq in received:            # in order: never ahead of the next one due (repeats allowed)
        assert seq <= highest + 1, f"{seq} arrived before {highest + 1}: {received}"
        highest = max(highest, seq)
    first_arrivals = list(dict.fromkeys(received))
    assert first_arrivals == list(range(1, NOTIFICATIONS + 1))
    assert received.count(GATE_AT) >= 2          # the one in flight at the kill came again
    assert len(received) <= NOTIFICATIONS + 10   # re-sent from the last checkpoint, not from the start

"""A callback's path is the only credential of an unsigned subscription: `rsnotify hub` (web
process and its worker children, default log level) never writes it to its log, whatever
happens to the subscription: activation, delivery, failed attempts and a dead letter, a 410,
a refused verification and an unsubscription. The host still shows, so a line says where."""
from __future__ import annotations

import secrets
from pathlib import Path

from rsnotify.websub import SEQUENCE_HEADER
from tests.support.http import http, post_form
from tests.support.hubproc import start_hub
from tests.support.waiting import wait_until

NOTIFICATION = (Path(__file__).resolve().parents[1] / "fixtures" / "change-notification-1.0.1"
                / "notification_ex_1.xml").read_bytes()
TOPIC = "http://source.example.org/resourcesync/changes"


def test_hub_and_worker_logs_never_show_a_callback_path(sink, tmp_path) -> None:
    secret = secrets.token_hex(12)
    paths = {name: f"/websub/{secret}-{name}" for name in ("ok", "failing", "gone", "refusing", "leaving")}
    sink.on(paths["failing"], 500)
    sink.on(paths["gone"], 410)
    sink.on(paths["refusing"], 404, method="GET")     # the verification GET is refused
    hub = start_hub(tmp_path, workers=1, env={"RSNOTIFY_RETRY_BASE": "0.1", "RSNOTIFY_RETRY_CAP": "0.2",
                                              "RSNOTIFY_MAX_ATTEMPTS": "2"})
    try:
        for path in paths.values():
            form = {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": sink.url(path)}
            assert post_form(hub.url, form)[0] == 202
        wait_until(lambda: all(sink.verifications(p) for p in paths.values()), 60, "every verification GET")
        hub.wait_for_output(r"subscribe of \S+ for \S+ not verified", 60)
        wait_until(lambda: hub.output().count(" activated: ") == 4, 60, "four activated subscriptions")
        form = {"hub.mode": "unsubscribe", "hub.topic": TOPIC, "hub.callback": sink.url(paths["leaving"])}
        assert post_form(hub.url, form)[0] == 202
        hub.wait_for_output(r"unsubscribed: ", 60)

        link = f'<{TOPIC}>; rel="self", <{hub.url}>; rel="hub"'
        assert http("POST", hub.url, NOTIFICATION, {"Content-Type": "application/xml", "Link": link})[0] == 200
        wait_until(lambda: [int(r.headers[SEQUENCE_HEADER]) for r in sink.deliveries(paths["ok"])] == [1], 60,
                   "the delivery")
        hub.wait_for_output(r"dead letter \S+ \(seq 1\) for ", 60)
        hub.wait_for_output(r"answered 410 Gone", 60)
    finally:
        hub.stop()
    log = hub.output()
    assert secret not in log, [line for line in log.splitlines() if secret in line]
    host = sink.url("/").rstrip("/")
    for line in (" activated: ", "not verified", "unsubscribed: ", "dead letter", "failed (attempt 1)", "410 Gone"):
        assert any(line in text and f"{host}/…" in text for text in log.splitlines()), (line, log[-5000:])
    assert not sink.deliveries(paths["leaving"]) and not sink.deliveries(paths["refusing"])

"""Done-when of fan-out, as a new user would try it: `rsnotify hub` (embedded Redis, two worker
children) and two loopback subscribers; every publish reaches both in order, signed where a
secret was given, and a subscriber that was down for a while catches up by itself."""
from __future__ import annotations

import time
from pathlib import Path

import redis as redis_lib

from rsnotify.hub import keys
from rsnotify.websub import SEQUENCE_HEADER, SIGNATURE_HEADER, verify_signature
from tests.support.http import http, post_form
from tests.support.hubproc import start_hub
from tests.support.waiting import wait_until

NOTIFICATION = (Path(__file__).resolve().parents[1] / "fixtures" / "change-notification-1.0.1"
                / "notification_ex_1.xml").read_bytes()
TOPIC = "http://source.example.org/resourcesync/changes"


def test_rsnotify_hub_delivers_to_two_subscribers_and_a_returning_one_catches_up(sink, tmp_path) -> None:
    hub = start_hub(tmp_path, data_dir=tmp_path / "data", workers=2,
                    env={"RSNOTIFY_RETRY_BASE": "0.2", "RSNOTIFY_RETRY_CAP": "0.5", "RSNOTIFY_LOG_LEVEL": "WARNING"})
    hub_url = hub.url
    try:
        down_until = time.monotonic() + 1.5           # the second subscriber is down for a while
        sink.on("/down", lambda request: 503 if time.monotonic() < down_until else 200)
        for path, secret in (("/up", "open sesame"), ("/down", None)):
            form = {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": sink.url(path)}
            if secret:
                form["hub.secret"] = secret
            assert post_form(hub_url, form)[0] == 202
        embedded = redis_lib.Redis.from_url(f"unix://{tmp_path / 'data' / 'redis.sock'}")
        try:
            wait_until(lambda: embedded.scard(keys.topic_subs_key(keys.topic_id(TOPIC))) == 2, 30,
                       "both subscriptions to be verified")
        finally:
            embedded.close()

        link = f'<{TOPIC}>; rel="self", <{hub_url}>; rel="hub"'
        for n in range(20):
            assert http("POST", hub_url, NOTIFICATION, {"Content-Type": "application/xml", "Link": link})[0] == 200
        wait_until(lambda: len(sink.bodies("/up")) >= 20, 30, "the first subscriber")
        wait_until(lambda: len(set(_seqs(sink, "/down"))) >= 20, 30, "the returning subscriber")
    finally:
        hub.stop()
    up = [(r.body, r.headers) for r in sink.deliveries("/up")]
    down = [r.headers for r in sink.deliveries("/down")]
    assert [int(h[SEQUENCE_HEADER]) for _, h in up] == list(range(1, 21))
    assert all(data == NOTIFICATION and verify_signature(data, "open sesame", h[SIGNATURE_HEADER]) for data, h in up)
    assert all(SIGNATURE_HEADER not in h for h in down)
    seqs = [int(h[SEQUENCE_HEADER]) for h in down]
    assert [s for k, s in enumerate(seqs) if s not in seqs[:k]] == list(range(1, 21))
    assert len(seqs) > 20                              # it was down: some were tried more than once


def _seqs(sink, path: str) -> list[int]:
    return [int(r.headers[SEQUENCE_HEADER]) for r in sink.deliveries(path)]

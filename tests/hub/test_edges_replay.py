"""rsnotify.replay_from against a real `rsnotify hub` with a worker: what one subscription may have
re-sent is counted and held within --replay-max, and its admin view shows the count."""
from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest

from tests.support.http import fetch
from tests.support.subscribers import RecordingSubscriber
from tests.support.waiting import wait_until

FORM = "application/x-www-form-urlencoded"
TOPIC = "http://data.example.org/ds1/changes"
NOTIFICATION = (
    '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
    '<rs:md capability="change-notification" from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>'
    '<url><loc>http://data.example.org/res{n}</loc><rs:md change="updated" datetime="2013-01-03T00:05:00Z"/>'
    '</url></urlset>'
)


@pytest.fixture
def recorder() -> Iterator[RecordingSubscriber]:
    recording = RecordingSubscriber(default_status=204)
    server = recording.serve_in_thread()
    yield recording
    server.stop()


def publish(hub_url: str, n: int) -> None:
    answer = fetch(hub_url, "POST", NOTIFICATION.format(n=n),
                   {"Content-Type": "application/xml", "Link": f'<{TOPIC}>; rel="self", <{hub_url}>; rel="hub"'})
    assert answer.status == 200, answer.text


def subscribe_with_replay(hub_url: str, callback: str, first: int) -> None:
    form = {"hub.mode": "subscribe", "hub.topic": TOPIC, "hub.callback": callback, "rsnotify.replay_from": str(first)}
    answer = fetch(hub_url, "POST", urlencode(form), {"Content-Type": FORM})
    assert answer.status == 202, answer.text


def sequences(recorder: RecordingSubscriber) -> list[int]:
    return [int(r.headers["X-RSNotify-Sequence"]) for r in recorder.deliveries()]


def test_a_replay_past_replay_max_is_not_delivered(hub_process, redis_url: str, recorder) -> None:
    # --reconcile-interval 60: the replay must go out when the subscription is activated, not when
    # the reconciler finds the subscription behind the log (which it did, 5-10 s later)
    hub = hub_process("--replay-max", "3", "--reconcile-interval", "60", redis_url=redis_url, workers=1)
    for n in range(1, 11):
        publish(hub.url, n)
    subscribe_with_replay(hub.url, recorder.url(), 1)
    wait_until(lambda: len(sequences(recorder)) >= 3, 30.0, "the replayed notifications")
    hub.wait_for_output(r"subscription \w+ activated")
    # asking again (a renewal) re-sends nothing more: the subscription had its three
    subscribe_with_replay(hub.url, recorder.url(), 1)
    hub.wait_for_output(r"--replay-max 3 reached \(3 re-sent\)")
    publish(hub.url, 11)
    wait_until(lambda: 11 in sequences(recorder), 60.0, "the new notification")
    assert sequences(recorder) == [8, 9, 10, 11]
    sid = json.loads(fetch(hub.url + "admin/subscriptions").text)["subscriptions"][0]["sid"]
    view = json.loads(fetch(hub.url + f"admin/subscriptions/{sid}").text)
    assert (view["replayed"], view["replay_max"], view["replay_left"]) == (3, 3, 0)


def test_replay_max_0_turns_the_extension_off(hub_process, redis_url: str, recorder) -> None:
    hub = hub_process("--replay-max", "0", redis_url=redis_url, workers=1)
    for n in range(1, 4):
        publish(hub.url, n)
    subscribe_with_replay(hub.url, recorder.url(), 1)
    hub.wait_for_output(r"subscription \w+ activated")
    publish(hub.url, 4)
    wait_until(lambda: sequences(recorder), 60.0, "the new notification")
    assert sequences(recorder) == [4]

"""A Destination refuses a delivered notification dated further ahead than its future_skew, as
the hub refuses one at intake: such a date would become the latest it remembers (the from/until
chain, sync's checkpoint) and make every real change after it look old. Refused with a 400 and a
reason, before anything is stored, so the hub delivers it again later; within the skew it is
taken. Both receivers: the application's hooks and sync's inbox."""
from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from rsnotify.subscriber.callback.core import CallbackRequest
from rsnotify.subscriber.settings import SubscriberSettings
from rsnotify.subscriber.store import Subscription
from rsnotify.subscriber.sync.push import Push
from rsnotify.subscriber.sync.state import SyncState

from .conftest import Recorder, make_notification

TOPIC = "http://example.com/dataset1/change/"


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@pytest.mark.parametrize("ack", ["after_response", "after_handler"])
async def test_a_notification_dated_in_the_future_is_refused_and_not_remembered(fake_hub, make_subscriber, ack):
    recorder = Recorder()
    subscriber = await make_subscriber(on_notification=recorder, ack=ack)
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)

    # a day ahead: its changes and its `until`
    status, reply = await fake_hub.deliver(subscription.callback, make_notification(now() + timedelta(days=1)),
                                           secret=subscription.secret, notification_id="n-1", sequence=1)
    assert status == 400, reply
    assert "dated in the future" in reply and "future_skew is 300 s" in reply and "nothing was stored" in reply
    assert "has datetime=" in reply and "has until=" in reply
    stored = await subscriber.store.get(subscription.id)
    assert stored is not None and stored.last_until is None and stored.last_sequence is None
    assert "n-1" not in stored.recent_ids

    # the next real one is taken and shows no break in the chain against the refused one
    start = now() - timedelta(minutes=10)
    status, _ = await fake_hub.deliver(subscription.callback, make_notification(start, 9),
                                       secret=subscription.secret, notification_id="n-2", sequence=2)
    assert status == 200
    # within the skew (clocks drift): taken
    status, _ = await fake_hub.deliver(subscription.callback, make_notification(start + timedelta(minutes=9), 5),
                                       secret=subscription.secret, notification_id="n-3", sequence=3)
    assert status == 200
    await recorder.wait(2)
    await subscriber.drain(5)
    assert [r.notification_id for r in recorder.received] == ["n-2", "n-3"]
    assert recorder.received[1].notification is not None
    assert [g.kind for g in recorder.received[1].gaps] == []
    assert (await subscriber.store.get(subscription.id)).last_until == start + timedelta(minutes=14)


async def test_the_skew_is_a_setting(fake_hub, make_subscriber):
    subscriber = await make_subscriber(settings=SubscriberSettings(future_skew=0, verification_timeout=5))
    subscription = await subscriber.subscribe(TOPIC, fake_hub.url)
    status, reply = await fake_hub.deliver(subscription.callback,
                                           make_notification(now() - timedelta(minutes=9), 10),
                                           secret=subscription.secret)
    assert status == 400 and "future_skew is 0 s" in reply
    assert SubscriberSettings.from_env({"RSNOTIFY_SUBSCRIBER_FUTURE_SKEW": "60"}).future_skew == 60


async def test_sync_inbox_stores_nothing_dated_in_the_future(tmp_path):
    state = SyncState(tmp_path / "state.db")
    push = Push(state, SubscriberSettings(), asyncio.Event())
    try:
        subscription = Subscription(id="s" * 20, topic="http://src.example/changes", hub="http://hub.example/",
                                    callback="http://127.0.0.1:9/websub/" + "s" * 20, status="active")
        await push.store.put(subscription)

        def post(body: bytes, notification_id: str) -> CallbackRequest:
            return CallbackRequest("POST", subscription.id, body=body, headers=(
                ("Content-Type", "application/xml"), ("X-RSNotify-Id", notification_id)))

        refused = await push.subscriber.core.handle(post(make_notification(now() + timedelta(days=365)), "n-1"))
        assert refused.status == 400 and "dated in the future" in refused.text
        assert state.inbox_counts() == {}
        taken = await push.subscriber.core.handle(post(make_notification(now() - timedelta(minutes=10)), "n-2"))
        assert taken.status == 200 and state.inbox_counts() == {"pending": 1}
    finally:
        await push.close(unsubscribe=False)
        state.close()

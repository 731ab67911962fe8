"""The Publisher against loopback fake hubs: what it POSTs, chaining, splitting, several hubs,
refusals, retries, and reading the hub's answer."""
from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from aiohttp import web

from rsnotify.notification import ChangeType, ResourceChange
from rsnotify.publisher import (
    ChangeInputError,
    HubUnreachableError,
    Publisher,
    PublishError,
)
from rsnotify.xml import parse_notification
from tests.support.clock import Clock

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

TOPIC = "https://example.org/dataset1/change/"
CAPLIST = "https://example.org/dataset1/capabilitylist.xml"
T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


def at(minutes: int) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def fast(hub_url, **kwargs) -> Publisher:  # type: ignore[no-untyped-def]
    kwargs.setdefault("retry_delay", 0.01)
    kwargs.setdefault("now", Clock(T0, tick=1.0))    # one second later at each reading
    return Publisher(hub_url, TOPIC, **kwargs)


async def test_publish_posts_one_xml_document_with_link_and_token(hub_server):
    async with fast(hub_server.url, capability_list_url=CAPLIST, token="s3cret") as publisher:
        ids = await publisher.publish([
            ("https://example.org/b", "updated", at(2)),
            {"loc": "https://example.org/a", "change": "created", "datetime": at(1),
             "hash": "md5:1584abdf8ebdc9802ac0c6a7402c03b6", "length": 8876, "type": "application/pdf"},
            ResourceChange("https://example.org/c", ChangeType.DELETED, T0 + timedelta(minutes=3)),
        ])
    assert ids == ["00001-0"]
    [got] = hub_server.received
    assert got.headers["Content-Type"] == "application/xml"
    assert got.headers["Authorization"] == "Bearer s3cret"
    assert got.links("self") == [TOPIC] and got.links("hub") == [hub_server.url]
    assert got.links("resourcesync") == [CAPLIST]
    notification = parse_notification(got.body)
    assert [c.loc for c in notification.changes] == [
        "https://example.org/a", "https://example.org/b", "https://example.org/c"]  # chronological
    assert notification.up == CAPLIST
    assert notification.from_time == T0 + timedelta(minutes=1)
    assert notification.until_time == T0 + timedelta(minutes=3)
    first = notification.changes[0]
    assert (first.hash, first.length, first.media_type) == ("md5:1584abdf8ebdc9802ac0c6a7402c03b6", 8876, "application/pdf")


async def test_changes_without_datetime_get_the_clock_time(hub_server):
    async with fast(hub_server.url, now=lambda: T0) as publisher:
        await publisher.publish([("https://example.org/a", "updated")])
    [change] = parse_notification(hub_server.received[0].body).changes
    assert change.changed_at == T0


async def test_consecutive_publishes_chain_from_until(hub_server):
    async with fast(hub_server.url) as publisher:
        await publisher.publish([("https://example.org/a", "updated", at(1))])
        await publisher.publish([("https://example.org/b", "updated", at(5))])
    first, second = (parse_notification(s.body) for s in hub_server.received)
    assert second.from_time == first.until_time == T0 + timedelta(minutes=1)
    assert second.until_time == T0 + timedelta(minutes=5)


async def test_chain_survives_a_restart_through_the_state_file(hub_server, tmp_path):
    state = tmp_path / "state.json"
    async with fast(hub_server.url, state_path=str(state)) as publisher:
        await publisher.publish([("https://example.org/a", "updated", at(1))])
    async with fast(hub_server.url, state_path=str(state)) as restarted:
        await restarted.publish([("https://example.org/b", "updated", at(2))])
    first, second = (parse_notification(s.body) for s in hub_server.received)
    assert second.from_time == first.until_time


async def test_a_change_dated_before_the_chain_end_is_refused_before_sending(hub_server):
    async with fast(hub_server.url, now=Clock(T0 + timedelta(hours=1), tick=1.0)) as publisher:
        await publisher.publish([("https://example.org/a", "updated", at(10))])
        with pytest.raises(ChangeInputError, match="before the end of topic"):
            await publisher.publish([("https://example.org/b", "updated", at(5))])
    assert len(hub_server.received) == 1


async def test_a_change_dated_far_in_the_future_is_refused_and_changes_nothing(hub_server, tmp_path):
    # recorded, 2099 would end the topic's chain there: every later, truthful publish would be
    # "before the end of the last notification" and refused, for good
    state = str(tmp_path / "memory.db")
    async with fast(hub_server.url, state_path=state) as publisher:
        with pytest.raises(ValueError, match=r"https://example.org/far has datetime=2099-01-01T00:00:00Z in the "
                                             r"future; a change's datetime is when it happened: expected at most "
                                             r"2024-05-01T10:05:0\dZ"):
            await publisher.publish([("https://example.org/near", "updated", at(0)),
                                     ("https://example.org/far", "updated", "2099-01-01T00:00:00Z")])
        assert publisher.chain.last_until(TOPIC) is None
        await publisher.publish([("https://example.org/b", "updated", at(1))])
        # a clock a little fast (within future_skew, 300 s) is fine
        await publisher.publish([("https://example.org/c", "updated", at(4))])
    first, second = (parse_notification(s.body) for s in hub_server.received)
    assert [c.loc for c in first.changes] == ["https://example.org/b"]
    assert second.until_time == T0 + timedelta(minutes=4)


async def test_changes_dated_by_a_clock_set_back_take_the_chain_end_and_still_go_out(hub_server, tmp_path):
    clock = Clock(T0)
    async with fast(hub_server.url, state_path=str(tmp_path / "memory.db"), now=clock) as publisher:
        await publisher.publish([("https://example.org/a", "updated")])         # dated T0 by a fast clock
        clock.set(T0 - timedelta(minutes=3))                                    # NTP sets it back
        await publisher.publish([("https://example.org/b", "updated")])
        # a datetime given with the change is the caller's word: still refused before the chain's end
        with pytest.raises(ChangeInputError, match="before the end of topic"):
            await publisher.publish([("https://example.org/c", "updated", at(-1))])
    first, second = (parse_notification(s.body) for s in hub_server.received)
    assert second.from_time == first.until_time == T0
    assert [(c.loc, c.changed_at) for c in second.changes] == [("https://example.org/b", T0)]


async def test_a_submitted_document_dated_in_the_future_is_refused(hub_server, tmp_path):
    example = (FIXTURES / "change-notification-1.0.1" / "notification_ex_1.xml").read_bytes()
    until = parse_notification(example).until_time
    async with fast(hub_server.url, state_path=str(tmp_path / "memory.db"), now=lambda: until - timedelta(hours=1),
                    future_skew=60) as publisher:
        with pytest.raises(ValueError, match=r"until=2013-01-03T00:10:00Z in the future"):
            await publisher.submit(example)
        assert publisher.chain.last_until(TOPIC) is None
    assert hub_server.received == []


async def test_many_changes_are_split_into_chained_documents(hub_server):
    changes = [(f"https://example.org/r{i}", "updated", at(i)) for i in range(7)]
    async with fast(hub_server.url, max_entries=3, now=Clock(T0 + timedelta(hours=1), tick=1.0)) as publisher:
        ids = await publisher.publish(changes)
    documents = [parse_notification(s.body) for s in hub_server.received]
    assert ids == ["00001-0", "00002-0", "00003-0"]
    assert [len(d.changes) for d in documents] == [3, 3, 1]
    assert [c.loc for d in documents for c in d.changes] == [f"https://example.org/r{i}" for i in range(7)]
    for before, after in pairwise(documents):
        assert after.from_time == before.until_time


async def test_every_hub_of_the_topic_gets_every_document(aiohttp_server, make_hub):
    hubs = [make_hub(), make_hub()]
    for hub in hubs:
        server = await aiohttp_server(hub.app(), host="127.0.0.1")
        hub.url = f"http://127.0.0.1:{server.port}/hub"
    async with fast([h.url for h in hubs]) as publisher:
        ids = await publisher.publish([("https://example.org/a", "updated", at(1))])
    assert len(ids) == 2
    assert hubs[0].received[0].body == hubs[1].received[0].body
    assert [h.received[0].links("hub") for h in hubs] == [[hubs[0].url], [hubs[1].url]]


async def test_a_4xx_refusal_raises_publish_error_with_status_and_reason_and_is_not_retried(hub_server):
    hub_server.answers = [403]
    async with fast(hub_server.url) as publisher:
        with pytest.raises(PublishError) as caught:
            await publisher.publish([("https://example.org/a", "updated", at(1))])
        assert publisher.chain.last_until(TOPIC) is None  # nothing accepted: the chain stays
    error = caught.value
    assert (error.status, error.reason, error.hub_url) == (403, "publisher token not allowed for this topic", hub_server.url)
    assert "refused the notification with 403" in str(error)
    assert [c.loc for c in error.unsent] == ["https://example.org/a"]
    assert len(hub_server.received) == 1


async def test_unsent_changes_of_a_partly_accepted_publish_can_be_retried(hub_server):
    hub_server.answers = [200, 400]
    changes = [(f"https://example.org/r{i}", "updated", at(i)) for i in range(4)]
    async with fast(hub_server.url, max_entries=2) as publisher:
        with pytest.raises(PublishError) as caught:
            await publisher.publish(changes)
        assert [r.notification_id for r in caught.value.accepted] == ["00001-0"]
        assert await publisher.publish(caught.value.unsent) == ["00002-0"]
    documents = [parse_notification(s.body) for s in hub_server.accepted]
    assert [c.loc for d in documents for c in d.changes] == [f"https://example.org/r{i}" for i in range(4)]
    assert documents[1].from_time == documents[0].until_time


async def test_a_redirect_is_a_refusal_naming_the_new_location(hub_server):
    hub_server.answers = [307]
    async with fast(hub_server.url) as publisher:
        with pytest.raises(PublishError, match="redirect to http://127.0.0.1:9/elsewhere/") as caught:
            await publisher.publish([("https://example.org/a", "updated", at(1))])
    assert caught.value.status == 307


async def test_5xx_answers_are_retried_until_accepted(hub_server):
    hub_server.answers = [503, 500]
    async with fast(hub_server.url) as publisher:
        assert await publisher.publish([("https://example.org/a", "updated", at(1))]) == ["00001-0"]
    assert len(hub_server.received) == 3
    assert hub_server.received[0].body == hub_server.received[2].body


async def test_5xx_past_the_attempts_raises_with_the_last_status(hub_server):
    hub_server.answers = [503] * 3
    async with fast(hub_server.url, max_attempts=3) as publisher:
        with pytest.raises(PublishError, match="after 3 attempts") as caught:
            await publisher.publish([("https://example.org/a", "updated", at(1))])
    assert caught.value.status == 503 and caught.value.reason == "storage is busy"


async def test_a_hub_that_is_briefly_down_gets_the_notification_when_it_is_back(make_hub, unused_port):
    hub = make_hub()
    hub.url = f"http://127.0.0.1:{unused_port}/hub"

    async def come_back_after_a_while() -> web.AppRunner:
        await asyncio.sleep(0.3)  # a real outage: nothing listens on the port meanwhile
        runner = web.AppRunner(hub.app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", unused_port).start()
        return runner

    comeback = asyncio.create_task(come_back_after_a_while())
    async with fast(hub.url, retry_delay=0.1, max_attempts=8) as publisher:
        ids = await publisher.publish([("https://example.org/a", "updated", at(1))])
    await (await comeback).cleanup()
    assert ids == ["00001-0"] and len(hub.received) == 1


async def test_a_hub_that_stays_down_raises_hub_unreachable(unused_port):
    async with fast(f"http://127.0.0.1:{unused_port}/hub", max_attempts=2) as publisher:
        with pytest.raises(HubUnreachableError, match="could not be reached after 2 attempts") as caught:
            await publisher.publish([("https://example.org/a", "updated", at(1))])
    assert caught.value.status is None


@pytest.mark.parametrize("style", ["header", "text"])
async def test_the_id_is_read_from_the_header_or_a_plain_text_body(hub_server, style):
    hub_server.id_style = style
    async with fast(hub_server.url) as publisher:
        assert await publisher.publish([("https://example.org/a", "updated", at(1))]) == ["00001-0"]


async def test_a_hub_giving_no_id_still_counts_as_accepted(hub_server):
    hub_server.id_style = "none"
    async with fast(hub_server.url) as publisher:
        [receipt] = await publisher.publish_receipts([("https://example.org/a", "updated", at(1))])
    assert receipt.notification_id is None and receipt.status == 200


async def test_bad_changes_are_all_reported_and_nothing_is_sent(hub_server):
    async with fast(hub_server.url) as publisher:
        with pytest.raises(ChangeInputError) as caught:
            await publisher.publish([
                ("https://example.org/a", "moved"),
                {"loc": "https://example.org/b", "change": "updated", "datetime": "yesterday"},
                {"url": "https://example.org/c"},
                ("https://example.org/d", "updated", datetime(2024, 1, 1)),
            ])
    lines = str(caught.value).splitlines()
    assert lines[0].startswith("change #1:") and "moved" in lines[0]
    assert lines[1].startswith("change #2:") and "'yesterday' is not a W3C datetime" in lines[1]
    assert lines[2].startswith("change #3:") and "unknown key(s) url" in lines[2]
    assert lines[3].startswith("change #4:") and "timezone-aware" in lines[3]
    assert hub_server.received == []


async def test_submit_sends_a_valid_document_byte_for_byte_and_refuses_an_invalid_one(hub_server):
    example = (FIXTURES / "change-notification-1.0.1" / "notification_ex_1.xml").read_bytes()
    async with fast(hub_server.url) as publisher:
        [receipt] = await publisher.submit(example)
        with pytest.raises(ChangeInputError, match="not a valid change notification"):
            await publisher.submit(example.replace(b'change="created"', b'change="moved"'))
    assert hub_server.received[0].body == example
    assert receipt.change_count == 2
    assert publisher.chain.last_until(TOPIC) == parse_notification(example).until_time
    assert publisher.latest_document == example


def test_publish_blocking_works_without_an_event_loop(threaded_hub):
    publisher = fast(threaded_hub.url)
    assert publisher.publish_blocking([("https://example.org/a", "updated", at(1))]) == ["00001-0"]
    assert publisher.publish_blocking([("https://example.org/b", "updated", at(2))]) == ["00002-0"]
    first, second = (parse_notification(s.body) for s in threaded_hub.received)
    assert second.from_time == first.until_time


async def test_publish_blocking_inside_a_running_loop_says_to_await(hub_server):
    with pytest.raises(RuntimeError, match="await publisher.publish"):
        fast(hub_server.url).publish_blocking([("https://example.org/a", "updated", at(1))])


def test_settings_come_from_the_environment_with_clear_errors():
    from rsnotify.publisher import PublisherSettings, SettingsError

    settings = PublisherSettings.from_env({
        "RSNOTIFY_HUB_URL": "http://127.0.0.1:1/a http://127.0.0.1:2/b",
        "RSNOTIFY_TOPIC_URL": TOPIC, "RSNOTIFY_HUB_TOKEN": "t0k", "RSNOTIFY_PUBLISH_ATTEMPTS": "3",
    })
    publisher = Publisher.from_settings(settings)
    assert publisher.hub_urls == ("http://127.0.0.1:1/a", "http://127.0.0.1:2/b")
    assert publisher.max_attempts == 3
    assert "t0k" not in repr(settings) and "t0k" not in repr(publisher)
    with pytest.raises(SettingsError, match="RSNOTIFY_PUBLISH_ATTEMPTS must be a positive integer, got '-1'"):
        PublisherSettings.from_env({"RSNOTIFY_PUBLISH_ATTEMPTS": "-1"})
    with pytest.raises(SettingsError, match="hub URL must be an absolute http or https URL, got 'hub.example.org'"):
        Publisher("hub.example.org", TOPIC)


async def test_concurrent_publishes_on_one_publisher_still_chain(hub_server):
    async with fast(hub_server.url) as publisher:
        await asyncio.gather(*(publisher.publish([(f"https://example.org/r{i}", "updated", at(i))]) for i in range(4)))
    documents = [parse_notification(s.body) for s in hub_server.received]
    assert [d.changes[0].loc for d in documents] == [f"https://example.org/r{i}" for i in range(4)]
    for before, after in pairwise(documents):
        assert after.from_time == before.until_time

"""The outbox: add() never waits on a hub; documents reach every hub in order, with retries,
and survive a restart of the process that queued them."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from rsnotify.publisher import Outbox, Publisher
from rsnotify.xml import parse_notification

TOPIC = "https://example.org/dataset1/change/"
T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


def at(minutes: int) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def publisher_for(*hub_urls: str, **kwargs) -> Publisher:  # type: ignore[no-untyped-def]
    return Publisher(list(hub_urls), TOPIC, retry_delay=0.02, timeout=5, **kwargs)


def locs(hub) -> list[str]:  # type: ignore[no-untyped-def]
    return [c.loc for s in hub.accepted for c in parse_notification(s.body).changes]


def test_add_returns_at_once_and_the_hub_gets_everything_in_order(threaded_hub, tmp_path):
    with Outbox(tmp_path / "outbox.db", publisher_for(threaded_hub.url, max_entries=2)) as outbox:
        ids = outbox.add([(f"https://example.org/r{i}", "updated", at(i)) for i in range(5)])
        ids += outbox.add([("https://example.org/r5", "deleted", at(5))])
        assert ids == [1, 2, 3, 4]
        outbox.flush(timeout=10)
        entries = outbox.entries()
    assert locs(threaded_hub) == [f"https://example.org/r{i}" for i in range(6)]
    documents = [parse_notification(s.body) for s in threaded_hub.accepted]
    for before, after in pairwise(documents):
        assert after.from_time == before.until_time  # chained across both add() calls
    assert [(e.state, e.notification_id) for e in entries] == [("delivered", f"0000{i}-0") for i in range(1, 5)]


def test_add_does_not_wait_for_a_hub_that_is_down_and_delivery_follows_when_it_is_up(
    make_hub, serve_in_thread, unused_port, tmp_path
):
    hub = make_hub()
    hub_url = f"http://127.0.0.1:{unused_port}/hub"
    with Outbox(tmp_path / "outbox.db", publisher_for(hub_url)) as outbox:
        outbox.add([("https://example.org/a", "updated", at(1))])
        outbox.add([("https://example.org/b", "updated", at(2))])
        with pytest.raises(TimeoutError, match="still has 2 pending deliveries"):
            outbox.flush(timeout=0.3)
        deadline = time.monotonic() + 10
        while not outbox.entries()[0].last_error and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "could not be reached" in (outbox.entries()[0].last_error or "")
        serve_in_thread(hub.app(), port=unused_port).start()
        outbox.flush(timeout=10)
    assert locs(hub) == ["https://example.org/a", "https://example.org/b"]


def test_add_returns_at_once_while_the_hub_is_slow(threaded_hub, tmp_path):
    threaded_hub.delay = 1.0
    with Outbox(tmp_path / "outbox.db", publisher_for(threaded_hub.url)) as outbox:
        outbox.add([("https://example.org/a", "updated", at(1))])
        deadline = time.monotonic() + 10
        while not threaded_hub.received and time.monotonic() < deadline:
            time.sleep(0.01)  # until the first POST is hanging in the hub
        started = time.monotonic()
        outbox.add([("https://example.org/b", "updated", at(2))])
        assert time.monotonic() - started < 0.5  # not the hub's 1 s
        assert len(threaded_hub.received) == 1
        outbox.flush(timeout=10)
    assert locs(threaded_hub) == ["https://example.org/a", "https://example.org/b"]


def test_a_hub_refusing_a_document_for_good_does_not_block_the_rest(threaded_hub, tmp_path):
    threaded_hub.answers = [503, 422]
    with Outbox(tmp_path / "outbox.db", publisher_for(threaded_hub.url)) as outbox:
        outbox.add([("https://example.org/a", "updated", at(1))])
        outbox.add([("https://example.org/b", "updated", at(2))])
        outbox.flush(timeout=10)
        [refused] = outbox.entries("refused")
    assert (refused.document_id, refused.status, refused.attempts) == (1, 422, 2)
    assert "refused the notification with 422" in (refused.last_error or "")
    assert locs(threaded_hub) == ["https://example.org/b"]


def test_each_hub_gets_every_document_even_when_one_is_down_for_a_while(
    make_hub, serve_in_thread, unused_port, threaded_hub, tmp_path
):
    late_hub = make_hub()
    late_url = f"http://127.0.0.1:{unused_port}/hub"
    with Outbox(tmp_path / "outbox.db", publisher_for(threaded_hub.url, late_url)) as outbox:
        outbox.add([("https://example.org/a", "updated", at(1))])
        outbox.add([("https://example.org/b", "updated", at(2))])
        deadline = time.monotonic() + 10
        while len(threaded_hub.accepted) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # the up hub is served while the other one is still down
        assert locs(threaded_hub) == ["https://example.org/a", "https://example.org/b"]
        serve_in_thread(late_hub.app(), port=unused_port).start()
        outbox.flush(timeout=10)
    assert locs(late_hub) == ["https://example.org/a", "https://example.org/b"]


QUEUE_AND_DIE = textwrap.dedent("""
    import os, sys
    from publisher import Outbox, Publisher
    db, hub_url = sys.argv[1], sys.argv[2]
    outbox = Outbox(db, Publisher(hub_url, "https://example.org/dataset1/change/", retry_delay=0.02))
    outbox.add([("https://example.org/a", "created", "2024-05-01T10:01:00Z")])
    outbox.add([("https://example.org/b", "updated", "2024-05-01T10:02:00Z")])
    print("queued", flush=True)
    os._exit(0)  # die at once, like a crashed Source: no close(), no flush
""")


def test_the_outbox_delivers_after_the_process_that_queued_is_gone(make_hub, serve_in_thread, unused_port, tmp_path):
    database = tmp_path / "outbox.db"
    hub_url = f"http://127.0.0.1:{unused_port}/hub"
    done = subprocess.run([sys.executable, "-c", QUEUE_AND_DIE, str(database), hub_url],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "queued"
    hub = make_hub()
    serve_in_thread(hub.app(), port=unused_port).start()
    with Outbox(database, publisher_for(hub_url), autostart=False) as restarted:
        assert restarted.pending() == 2
        restarted.start()
        restarted.flush(timeout=10)
        # the chain goes on where the dead process left it
        restarted.add([("https://example.org/c", "deleted", at(3))])
        restarted.flush(timeout=10)
    documents = [parse_notification(s.body) for s in hub.accepted]
    assert [c.loc for d in documents for c in d.changes] == [
        "https://example.org/a", "https://example.org/b", "https://example.org/c"]
    assert documents[1].from_time == documents[0].until_time
    assert documents[2].from_time == documents[1].until_time


def test_changes_before_the_outbox_chain_end_are_refused_at_add(threaded_hub, tmp_path):
    from rsnotify.publisher import ChangeInputError

    with Outbox(tmp_path / "outbox.db", publisher_for(threaded_hub.url)) as outbox:
        outbox.add([("https://example.org/a", "updated", at(5))])
        with pytest.raises(ChangeInputError, match="before the end of topic"):
            outbox.add([("https://example.org/b", "updated", at(1))])
        assert outbox.pending() + len(outbox.entries("delivered")) == 1

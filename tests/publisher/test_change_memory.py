"""The change memory: one unbroken from/until chain whatever publishes (async, blocking, two
processes on one file), every change in exactly one notification and in the Change List;
Change List rotation, index and retention; a hub that never answers; the old JSON state."""
from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from resync.change_list import ChangeList as ResyncChangeList

from rsnotify.documents import parse_document
from rsnotify.lists import ListRef, open_list
from rsnotify.notification import ResourceChange
from rsnotify.publisher import HubUnreachableError, Outbox, Publisher
from rsnotify.publisher.memory.changelist import (
    changelist_name,
    write_changelist,
    write_changelist_document,
)
from rsnotify.publisher.memory.store import (
    ChangeMemory,
    ListPolicy,
    changelists,
    iter_changes,
)
from rsnotify.xml import parse_notification

TOPIC = "http://127.0.0.1:9/dataset1/changes"
BASE = "http://127.0.0.1:9/dataset1/"
UP = BASE + "capabilitylist.xml"
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)

_PUBLISHER_SCRIPT = textwrap.dedent("""
    import asyncio, sys, threading
    from rsnotify.publisher import Publisher

    hub, topic, db, prefix, rounds = sys.argv[1:6]
    rounds = int(rounds)
    ids = []

    def blocking(publisher):
        for i in range(rounds):
            ids.extend(publisher.publish_blocking([(f"{prefix}s{i}", "created"), (f"{prefix}s{i}x", "updated")]))

    async def main():
        publisher = Publisher(hub, topic, state_path=db, retry_delay=0.05)
        thread = threading.Thread(target=blocking, args=(publisher,))
        thread.start()
        for i in range(rounds):
            ids.extend(await publisher.publish([(f"{prefix}a{i}", "created"), (f"{prefix}a{i}x", "deleted")]))
        await asyncio.to_thread(thread.join)
        await publisher.close()

    asyncio.run(main())
    print("\\n".join(ids))
""")


def _admin_body(hub_url: str, topic: str, notification_id: str) -> bytes:
    with urllib.request.urlopen(f"{hub_url}admin/topics?url={urllib.parse.quote(topic, safe='')}", timeout=10) as answer:
        tid = json.loads(answer.read())["topics"][0]["tid"]
    with urllib.request.urlopen(f"{hub_url}admin/topics/{tid}/notifications/{notification_id}", timeout=10) as answer:
        return answer.read()


def _changelist_locs(db: Path, topic: str) -> list[str]:
    memory = ChangeMemory(db)
    try:
        with memory.snapshot() as snapshot:
            return [c.loc for record in changelists(snapshot, topic) for c in iter_changes(snapshot, record.id)]
    finally:
        memory.close()


def test_two_processes_mixing_async_and_blocking_publishes_make_one_unbroken_chain(hub_process, tmp_path):
    hub = hub_process(workers=1)     # nothing is delivered here: one worker is plenty
    db = tmp_path / "memory.db"
    topic = "http://127.0.0.1:9/mixed/changes"
    rounds = 6
    processes = [
        subprocess.Popen([sys.executable, "-c", _PUBLISHER_SCRIPT, hub.url, topic, str(db), f"https://example.org/p{n}/", str(rounds)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in (1, 2)
    ]
    ids = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        ids += out.split()
    assert len(ids) == 2 * 2 * rounds  # one notification per publish call
    notifications = sorted((parse_notification(_admin_body(hub.url, topic, nid)) for nid in ids), key=lambda n: (n.from_time, n.until_time))
    for before, after in pairwise(notifications):
        assert after.from_time == before.until_time  # unbroken: no gap, no overlap
    published = [c.loc for n in notifications for c in n.changes]
    expected = {f"https://example.org/p{n}/{kind}{i}{suffix}" for n in (1, 2) for kind in "sa" for i in range(rounds) for suffix in ("", "x")}
    assert sorted(published) == sorted(expected)  # every change in exactly one notification
    assert sorted(_changelist_locs(db, topic)) == sorted(expected)  # ... and in the Change List once


def test_publish_blocking_gives_up_on_a_silent_hub_within_its_deadline(tmp_path):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts TCP connections (the kernel does), never answers
    try:
        publisher = Publisher(f"http://127.0.0.1:{silent.getsockname()[1]}/", TOPIC, state_path=str(tmp_path / "m.db"))
        started = time.monotonic()
        with pytest.raises(HubUnreachableError, match="deadline"):
            publisher.publish_blocking([("https://example.org/a", "created")], deadline=1.0)
        assert time.monotonic() - started < 30  # was 159 s before the deadline existed
        # The change was recorded before the POST: a Destination can still fetch it by pull.
        assert _changelist_locs(tmp_path / "m.db", TOPIC) == ["https://example.org/a"]
    finally:
        silent.close()


def _outbox(db: Path, policy: ListPolicy) -> Outbox:
    publisher = Publisher("http://127.0.0.1:9/", TOPIC, memory=ChangeMemory(db, policy))
    return Outbox(db, publisher, autostart=False)  # records and queues; nothing is sent


def _render(db: Path, record_id: int | None = None) -> bytes:
    memory = ChangeMemory(db)
    out = io.BytesIO()
    with memory.snapshot() as snapshot:
        if record_id is None:
            write_changelist_document(snapshot, TOPIC, out, up=UP, list_url=lambda r: BASE + changelist_name(r),
                                      now=lambda: T0)
        else:
            record = next(r for r in changelists(snapshot, TOPIC) if r.id == record_id)
            write_changelist(snapshot, record, out, up=UP, index=BASE + "changelist.xml")
    memory.close()
    return out.getvalue()


def test_change_lists_rotate_at_a_notification_boundary_and_get_an_index(tmp_path):
    db = tmp_path / "memory.db"
    outbox = _outbox(db, ListPolicy(max_entries=100))
    only = open_list(io.BytesIO(_render(db)))
    assert not only.info.is_index and list(only) == []  # nothing yet: an empty open list
    for batch in range(35):
        outbox.add([(f"https://example.org/r{batch}-{i}", "created") for i in range(10)])
    memory = ChangeMemory(db)
    with memory.snapshot() as snapshot:
        records = changelists(snapshot, TOPIC)
    assert [r.entries for r in records] == [100, 100, 100, 50]
    index = open_list(io.BytesIO(_render(db)))
    refs = list(index)
    assert index.info.is_index and index.info.link("up") == UP
    assert all(isinstance(ref, ListRef) for ref in refs)
    assert [ref.loc for ref in refs] == [BASE + changelist_name(r) for r in records]
    assert sorted(ref.loc for ref in refs) == [ref.loc for ref in refs]  # name order is time order
    for before, after in pairwise(refs):
        assert after.from_ == before.until  # rotation at a notification boundary
    assert refs[-1].until is None and all(ref.until for ref in refs[:-1])
    assert parse_document(_render(db)).is_valid
    closed = _render(db, records[0].id)
    outbox.add([("https://example.org/later", "updated")])
    assert _render(db, records[0].id) == closed  # closed lists never change
    for record in records:
        data = _render(db, record.id)
        verdict = parse_document(data)
        assert verdict.is_valid, verdict.problems
        stream = open_list(io.BytesIO(data))
        assert (stream.info.link("up"), stream.info.link("index")) == (UP, BASE + "changelist.xml")
        assert stream.info.until == record.until_time
        parsed = ResyncChangeList()
        parsed.parse(str_data=data.decode())
        assert len(parsed) == (record.entries + (1 if record.is_open else 0))
    locs = [c.loc for r in records for c in _changes(db, r.id)]
    assert locs[:350] == [f"https://example.org/r{b}-{i}" for b in range(35) for i in range(10)]
    outbox.close()
    memory.close()


def _changes(db: Path, list_id: int) -> list[ResourceChange]:
    memory = ChangeMemory(db)
    with memory.snapshot() as snapshot:
        changes = list(iter_changes(snapshot, list_id))
    memory.close()
    return changes


def test_period_rotation_and_retention_follow_the_clock(tmp_path):
    clock = [T0.timestamp()]
    memory = ChangeMemory(tmp_path / "memory.db", ListPolicy(rotate_seconds=3600, keep_seconds=2 * 86_400),
                          now=lambda: clock[0])
    publisher = Publisher("http://127.0.0.1:9/", TOPIC, memory=memory)
    for day in range(5):
        for minutes in (0, 30):
            when = T0 + timedelta(days=day, minutes=minutes)
            clock[0] = when.timestamp()
            memory.record_documents(TOPIC, publisher.prepare([("https://example.org/a", "updated", when)]))
    with memory.snapshot() as snapshot:
        records = changelists(snapshot, TOPIC)
    # A list is closed at the first notification after it is an hour old (daily here), with
    # until = that notification's from; lists whose until is over 2 days old are dropped.
    half = timedelta(minutes=30)
    assert [r.until_time for r in records] == [T0 + timedelta(days=2) + half, T0 + timedelta(days=3) + half, None]
    assert records[0].from_time == T0 + timedelta(days=1) + half
    assert [c.changed_at for c in _changes(tmp_path / "memory.db", records[-1].id)] == [T0 + timedelta(days=4), T0 + timedelta(days=4) + half]
    memory.close()


def test_an_old_json_state_file_becomes_a_change_memory_keeping_the_chain(tmp_path):
    state = tmp_path / "publisher-state.json"
    state.write_text(json.dumps({"topics": {TOPIC: "2026-11-21T10:00:00Z"}}))
    publisher = Publisher("http://127.0.0.1:9/", TOPIC, state_path=str(state))
    assert publisher.chain.last_until(TOPIC) == T0
    [document] = publisher.prepare([("https://example.org/a", "updated", T0 + timedelta(minutes=1))])
    assert document.from_time == T0
    assert (tmp_path / "publisher-state.json.json-old").exists()


def test_resource_list_snapshot_has_at_on_the_chain_and_an_index_past_the_limit(tmp_path):
    from rsnotify.publisher.memory.resourcelist import snapshot_resource_list

    memory = ChangeMemory(tmp_path / "memory.db")
    publisher = Publisher("http://127.0.0.1:9/", TOPIC, memory=memory)
    created = [(f"https://example.org/r{i:02d}", "created", T0 + timedelta(seconds=i)) for i in range(25)]
    memory.record_documents(TOPIC, publisher.prepare(created))
    memory.record_documents(TOPIC, publisher.prepare([("https://example.org/r03", "deleted", T0 + timedelta(minutes=1))]))
    files = snapshot_resource_list(memory, TOPIC, tmp_path / "lists", up=UP, part_url=lambda name: BASE + name,
                                   index_url=BASE + "resourcelist.xml", max_entries=10)
    assert files.at == memory.last_until(TOPIC) == T0 + timedelta(minutes=1)  # no seam with the Change List
    index = open_list(io.BytesIO(files.main.read_bytes()))
    assert index.info.is_index and index.info.at == files.at and len(list(index)) == 3
    locs = [r.loc for part in files.parts for r in open_list(io.BytesIO(part.read_bytes()))]
    assert locs == [f"https://example.org/r{i:02d}" for i in range(25) if i != 3]
    assert all(open_list(io.BytesIO(part.read_bytes())).info.link("index") == BASE + "resourcelist.xml" for part in files.parts)
    memory.close()

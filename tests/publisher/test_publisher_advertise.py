"""Advertising the channel in a Capability List (spec §5), checked on the spec's own examples:
core Example 13 plus the channel is Change Notification Example 7."""
from __future__ import annotations

from pathlib import Path

import pytest

from rsnotify.publisher import (
    CapabilityListError,
    add_channel,
    add_channel_to_document,
    new_capability_list,
)
from rsnotify.notification import CHANGE_NOTIFICATION
from rsnotify.xml import parse_capability_list

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXAMPLE_13 = (FIXTURES / "core-1.1" / "resourcesync_ex_13.xml").read_bytes()
EXAMPLE_7 = (FIXTURES / "change-notification-1.0.1" / "notification_ex_7.xml").read_bytes()
TOPIC = "http://example.com/dataset1/change/"
HUB = "http://hub.example.org/websub/"


def channel_entries(capability_list):  # type: ignore[no-untyped-def]
    return [e for e in capability_list.entries if e.capability == CHANGE_NOTIFICATION]


def test_example_13_with_the_channel_added_is_example_7():
    result = parse_capability_list(add_channel_to_document(EXAMPLE_13, TOPIC, HUB))
    before, expected = parse_capability_list(EXAMPLE_13), parse_capability_list(EXAMPLE_7)
    assert result.entries == expected.entries
    assert result.entries[:-1] == before.entries  # every other entry kept, in order
    # Example 7 copies Example 13 but points "up" elsewhere; everything else of the root is kept
    assert (result.up, result.links, result.extra_md) == (before.up, before.links, before.extra_md)
    [entry] = channel_entries(result)
    assert entry.loc == TOPIC and entry.links_with("hub") == [HUB]


def test_adding_again_keeps_exactly_one_channel_entry_in_its_place():
    once = add_channel_to_document(EXAMPLE_7, TOPIC, "https://hub2.example.org/")
    twice = parse_capability_list(add_channel_to_document(once, "https://example.com/new-topic/",
                                                          ["https://hub2.example.org/", "https://hub3.example.org/"]))
    [entry] = channel_entries(twice)
    assert entry.loc == "https://example.com/new-topic/"
    assert entry.links_with("hub") == ["https://hub2.example.org/", "https://hub3.example.org/"]
    assert twice.entries.index(entry) == 4
    assert twice.entries[:4] == parse_capability_list(EXAMPLE_7).entries[:4]


def test_the_legacy_changelist_notification_entry_is_replaced():
    legacy = EXAMPLE_7.replace(b'capability="change-notification"', b'capability="changelist-notification"')
    result = parse_capability_list(add_channel_to_document(legacy, TOPIC, HUB))
    assert [e.capability for e in result.entries][-1] == CHANGE_NOTIFICATION
    assert "changelist-notification" not in {e.capability for e in result.entries}


def test_same_topic_keeps_its_other_links():
    with_extra = EXAMPLE_7.replace(
        b'<rs:ln rel="hub" href="http://hub.example.org/websub/"/>',
        b'<rs:ln rel="hub" href="http://hub.example.org/websub/"/>'
        b'<rs:ln rel="describedby" href="http://example.com/about-the-channel"/>',
    )
    result = add_channel(parse_capability_list(with_extra), TOPIC, "https://new-hub.example.org/")
    [entry] = channel_entries(result)
    assert entry.links_with("hub") == ["https://new-hub.example.org/"]
    assert entry.links_with("describedby") == ["http://example.com/about-the-channel"]


def test_a_new_capability_list_advertises_only_the_channel():
    created = new_capability_list("https://example.org/.well-known/resourcesync", TOPIC, HUB)
    assert created.up == "https://example.org/.well-known/resourcesync"
    assert [(e.loc, e.capability, e.links_with("hub")) for e in created.entries] == [(TOPIC, CHANGE_NOTIFICATION, [HUB])]


@pytest.mark.parametrize(("document", "message"), [
    (b"<not-xml", "not a Capability List"),
    (EXAMPLE_7.replace(b'capability="capabilitylist"', b'capability="resourcelist"'), "not a Capability List"),
    (EXAMPLE_13.replace(b'rel="up"', b'rel="other"'), "not a valid Capability List"),
])
def test_an_invalid_capability_list_is_refused_with_the_reason(document, message):
    with pytest.raises(CapabilityListError, match=message):
        add_channel_to_document(document, TOPIC, HUB)


def test_bad_urls_are_refused():
    with pytest.raises(CapabilityListError, match="topic URL must be an absolute http or https URL"):
        add_channel_to_document(EXAMPLE_13, "dataset1/change", HUB)
    with pytest.raises(CapabilityListError, match="at least one hub URL"):
        add_channel_to_document(EXAMPLE_13, TOPIC, [])

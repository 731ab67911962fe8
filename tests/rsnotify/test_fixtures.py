"""The spec's own example documents: each parses as the right kind; notifications and
Capability Lists round-trip parse -> serialize -> parse to an equal model."""
from __future__ import annotations

from pathlib import Path

import pytest

from rsnotify.documents import parse_document
from rsnotify.notification import Channel
from rsnotify.xml import (
    capability_list_to_xml,
    parse_capability_list,
    parse_notification,
    parse_source_description,
    source_description_to_xml,
    to_xml,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
XML_FIXTURES = sorted(FIXTURES.glob("*/*.xml"))

# file (relative to fixtures/) -> (what parse_document says it is, entries, valid)
EXPECTED = {
    "change-notification-0.9/notification_ex_3_1.xml": ("Sitemap <urlset> without a ResourceSync capability", 2, False),
    "change-notification-0.9/notification_ex_4_1.xml": ("Sitemap <urlset> without a ResourceSync capability", 1, False),
    "change-notification-0.9/notification_ex_4_2.xml": ("Sitemap <urlset> without a ResourceSync capability", 3, False),
    "change-notification-0.9/notification_ex_6_1.xml": ("Capability List", 6, True),
    "change-notification-1.0/notification_ex_1.xml": ("change notification", 2, True),
    "change-notification-1.0/notification_ex_7.xml": ("Capability List", 5, True),
    "change-notification-1.0.1/notification_ex_1.xml": ("change notification", 2, True),
    "change-notification-1.0.1/notification_ex_7.xml": ("Capability List", 5, True),
    "framework-notification-1.0.1/framework_notification_ex_1.xml": ("framework notification", 1, True),
    "framework-notification-1.0.1/framework_notification_ex_2.xml": ("framework notification", 3, True),
    "framework-notification-1.0.1/framework_notification_ex_8.xml": ("Capability List", 5, True),
    "core-1.1/resourcesync_ex_1.xml": ("Resource List", 2, True),
    "core-1.1/resourcesync_ex_2.xml": ("Resource List", 2, True),
    "core-1.1/resourcesync_ex_3.xml": ("Change List", 3, True),
    "core-1.1/resourcesync_ex_4.xml": ("Resource Dump", 1, True),
    "core-1.1/resourcesync_ex_5.xml": ("Resource Dump Manifest", 2, True),
    "core-1.1/resourcesync_ex_6.xml": ("Capability List", 3, True),
    "core-1.1/resourcesync_ex_7.xml": ("Source Description", 1, True),
    "core-1.1/resourcesync_ex_8.xml": ("Resource List Index", 2, True),
    "core-1.1/resourcesync_ex_12.xml": ("Source Description", 3, True),
    "core-1.1/resourcesync_ex_13.xml": ("Capability List", 4, True),
    "core-1.1/resourcesync_ex_14.xml": ("Resource List", 2, True),
    "core-1.1/resourcesync_ex_15.xml": ("Resource List Index", 3, True),
    "core-1.1/resourcesync_ex_16.xml": ("Resource List", 2, True),
    "core-1.1/resourcesync_ex_17.xml": ("Resource Dump", 3, True),
    "core-1.1/resourcesync_ex_18.xml": ("Resource Dump Manifest", 2, True),
    "core-1.1/resourcesync_ex_19.xml": ("Change List", 4, True),
    "core-1.1/resourcesync_ex_20.xml": ("Change List Index", 3, True),
    "core-1.1/resourcesync_ex_21.xml": ("Change List", 4, True),
    "core-1.1/resourcesync_ex_22.xml": ("Change Dump", 3, True),
    "core-1.1/resourcesync_ex_23.xml": ("Change Dump Manifest", 4, True),
    **{f"core-1.1/resourcesync_ex_{n}.xml": ("Change List", 1, True) for n in (24, 25, 26, 29, 30, 31, 32, 33)},
    "core-1.1/resourcesync_ex_27.xml": ("Change List", 2, True),
    "core-1.1/resourcesync_ex_28.xml": ("Change List", 2, True),
}

NOTIFICATIONS = [FIXTURES / "change-notification-1.0.1/notification_ex_1.xml", FIXTURES / "change-notification-1.0/notification_ex_1.xml"]
CAPABILITY_LISTS = [p for p in XML_FIXTURES if EXPECTED[str(p.relative_to(FIXTURES))][0] == "Capability List"]
SOURCE_DESCRIPTIONS = [p for p in XML_FIXTURES if EXPECTED[str(p.relative_to(FIXTURES))][0] == "Source Description"]

pytestmark = pytest.mark.skipif(not XML_FIXTURES, reason="spec fixtures folder not present")


def _id(path: Path) -> str:
    return str(path.relative_to(FIXTURES))


def test_every_xml_fixture_is_listed() -> None:
    assert {_id(p) for p in XML_FIXTURES} == set(EXPECTED)


@pytest.mark.parametrize("path", XML_FIXTURES, ids=_id)
def test_fixture_parses_as_its_kind(path: Path) -> None:
    document = parse_document(path.read_bytes())
    assert (document.description, document.entries, document.is_valid) == EXPECTED[_id(path)], document.problems


def test_beta_notifications_are_explained() -> None:
    document = parse_document((FIXTURES / "change-notification-0.9/notification_ex_3_1.xml").read_bytes())
    assert any("0.9 beta" in note for note in document.notes)


def test_official_payload_is_read_field_by_field() -> None:
    notification = parse_notification(NOTIFICATIONS[0].read_bytes())
    assert notification.up == "http://example.com/dataset1/capabilitylist.xml"
    assert not notification.is_legacy
    first, second = notification.changes
    assert (first.loc, first.change.value, first.length, first.media_type) == (
        "http://example.com/res1", "created", 8876, "application/pdf"
    )
    assert first.lastmod is not None and first.lastmod.isoformat() == "2013-01-01T13:03:00+00:00"
    # the spec's hash value has a newline inside; whitespace separates the list
    assert second.hashes == (
        ("md5", "1e0d5cb8ef6ba40c99b14c0237be735e"),
        ("sha-256", "854f61290e2e197a11bc91063afce22e43f8ccc655237050ace766adc68dc784"),
    )


def test_legacy_capability_is_accepted_and_said() -> None:
    notification = parse_notification(NOTIFICATIONS[1].read_bytes())
    assert notification.is_legacy and notification.capability == "changelist-notification"
    assert parse_document(NOTIFICATIONS[1].read_bytes()).notes


@pytest.mark.parametrize("path", NOTIFICATIONS, ids=_id)
def test_notification_round_trips(path: Path) -> None:
    notification = parse_notification(path.read_bytes())
    data = to_xml(notification)
    assert data.startswith(b'<?xml version="1.0" encoding="UTF-8"?>')
    assert parse_notification(data) == notification


@pytest.mark.parametrize("path", CAPABILITY_LISTS, ids=_id)
def test_capability_list_round_trips(path: Path) -> None:
    capability_list = parse_capability_list(path.read_bytes())
    assert parse_capability_list(capability_list_to_xml(capability_list)) == capability_list


@pytest.mark.parametrize("path", SOURCE_DESCRIPTIONS, ids=_id)
def test_source_description_round_trips(path: Path) -> None:
    description = parse_source_description(path.read_bytes())
    assert description.capability_lists
    assert parse_source_description(source_description_to_xml(description)) == description


def test_channel_is_discovered_from_the_capability_list() -> None:
    capability_list = parse_capability_list((FIXTURES / "change-notification-1.0.1/notification_ex_7.xml").read_bytes())
    assert capability_list.up == "http://example.com/source_description.xml"
    assert capability_list.change_notification_channels() == [
        Channel("http://example.com/dataset1/change/", ("http://hub.example.org/websub/",))
    ]


def test_framework_channel_is_not_a_change_notification_channel() -> None:
    path = FIXTURES / "framework-notification-1.0.1/framework_notification_ex_8.xml"
    assert parse_capability_list(path.read_bytes()).change_notification_channels() == []

"""Advertise a change-notification channel in a Capability List (spec §5): exactly one entry
with `capability="change-notification"`, `<loc>` = the topic URI and `<rs:ln rel="hub">` under
its `<url>`; every other entry, link and attribute is kept as it was.

Works on the `rsnotify` model; `add_channel_to_document` does the bytes round trip. No I/O.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rsnotify.errors import DocumentParseError, ValidationError, WireError
from rsnotify.notification import (
    CHANGE_NOTIFICATION,
    LEGACY_CHANGE_NOTIFICATION,
    CapabilityEntry,
    CapabilityList,
    Link,
)
from rsnotify.websub import check_url
from rsnotify.xml import capability_list_to_xml, parse_capability_list

from .errors import CapabilityListError

_CHANNEL_CAPABILITIES = (CHANGE_NOTIFICATION, LEGACY_CHANGE_NOTIFICATION)


def channel_entry(topic_url: str, hub_urls: str | Sequence[str], keep: CapabilityEntry | None = None) -> CapabilityEntry:
    """The change-notification entry for `topic_url` served by `hub_urls`.

    When `keep` is the topic's current entry, its other links (not rel="hub"), lastmod and
    extra attributes stay.
    """
    hubs = [hub_urls] if isinstance(hub_urls, str) else list(hub_urls)
    if not hubs:
        raise CapabilityListError("a change-notification channel needs at least one hub URL, got none")
    try:
        topic = check_url("topic URL", topic_url)
        hub_links = tuple(Link("hub", check_url("hub URL", hub)) for hub in dict.fromkeys(hubs))
    except WireError as exc:
        raise CapabilityListError(str(exc)) from None
    if keep is not None and keep.loc == topic:
        others = tuple(link for link in keep.links if link.rel != "hub")
        return dataclasses.replace(keep, capability=CHANGE_NOTIFICATION, links=hub_links + others)
    return CapabilityEntry(loc=topic, capability=CHANGE_NOTIFICATION, links=hub_links)


def add_channel(capability_list: CapabilityList, topic_url: str, hub_urls: str | Sequence[str]) -> CapabilityList:
    """`capability_list` with exactly one change-notification entry, for `topic_url`.

    An existing channel entry (also the 1.0 `changelist-notification` one) is replaced in
    place; otherwise the entry is appended. Every other entry stays, in its order.
    """
    current = [e for e in capability_list.entries if e.capability in _CHANNEL_CAPABILITIES]
    entry = channel_entry(topic_url, hub_urls, next((e for e in current if e.loc == topic_url), None))
    entries: list[CapabilityEntry] = []
    placed = False
    for existing in capability_list.entries:
        if existing.capability in _CHANNEL_CAPABILITIES:
            if not placed:
                entries.append(entry)
                placed = True
            continue
        entries.append(existing)
    if not placed:
        entries.append(entry)
    return dataclasses.replace(capability_list, entries=tuple(entries))


def new_capability_list(up: str, topic_url: str, hub_urls: str | Sequence[str]) -> CapabilityList:
    """A Capability List advertising only the channel; `up` is the Source Description's URL."""
    return add_channel(empty_capability_list(up), topic_url, hub_urls)


def empty_capability_list(up: str) -> CapabilityList:
    """A Capability List with no entries yet; `up` is the Source Description's URL."""
    try:
        return CapabilityList(up=check_url("Source Description URL (up)", up))
    except WireError as exc:
        raise CapabilityListError(str(exc)) from None


def add_channel_to_document(data: bytes, topic_url: str, hub_urls: str | Sequence[str]) -> bytes:
    """The Capability List document `data` with the channel added (see `add_channel`).

    Raises CapabilityListError, with every problem, when `data` is not a valid Capability List.
    """
    return capability_list_to_xml(add_channel(_parse(data), topic_url, hub_urls))


def _parse(data: bytes) -> CapabilityList:
    try:
        return parse_capability_list(data)
    except ValidationError as exc:
        raise CapabilityListError("not a valid Capability List:\n" + "\n".join(exc.problems)) from None
    except DocumentParseError as exc:
        raise CapabilityListError(f"not a Capability List: {exc}") from None


def set_capabilities(
    capability_list: CapabilityList,
    *,
    resourcelist: str | None = None,
    changelist: str | None = None,
    topic_url: str | None = None,
    hub_urls: str | Sequence[str] = (),
) -> CapabilityList:
    """`capability_list` with exactly one entry for each capability given: `resourcelist` and
    `changelist` (their document URLs) and `change-notification` (`topic_url` with a
    rel="hub" link per hub). Each replaces the existing entry in place (keeping its other
    links and attributes when the URL stays); every other entry is kept as it was."""
    result = capability_list
    for capability, url in (("resourcelist", resourcelist), ("changelist", changelist)):
        if url is not None:
            result = _set_entry(result, capability, url)
    if topic_url is not None:
        result = add_channel(result, topic_url, hub_urls)
    return result


def _set_entry(capability_list: CapabilityList, capability: str, url: str) -> CapabilityList:
    try:
        loc = check_url(f"{capability} URL", url)
    except WireError as exc:
        raise CapabilityListError(str(exc)) from None
    entries: list[CapabilityEntry] = []
    placed = False
    for existing in capability_list.entries:
        if existing.capability != capability:
            entries.append(existing)
        elif not placed:
            entries.append(existing if existing.loc == loc else CapabilityEntry(loc=loc, capability=capability))
            placed = True
    if not placed:
        entries.append(CapabilityEntry(loc=loc, capability=capability))
    return dataclasses.replace(capability_list, entries=tuple(entries))


def set_capabilities_in_document(data: bytes, **capabilities: Any) -> bytes:
    """The Capability List document `data` with `set_capabilities(**capabilities)` applied.

    Raises CapabilityListError, with every problem, when `data` is not a valid Capability List.
    """
    return capability_list_to_xml(set_capabilities(_parse(data), **capabilities))

"""ResourceSync documents <-> the model: change notifications, Capability Lists, Source
Descriptions, both directions.

Parsing goes through the one safe parser in `rsnotify.safexml` (one lxml parse, no XSD: this
is the hub's hot path). A change notification of the usual shape is read from its bytes without
a tree (rsnotify.notification_scan); one of any other shape is parsed and read in one pass over
the tree (_read_plain_notification); both hold the values to the same rules (_plain_change,
_plain_notification). Any other, or one with anything wrong, is read step by step, which words
every problem. Documents are built with lxml element calls. No I/O here.
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

from lxml import etree

from .datetimes import format_datetime, parse_w3c_datetime
from .errors import (
    DatetimeError,
    DocumentParseError,
    NotificationError,
    NotificationParseError,
    ValidationError,
)
from .notification import (
    CAPABILITY_LIST,
    CHANGE_NOTIFICATION,
    LEGACY_CHANGE_NOTIFICATION,
    SOURCE_DESCRIPTION,
    CapabilityEntry,
    CapabilityList,
    ChangeNotification,
    ChangeType,
    Link,
    ResourceChange,
    SourceDescription,
    change_order_problems,
    prechecked_change,
    prechecked_notification,
)
from .notification_scan import Entry, scan_notification
from .safexml import (
    LASTMOD,
    LOC,
    MAX_ENTRIES,
    RS_LN,
    RS_MD,
    RS_NS,
    SITEMAP_NS,
    URL,
    URLSET,
    describe_element,
    extra_attributes,
    has_loc_problem,
    hash_text,
    loc_problem,
    new_root,
    optional_datetime,
    optional_int,
    parse_root,
    read_datetime,
    read_hashes,
    read_length,
    read_link,
    read_media_type,
    serialize,
    set_attributes,
    write_link,
)

__all__ = [
    "RS_NS",
    "SITEMAP_NS",
    "capability_list_to_xml",
    "parse_capability_list",
    "parse_notification",
    "parse_source_description",
    "parse_w3c_datetime",
    "read_change",
    "read_notification",
    "read_url",
    "source_description_to_xml",
    "to_xml",
]

_CHANGE_ATTRIBUTES = frozenset({"change", "datetime", "hash", "length", "type"})
_CHANGE_VALUES = "created, updated or deleted"


# -- change notifications ------------------------------------------------------------------


def parse_notification(data: bytes | str, *, max_bytes: int | None = None) -> ChangeNotification:
    """The change notification in `data`, fully validated.

    Raises `NotificationParseError` when `data` is not safe, well-formed XML or not a change
    notification at all (root not a Sitemap `<urlset>`, another capability), and
    `ValidationError` listing every broken rule otherwise. The legacy capability
    `changelist-notification` (Change Notification 1.0) is accepted and kept in `.capability`.
    """
    if isinstance(data, bytes) and (found := scan_notification(data, max_bytes)) is not None:
        scanned = _scanned_notification(*found)
        if scanned is not None:
            return scanned
    return read_notification(parse_root(data, max_bytes=max_bytes, error=NotificationParseError))


def _scanned_notification(md: tuple[str, str, str], link_values: list[tuple[str, str]],
                          entries: list[Entry]) -> ChangeNotification | None:
    """The notification that notification_scan found, held to _read_plain_notification's rules
    (its links, entries and rs:md read as from a tree); None when any is unusual or wrong."""
    links: list[Link] = []
    for rel, href in link_values:
        if (link := _plain_link(rel, href)) is None:
            return None
        links.append(link)
    locs: list[str] = []
    changes: list[ResourceChange] = []
    for loc, change, when, hash_value, length_value, media_type in entries:
        if (read := _plain_change(loc.strip(), change, when, hash_value, length_value, media_type, locs)) is None:
            return None
        changes.append(read)
    return _plain_notification(*md, changes, locs, links)


def read_notification(root: etree._Element) -> ChangeNotification:
    """The change notification held by an already parsed root element (see parse_notification)."""
    if root.tag == URLSET and (plain := _read_plain_notification(root)) is not None:
        return plain
    if root.tag != URLSET:
        raise NotificationParseError(
            f"root element is {describe_element(root.tag)}; expected <urlset> in the Sitemap namespace "
            f"{SITEMAP_NS} (change notifications do not use <sitemapindex>)"
        )
    problems: list[str] = []
    md, up, links, urls = _read_urlset_children(root, problems)
    capability = None if md is None else md.get("capability")
    if capability is not None and capability not in (CHANGE_NOTIFICATION, LEGACY_CHANGE_NOTIFICATION):
        raise NotificationParseError(
            f"<rs:md> of <urlset> has capability='{capability}'; expected {CHANGE_NOTIFICATION}: "
            "this document is not a change notification"
        )
    from_time = until_time = None
    if md is None:
        problems.append(
            "<urlset> has no <rs:md>; expected <rs:md capability=\"change-notification\" "
            "from=\"...\" until=\"...\"/>"
        )
    else:
        if capability is None:
            problems.append(f"<rs:md> of <urlset> has no capability; expected capability='{CHANGE_NOTIFICATION}'")
        from_time = _required_datetime(md, "from", problems)
        until_time = _required_datetime(md, "until", problems)
    if len(urls) > MAX_ENTRIES:
        problems.append(f"<urlset> has {len(urls)} <url> entries; expected at most {MAX_ENTRIES} (split it)")
    changes = [change for index, url in enumerate(urls, 1) if (change := read_change(url, index, problems))]
    problems.extend(change_order_problems(from_time, until_time, changes))
    if problems or from_time is None or until_time is None:
        raise ValidationError(problems)
    try:
        return ChangeNotification(
            from_time, until_time, tuple(changes), up, tuple(links), capability or CHANGE_NOTIFICATION
        )
    except NotificationError as exc:  # a rule the model checks that the reader did not
        raise ValidationError(str(exc).splitlines()) from None


def _required_datetime(md: etree._Element, name: str, problems: list[str]) -> datetime | None:
    value = md.get(name)
    if value is None:
        problems.append(f"<rs:md> of <urlset> has no {name}; expected a W3C datetime")
        return None
    return read_datetime(value, f"<rs:md> of <urlset> has {name}", problems)


def _read_urlset_children(
    root: etree._Element, problems: list[str]
) -> tuple[etree._Element | None, str | None, list[Link], list[etree._Element]]:
    """The root `<rs:md>`, the up href, the other root links and the `<url>` elements."""
    md = None
    up = None
    links: list[Link] = []
    urls: list[etree._Element] = []
    for child in root:
        tag = child.tag
        if tag == URL:
            urls.append(child)
        elif tag == RS_LN:
            link = read_link(child, "<urlset>", problems)
            if link is None:
                continue
            if link.rel == "up" and up is None and _is_plain(link):
                up = link.href
            else:
                links.append(link)
        elif tag == RS_MD:
            if md is None:
                md = child
            else:
                problems.append("<urlset> has more than one <rs:md>; expected exactly one")
    return md, up, links, urls


def _is_plain(link: Link) -> bool:
    """True when a link carries only rel and href, so the model's `up: str` loses nothing."""
    return link == Link(link.rel, link.href)


def _url_parts(
    url: etree._Element, index: int, problems: list[str]
) -> tuple[str, str | None, etree._Element | None, etree._Element | None, list[etree._Element]]:
    """A `<url>`'s name for messages, its loc, `<rs:md>`, `<lastmod>` and `<rs:ln>` elements.

    Child order is not fixed (CN Example 7 puts rs:ln before rs:md), so none is assumed.
    """
    loc = None
    md = lastmod = None
    link_elements: list[etree._Element] = []
    duplicates: list[str] = []
    for child in url:
        tag = child.tag
        if tag == LOC:
            if loc is None:
                loc = (child.text or "").strip()
            else:
                duplicates.append("<loc>")
        elif tag == RS_MD:
            if md is None:
                md = child
            else:
                duplicates.append("<rs:md> (it is not repeatable)")
        elif tag == RS_LN:
            link_elements.append(child)
        elif tag == LASTMOD:
            if lastmod is None:
                lastmod = child
            else:
                duplicates.append("<lastmod>")
    where = f"<url> for {loc}" if loc else f"<url> #{index}"
    if not loc:
        problems.append(
            f"<url> #{index} has {'an empty' if loc == '' else 'no'} <loc>; expected the resource's URI"
        )
    for duplicate in duplicates:
        problems.append(f"{where} has more than one {duplicate}; expected one")
    return where, loc or None, md, lastmod, link_elements


def read_url(
    url: etree._Element, index: int, problems: list[str]
) -> tuple[str, str, str | None, etree._Element | None, datetime | None, list[Link]]:
    """What every kind of `<url>` shares: (where, owner for messages, loc, <rs:md>, lastmod, links)."""
    where, loc, md, lastmod_element, link_elements = _url_parts(url, index, problems)
    owner = f"for {loc}" if loc else f"of <url> #{index}"
    lastmod = None
    if lastmod_element is not None:
        lastmod = read_datetime((lastmod_element.text or "").strip(), f"<lastmod> {owner} is", problems)
    links = [link for e in link_elements if (link := read_link(e, where, problems))] if link_elements else []
    return where, owner, loc, md, lastmod, links


def read_change(url: etree._Element, index: int, problems: list[str]) -> ResourceChange | None:
    """One `<url>` as a ResourceChange, or None after adding its problems."""
    plain = _read_plain_change(url)
    if plain is not None:
        return plain
    before = len(problems)
    where, owner, loc, md, lastmod, links = read_url(url, index, problems)
    if md is None:
        problems.append(f"{where} has no <rs:md>; expected <rs:md change=...> with change {_CHANGE_VALUES}")
        return None
    attrs = dict(md.items())
    change = attrs.get("change")
    if change is None:
        problems.append(f"<rs:md> {owner} has no change; expected {_CHANGE_VALUES}")
    elif change not in _CHANGE_TYPES:
        problems.append(f"<rs:md> {owner} has change='{change}'; expected {_CHANGE_VALUES}")
    changed_at = read_datetime(attrs.get("datetime"), f"<rs:md> {owner} has datetime", problems)
    hashes = read_hashes(attrs.get("hash"), f"<rs:md> {owner} has hash", problems)
    length = read_length(attrs.get("length"), f"<rs:md> {owner} has length", problems)
    media_type = read_media_type(attrs.get("type"), f"<rs:md> {owner} has type", problems)
    if loc is not None and (loc_issue := loc_problem(loc)):
        problems.append(f"<loc> '{loc}' {loc_issue}")
    if len(problems) > before or loc is None or change is None:
        return None
    return ResourceChange(
        loc,
        _CHANGE_TYPES[change],
        changed_at,
        lastmod,
        hashes,
        length,
        media_type,
        tuple(links),
        # extra_attributes(md, ...) from the attributes already read (a dict keeps document order)
        () if attrs.keys() <= _CHANGE_ATTRIBUTES else tuple(p for p in attrs.items() if p[0] not in _CHANGE_ATTRIBUTES),
    )


_CHANGE_TYPES = {change.value: change for change in ChangeType}


def _read_plain_change(url: etree._Element, locs: list[str] | None = None) -> ResourceChange | None:
    """The usual `<url>` (a `<loc>` and an `<rs:md>` with modelled attributes only) read in one go,
    by the same rules; None when anything about it is unusual or wrong, and read_change then reads
    it step by step, which words every problem. Whatever this returns, that reading returns too
    (nothing here is a rule of its own): it only skips the steps such an entry does not need and
    the names the messages would use, and takes the usual values (one hash, a short length, a
    printable ASCII type) without the general readers' calls.

    With `locs`, the loc is appended there instead of checked: the caller checks them all in one
    call (safexml.has_loc_problem) before it uses the change.
    """
    children = url.getchildren()
    if len(children) != 2:
        return None
    first, second = children
    if first.tag == LOC:
        loc_element, md = first, second
        if md.tag != RS_MD:
            return None
    elif first.tag == RS_MD and second.tag == LOC:
        md, loc_element = first, second
    else:
        return None
    if md.keys() == _USUAL_MD:      # attributes as to_xml writes them: one call reads them all
        change, when, hash_value, length_value, media_type = md.values()
    else:
        attrs = dict(md.items())
        if not attrs.keys() <= _CHANGE_ATTRIBUTES:
            return None
        change, when, hash_value, length_value, media_type = map(attrs.get, _USUAL_MD)
    return _plain_change((loc_element.text or "").strip(), change, when, hash_value, length_value, media_type,
                         locs)


def _plain_change(loc: str, change: str | None, when: str | None, hash_value: str | None,
                  length_value: str | None, media_type: str | None, locs: list[str] | None) -> ResourceChange | None:
    """The change an entry's stripped loc text and rs:md attribute values (None: absent) make, by
    _read_plain_change's rules; None when anything about them is unusual or wrong."""
    change_type = _CHANGE_TYPES.get(change)     # type: ignore[arg-type]
    if change_type is None or not loc:
        return None
    if locs is not None:
        locs.append(loc)
    elif loc_problem(loc):
        return None
    try:
        changed_at = None if when is None else parse_w3c_datetime(when)
    except DatetimeError:
        return None
    if hash_value is None:
        hashes: tuple[tuple[str, str], ...] | None = ()
    else:   # the usual hash, one algorithm:digest in printable ASCII without spaces, is split here
        algorithm, _, digest = hash_value.partition(":")
        if algorithm and digest and hash_value.isascii() and hash_value.isprintable() and " " not in hash_value:
            hashes = ((algorithm, digest),)
        elif (hashes := _quietly(read_hashes, hash_value)) is None:
            return None
    if length_value is None:
        length = None
    elif length_value.isascii() and length_value.isdigit() and len(length_value) <= 18:    # below 2**63
        length = int(length_value)
    elif (length := _quietly(read_length, length_value)) is None:
        return None
    # printable ASCII has no control character; anything else goes to the reader
    if media_type is not None and not (media_type.isascii() and media_type.isprintable()) and (
            _quietly(read_media_type, media_type) is None):
        return None
    return prechecked_change(loc, change_type, changed_at, hashes, length, media_type)   # type: ignore[arg-type]


# rs:md attributes in the order to_xml writes them, every modelled one present
_USUAL_MD = ["change", "datetime", "hash", "length", "type"]
_T = TypeVar("_T")


def _quietly(read: Callable[[str, str, list[str]], _T | None], value: str) -> _T | None:
    """`read(value, ...)` (a safexml reader of an attribute that is present), or None when it finds
    anything wrong: the step-by-step reading then words it."""
    wrong: list[str] = []
    result = read(value, "", wrong)
    return None if wrong else result


def _read_plain_notification(root: etree._Element) -> ChangeNotification | None:
    """The usual change notification (every entry read by _read_plain_change, the root's links
    plain rel + href, a valid <rs:md>, every datetime in order) read in one pass; None when
    anything is unusual or wrong, and read_notification then reads it step by step. Whatever this
    returns, that reading returns too: the same rules, without the messages' names and the
    model's re-checks of what was checked here."""
    md = None
    links: list[Link] = []
    changes: list[ResourceChange] = []
    locs: list[str] = []
    for child in root.getchildren():
        tag = child.tag
        if tag == URL:
            if (change := _read_plain_change(child, locs)) is None:
                return None
            changes.append(change)
        elif tag == RS_MD:
            if md is not None:
                return None
            md = child
        elif tag == RS_LN:
            if (link := _read_plain_link(child)) is None:
                return None
            links.append(link)
    if md is None:
        return None
    return _plain_notification(md.get("capability"), md.get("from"), md.get("until"), changes, locs, links)


def _plain_notification(capability: str | None, from_text: str | None, until_text: str | None,
                        changes: list[ResourceChange], locs: list[str],
                        links: list[Link]) -> ChangeNotification | None:
    """The notification that the <urlset>'s rs:md values (None: absent), its entries, read by
    _plain_change with their locs gathered in `locs`, and its links in document order (the first
    `up` one is the notification's up) make, by _read_plain_notification's rules; None when
    anything about them is unusual or wrong."""
    if len(changes) > MAX_ENTRIES or has_loc_problem(locs):
        return None
    if capability not in (CHANGE_NOTIFICATION, LEGACY_CHANGE_NOTIFICATION) or from_text is None or until_text is None:
        return None
    try:
        from_time, until_time = parse_w3c_datetime(from_text), parse_w3c_datetime(until_text)
    except DatetimeError:
        return None
    if change_order_problems(from_time, until_time, changes):   # no message is built when none
        return None
    up = next((link for link in links if link.rel == "up"), None)
    if up is not None:
        links.remove(up)       # the first up link (an equal one before it would be up too)
    return prechecked_notification(from_time, until_time, tuple(changes), None if up is None else up.href,
                                   tuple(links), capability)


def _read_plain_link(element: etree._Element) -> Link | None:
    """read_link(element) for an <rs:ln> with only rel and href (the usual up link), else None."""
    attrs = element.items()
    if len(attrs) != 2:
        return None
    (first, first_value), (second, second_value) = attrs
    if (first, second) == ("rel", "href"):
        return _plain_link(first_value, second_value)
    if (first, second) == ("href", "rel"):
        return _plain_link(second_value, first_value)
    return None


def _plain_link(rel: str, href: str) -> Link | None:
    rel, href = rel.strip(), href.strip()
    return Link(rel, href) if rel and href else None


def to_xml(notification: ChangeNotification) -> bytes:
    """The change notification as a UTF-8 `<urlset>` document; datetimes in UTC `...Z`.

    The capability is written as stored, so a parsed legacy document round-trips; a
    notification built in code carries `change-notification`.
    """
    root = new_root()
    if notification.up is not None:
        write_link(root, Link("up", notification.up))
    for link in notification.links:
        write_link(root, link)
    md = etree.SubElement(root, RS_MD)
    md.set("capability", notification.capability)
    md.set("from", format_datetime(notification.from_time))
    md.set("until", format_datetime(notification.until_time))
    for change in notification.changes:
        write_change(root, change)
    return serialize(root)


def write_change(parent: etree._Element, change: ResourceChange) -> etree._Element:
    """Append one resource change as a `<url>` to `parent`.

    Raises `NotificationError` when a value cannot be XML text (control characters, NUL) or
    the loc is not an absolute http(s) URI (a receiver could not fetch the resource).
    """
    issue = loc_problem(change.loc)
    if issue:
        raise NotificationError(f"<loc> {change.loc!r} {issue}")
    try:
        return _write_change(parent, change)
    except ValueError as exc:  # lxml: "All strings must be XML compatible"
        raise NotificationError(f"<url> for {change.loc!r} cannot be written as XML: {exc}") from None


def _write_change(parent: etree._Element, change: ResourceChange) -> etree._Element:
    url = etree.SubElement(parent, URL)
    etree.SubElement(url, LOC).text = change.loc
    if change.lastmod is not None:
        etree.SubElement(url, LASTMOD).text = format_datetime(change.lastmod)
    md = etree.SubElement(url, RS_MD)
    set_attributes(
        md,
        (
            ("change", change.change.value),
            ("datetime", optional_datetime(change.changed_at)),
            ("hash", hash_text(change.hashes)),
            ("length", optional_int(change.length)),
            ("type", change.media_type),
        ),
    )
    set_attributes(md, change.extra, _CHANGE_ATTRIBUTES)
    for link in change.links:
        write_link(url, link)
    return url


# -- Capability Lists and Source Descriptions ------------------------------------------------


def parse_capability_list(data: bytes | str, *, max_bytes: int | None = None) -> CapabilityList:
    """The Capability List in `data`, with unknown attributes and links kept for round trips.

    Raises `DocumentParseError` when it is not a Capability List, `ValidationError` with every
    broken rule (core §9: up link, one entry per capability, loc and capability per entry).
    """
    return read_capability_list(parse_root(data, max_bytes=max_bytes))


def read_capability_list(root: etree._Element) -> CapabilityList:
    md, up, links, urls = _read_root(root, CAPABILITY_LIST, "Capability List")
    problems: list[str] = []
    root_links: list[Link] = []
    for element in links:
        if (link := read_link(element, "<urlset>", problems)) is None:
            continue
        if link.rel == "up" and up is None and _is_plain(link):
            up = link.href
        else:
            root_links.append(link)
    if up is None:
        problems.append(
            "<urlset> of the Capability List has no <rs:ln rel='up'>; expected one pointing to the "
            "Source Description"
        )
    entries = [entry for i, url in enumerate(urls, 1) if (entry := _read_entry(url, i, problems, True))]
    seen: set[str | None] = set()
    for entry in entries:
        if entry.capability in seen:
            problems.append(
                f"<rs:md> for {entry.loc} repeats capability='{entry.capability}'; expected one entry "
                "per capability in a Capability List"
            )
        seen.add(entry.capability)
    if problems:
        raise ValidationError(problems)
    return CapabilityList(tuple(entries), up, tuple(root_links), extra_attributes(md, _CAPABILITY_ONLY))


_CAPABILITY_ONLY = frozenset({"capability"})


def parse_source_description(data: bytes | str, *, max_bytes: int | None = None) -> SourceDescription:
    """The Source Description in `data` (core §8); raises like `parse_capability_list`."""
    return read_source_description(parse_root(data, max_bytes=max_bytes))


def read_source_description(root: etree._Element) -> SourceDescription:
    _md, _up, link_elements, urls = _read_root(root, SOURCE_DESCRIPTION, "Source Description")
    problems: list[str] = []
    links = [link for e in link_elements if (link := read_link(e, "<urlset>", problems))]
    entries = [entry for i, url in enumerate(urls, 1) if (entry := _read_entry(url, i, problems, False))]
    for entry in entries:
        if entry.capability not in (None, CAPABILITY_LIST):
            problems.append(
                f"<rs:md> for {entry.loc} has capability='{entry.capability}'; expected "
                f"{CAPABILITY_LIST} in a Source Description"
            )
    if problems:
        raise ValidationError(problems)
    return SourceDescription(tuple(entries), tuple(links))


def _read_root(
    root: etree._Element, capability: str, kind: str
) -> tuple[etree._Element, None, list[etree._Element], list[etree._Element]]:
    """The root `<rs:md>`, its `<rs:ln>` elements and `<url>`s, after checking the capability."""
    if root.tag != URLSET:
        raise DocumentParseError(f"root element is {describe_element(root.tag)}; expected <urlset> for a {kind}")
    md = None
    links: list[etree._Element] = []
    urls: list[etree._Element] = []
    for child in root:
        if child.tag == URL:
            urls.append(child)
        elif child.tag == RS_LN:
            links.append(child)
        elif child.tag == RS_MD and md is None:
            md = child
    seen = None if md is None else md.get("capability")
    if md is None or seen != capability:
        raise DocumentParseError(
            f"<rs:md> of <urlset> has capability='{seen}'; expected {capability}: this is not a {kind}"
            if seen is not None
            else f"<urlset> has no <rs:md capability='{capability}'>: this is not a {kind}"
        )
    return md, None, links, urls


def _read_entry(
    url: etree._Element, index: int, problems: list[str], capability_required: bool
) -> CapabilityEntry | None:
    before = len(problems)
    where, _, loc, md, lastmod, links = read_url(url, index, problems)
    capability = None if md is None else md.get("capability")
    if capability_required and capability is None:
        problems.append(f"{where} has no <rs:md capability='...'>; expected the capability of the document")
    if len(problems) > before or loc is None:
        return None
    extra = () if md is None else extra_attributes(md, _CAPABILITY_ONLY)
    return CapabilityEntry(loc, capability, tuple(links), lastmod, extra)


def capability_list_to_xml(capability_list: CapabilityList) -> bytes:
    """The Capability List as a UTF-8 `<urlset>` document; every kept attribute is written back."""
    root = new_root()
    for link in capability_list.links:
        write_link(root, link)
    if capability_list.up is not None:
        write_link(root, Link("up", capability_list.up))
    md = etree.SubElement(root, RS_MD, capability=CAPABILITY_LIST)
    set_attributes(md, capability_list.extra_md, _CAPABILITY_ONLY)
    for entry in capability_list.entries:
        _write_entry(root, entry)
    return serialize(root, pretty=True)


def source_description_to_xml(source_description: SourceDescription) -> bytes:
    """The Source Description as a UTF-8 `<urlset>` document."""
    root = new_root()
    for link in source_description.links:
        write_link(root, link)
    etree.SubElement(root, RS_MD, capability=SOURCE_DESCRIPTION)
    for entry in source_description.entries:
        _write_entry(root, entry)
    return serialize(root, pretty=True)


def _write_entry(parent: etree._Element, entry: CapabilityEntry) -> None:
    try:
        _write_entry_elements(parent, entry)
    except ValueError as exc:  # lxml: "All strings must be XML compatible"
        raise NotificationError(f"<url> for {entry.loc!r} cannot be written as XML: {exc}") from None


def _write_entry_elements(parent: etree._Element, entry: CapabilityEntry) -> None:
    url = etree.SubElement(parent, URL)
    etree.SubElement(url, LOC).text = entry.loc
    if entry.lastmod is not None:
        etree.SubElement(url, LASTMOD).text = format_datetime(entry.lastmod)
    for link in entry.links:
        write_link(url, link)
    if entry.capability is not None or entry.extra:
        md = etree.SubElement(url, RS_MD)
        set_attributes(md, (("capability", entry.capability),))
        set_attributes(md, entry.extra, _CAPABILITY_ONLY)

"""`rsnotify inspect`: what a Source offers, read as a Destination reads it, and every rule it
breaks on the way.

From any of the Source's URLs (its base, /.well-known/resourcesync, a Source Description, a
Capability List, or one of its lists, which link up to it) to each Capability List and each
capability's document: its kind, `at`/`completed` or `from`/`until`, and its entry count. Resource
and Change Lists are streamed (`rsnotify.lists`) and indexes followed; the other documents are
checked whole (`rsnotify.documents`). The change-notification channel's topic is fetched as
WebSub discovery does (`discovery.discover_topic`). Problems are collected, never raised.
"""
from __future__ import annotations

import asyncio
import io
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import IO, Any
from urllib.parse import urljoin, urlsplit

import aiohttp

from rsnotify.bodies import bounded_chunks
from rsnotify.datetimes import format_datetime
from rsnotify.documents import DOCUMENT_NAMES, ParsedDocument, parse_document
from rsnotify.errors import DocumentParseError, RsnotifyError
from rsnotify.lists import CHANGE_LIST, RESOURCE_LIST, ListInfo, ListRef, open_list
from rsnotify.neterrors import describe_client_error
from rsnotify.notification import (
    CAPABILITY_LIST,
    CHANGE_NOTIFICATION,
    LEGACY_CHANGE_NOTIFICATION,
    SOURCE_DESCRIPTION,
    CapabilityList,
    SourceDescription,
)

from .discovery import (
    MAX_DOCUMENT_BYTES,
    MAX_REDIRECTS,
    WELL_KNOWN,
    discover_topic,
    source_description_url,
)
from .errors import DiscoveryError

MAX_INDEX_PARTS = 1_000   # component lists of one index read at most (a hostile index can name millions)
MAX_UP_STEPS = 3          # a list part -> its index -> the Capability List: rel="up"/"index" links followed
_STREAMED = (RESOURCE_LIST, CHANGE_LIST)
_CHANNELS = (CHANGE_NOTIFICATION, LEGACY_CHANGE_NOTIFICATION)


@dataclass
class DocumentReport:
    """One capability of a Capability List and what its document holds."""

    capability: str
    url: str
    kind: str | None = None              # what the document says it is ("Resource List Index")
    at: str | None = None
    completed: str | None = None
    from_: str | None = None
    until: str | None = None
    entries: int | None = None           # resources or changes (an index: summed over its parts)
    parts: int | None = None             # an index's component lists
    topic: str | None = None             # a change-notification channel: its topic and hubs
    hubs: tuple[str, ...] = ()


@dataclass
class CapabilityListReport:
    url: str
    documents: list[DocumentReport] = field(default_factory=list)


@dataclass
class Inspection:
    """What `inspect_source` found from `url`; `problems` empty means no rule checked was broken."""

    url: str
    source_description: str | None = None
    capability_lists: list[CapabilityListReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for listed in data["capability_lists"]:
            for document in listed["documents"]:
                document["from"] = document.pop("from_")
                document["hubs"] = list(document["hubs"])
        return data


class _Unreadable(Exception):
    """A document could not be fetched; its message is the problem to report."""


async def inspect_source(url: str, session: aiohttp.ClientSession | None = None) -> Inspection:
    """Inspect the Source reachable from `url` (see the module docstring)."""
    if session is None:
        timeout = aiohttp.ClientTimeout(total=120, sock_connect=10, sock_read=30)
        async with aiohttp.ClientSession(timeout=timeout) as own:
            return await inspect_source(url, own)
    report = Inspection(url)
    for capability_list in await _capability_lists(session, url, report):
        report.capability_lists.append(await _inspect_capability_list(session, capability_list, report))
    if not report.capability_lists and not report.problems:
        report.problems.append(f"no Capability List found from {url}")
    return report


# -- from any URL to the Capability Lists ---------------------------------------------------------

async def _capability_lists(session: aiohttp.ClientSession, url: str, report: Inspection) -> list[str]:
    """The Capability List URLs of the Source `url` belongs to, `report.source_description` set."""
    if urlsplit(url).path.endswith(WELL_KNOWN):
        return await _from_source_description(session, url, report)
    start_problem = None
    for _ in range(MAX_UP_STEPS + 1):
        try:
            final_url, body = await _get_small(session, url)
            capability, info = _head(body)
        except _Unreadable as exc:
            start_problem = str(exc)
            break
        except RsnotifyError as exc:
            start_problem = f"{url} is not a ResourceSync document: {exc}"
            break
        if capability is None:
            start_problem = f"{final_url} is not a ResourceSync document (no <rs:md capability>)"
            break
        if capability == SOURCE_DESCRIPTION:
            return await _from_source_description(session, final_url, report, body)
        if capability == CAPABILITY_LIST:
            return [final_url]
        up = info.link("up") if info is not None else None
        index = info.link("index") if info is not None else None
        if not (index or up):
            report.problems.append(f"{final_url} is a {_name(capability)} without a rel=\"up\" link: its "
                                   "Capability List cannot be found from it")
            return []
        url = urljoin(final_url, index or up or "")
    # Not a ResourceSync document (a base URL, a topic, a web page): below the host root first the
    # folder's sourcedescription.xml, where `rsnotify source` serves it and `rsnotify sync` looks
    # (discovery.find_source), then the Source's well-known URL.
    if urlsplit(url).path not in ("", "/"):
        beside = urljoin(url if url.endswith("/") else url + "/", "sourcedescription.xml")
        try:
            final_url, body = await _get_small(session, beside)
            if _head(body)[0] == SOURCE_DESCRIPTION:
                return await _from_source_description(session, final_url, report, body)
        except (_Unreadable, RsnotifyError):
            pass            # none there: the well-known URL's answer is what gets reported
    well_known = source_description_url(url)
    try:
        return await _from_source_description(session, well_known, report)
    except _Unreadable as exc:
        report.problems.append(f"{start_problem}; and {exc}" if start_problem else str(exc))
        return []


async def _from_source_description(session: aiohttp.ClientSession, url: str, report: Inspection,
                                   body: bytes | None = None) -> list[str]:
    if body is None:
        try:
            url, body = await _get_small(session, url)
        except _Unreadable as exc:
            if urlsplit(url).path.endswith(WELL_KNOWN):
                raise
            report.problems.append(str(exc))
            return []
    report.source_description = url
    parsed = _checked(url, body, report, expected=SOURCE_DESCRIPTION)
    if parsed is None or not isinstance(parsed.model, SourceDescription):
        return []
    locs = [urljoin(url, loc) for loc in parsed.model.capability_lists]
    if not locs:
        report.problems.append(f"Source Description {url} lists no Capability List")
    return locs


# -- one Capability List and its documents --------------------------------------------------------

async def _inspect_capability_list(session: aiohttp.ClientSession, url: str, report: Inspection) -> CapabilityListReport:
    listed = CapabilityListReport(url)
    try:
        final_url, body = await _get_small(session, url)
    except _Unreadable as exc:
        report.problems.append(str(exc))
        return listed
    listed.url = final_url
    parsed = _checked(final_url, body, report, expected=CAPABILITY_LIST)
    if parsed is None or not isinstance(parsed.model, CapabilityList):
        return listed
    if parsed.model.up is None:
        report.notes.append(f"Capability List {final_url} has no rel=\"up\" link to its Source Description")
    elif report.source_description is None:   # reached from a list: the way back up, as it says
        report.source_description = urljoin(final_url, parsed.model.up)
    for entry in parsed.model.entries:
        loc = urljoin(final_url, entry.loc)
        document = DocumentReport(entry.capability or "(none)", loc)
        listed.documents.append(document)
        if entry.capability in _CHANNELS:
            document.topic = loc
            document.hubs = tuple(urljoin(final_url, hub) for hub in entry.links_with("hub"))
            await _check_channel(session, document, report)
        elif entry.capability in _STREAMED:
            await _inspect_list(session, document, final_url, report)
        elif entry.capability:
            await _inspect_other(session, document, report)
    return listed


async def _check_channel(session: aiohttp.ClientSession, document: DocumentReport, report: Inspection) -> None:
    if not document.hubs:
        report.problems.append(f"change-notification channel {document.topic} has no <rs:ln rel=\"hub\">")
    try:
        found = await discover_topic(document.topic, session)
    except DiscoveryError as exc:
        report.problems.append(str(exc))   # names the topic already
        return
    if found.topic != document.topic:
        report.notes.append(f"topic {document.topic} calls itself {found.topic} (rel=\"self\")")
    if document.hubs and not set(found.hubs) & set(document.hubs):
        report.problems.append(f"topic {document.topic} advertises hub(s) {', '.join(found.hubs)}; the Capability "
                               f"List says {', '.join(document.hubs)}")


async def _inspect_other(session: aiohttp.ClientSession, document: DocumentReport, report: Inspection) -> None:
    """A dump, manifest or other document: checked whole, as `rsnotify validate` does."""
    try:
        final_url, body = await _get_small(session, document.url)
    except _Unreadable as exc:
        report.problems.append(str(exc))
        return
    parsed = _checked(final_url, body, report, expected=document.capability)
    if parsed is not None:
        document.kind, document.entries = parsed.description, parsed.entries


async def _inspect_list(session: aiohttp.ClientSession, document: DocumentReport, capability_list: str,
                        report: Inspection) -> None:
    """A Resource List or Change List (or its index): head, entries counted while streamed."""
    try:
        info, count, refs = await _stream_list(session, document.url)
    except (_Unreadable, DocumentParseError) as exc:
        report.problems.append(f"{document.url}: {exc}" if isinstance(exc, DocumentParseError) else str(exc))
        return
    document.kind = _name(info.capability) + (" Index" if info.is_index else "")
    document.at, document.completed = _text(info.at), _text(info.completed)
    document.from_, document.until = _text(info.from_), _text(info.until)
    _check_head(document.url, info, document.capability, capability_list, report)
    if not info.is_index:
        document.entries = count
        return
    document.parts, document.entries = len(refs), 0
    if count > len(refs):
        report.notes.append(f"{document.url} names {count} lists; only the first {len(refs)} were read")
    for ref in refs:
        part_url = urljoin(document.url, ref.loc)
        try:
            part, part_count, _ = await _stream_list(session, part_url)
        except (_Unreadable, DocumentParseError) as exc:
            report.problems.append(f"{part_url}: {exc}" if isinstance(exc, DocumentParseError) else str(exc))
            continue
        if part.is_index:
            report.problems.append(f"{part_url} is an index inside the index {document.url}; expected a list")
            continue
        _check_head(part_url, part, document.capability, capability_list, report)
        document.entries += part_count


def _check_head(url: str, info: ListInfo, capability: str, capability_list: str, report: Inspection) -> None:
    if info.capability != capability:
        report.problems.append(f"{url} has capability {info.capability!r}; the Capability List lists it as {capability!r}")
    up = info.link("up")
    if up is None:
        report.notes.append(f"{url} has no rel=\"up\" link to its Capability List")
    elif urljoin(url, up) != capability_list:
        report.problems.append(f"{url} links up to {urljoin(url, up)}; expected its Capability List {capability_list}")
    if capability == RESOURCE_LIST and info.at is None:
        report.problems.append(f"{url} has no at= in its <rs:md>; a Resource List needs one")
    if capability == CHANGE_LIST and info.from_ is None:
        report.problems.append(f"{url} has no from= in its <rs:md>; a Change List needs one")


# -- fetching and reading ---------------------------------------------------------------------------

async def _get_small(session: aiohttp.ClientSession, url: str) -> tuple[str, bytes]:
    """(final URL, body) of a document read whole (Source Descriptions, Capability Lists, dumps)."""
    with tempfile.SpooledTemporaryFile(max_size=1024 * 1024) as spool:
        final_url = await _download(session, url, spool)
        spool.seek(0)
        return final_url, spool.read()


async def _stream_list(session: aiohttp.ClientSession, url: str) -> tuple[ListInfo, int, list[ListRef]]:
    """(head, entry count, the first MAX_INDEX_PARTS index entries) of a list, streamed through a
    temporary file so memory stays flat."""
    with tempfile.TemporaryFile() as spool:
        await _download(session, url, spool)
        spool.seek(0)
        return await asyncio.to_thread(_count_entries, spool)


def _count_entries(stream: IO[bytes]) -> tuple[ListInfo, int, list[ListRef]]:
    reader = open_list(stream)  # type: ignore[arg-type]
    count, refs = 0, list[ListRef]()
    for entry in reader:
        count += 1
        if isinstance(entry, ListRef) and len(refs) < MAX_INDEX_PARTS:
            refs.append(entry)
    return reader.info, count, refs


async def _download(session: aiohttp.ClientSession, url: str, out: IO[bytes]) -> str:
    """GET `url` into `out`, at most MAX_DOCUMENT_BYTES; the final URL. _Unreadable otherwise."""
    try:
        async with session.get(url, allow_redirects=True, max_redirects=MAX_REDIRECTS) as response:
            if response.status != 200:
                raise _Unreadable(f"{url} answered {response.status}; expected 200")
            async for chunk in bounded_chunks(response, MAX_DOCUMENT_BYTES, lambda _: _Unreadable(
                    f"{url} is larger than {MAX_DOCUMENT_BYTES} bytes, the Sitemap limit")):
                out.write(chunk)
            return str(response.url)
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise _Unreadable(f"cannot fetch {url}: {describe_client_error(exc)}") from exc


def _head(body: bytes) -> tuple[str | None, ListInfo | None]:
    """The document's capability, and its list head when it is a list (None for the others)."""
    parsed = parse_document(body)
    if parsed.capability in (SOURCE_DESCRIPTION, CAPABILITY_LIST) or parsed.capability is None:
        return parsed.capability, None
    try:
        return parsed.capability, open_list(io.BytesIO(body)).info
    except DocumentParseError:
        return parsed.capability, None


def _checked(url: str, body: bytes, report: Inspection, *, expected: str) -> ParsedDocument | None:
    """`body` parsed and checked; its problems and notes go into `report`."""
    try:
        parsed = parse_document(body)
    except RsnotifyError as exc:
        report.problems.append(f"{url}: {exc}")
        return None
    if parsed.capability != expected:
        report.problems.append(f"{url} is a {parsed.description}; expected a {_name(expected)}")
        return None
    report.problems.extend(f"{url}: {problem}" for problem in parsed.problems)
    report.notes.extend(f"{url}: {note}" for note in parsed.notes)
    return parsed


def _name(capability: str | None) -> str:
    return DOCUMENT_NAMES.get(capability or "", f"document with capability {capability!r}")


def _text(value: datetime | None) -> str | None:
    return format_datetime(value) if value is not None else None


__all__ = ["CapabilityListReport", "DocumentReport", "Inspection", "inspect_source"]

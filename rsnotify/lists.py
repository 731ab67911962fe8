"""Resource Lists, Change Lists and their indexes (core §10-12), read and written streaming.

`open_list(stream)` reads a document with `rsnotify.safexml.iterparse` (the safe parser's
rules, checked as the bytes arrive) and clears each entry once read, so memory stays flat however long the list. `ListWriter` writes one with
`lxml.etree.xmlfile`, entry by entry. No network I/O here: callers hand in binary streams.
"""
from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import BinaryIO, Self

from lxml import etree

from .datetimes import format_datetime
from .errors import DocumentParseError, NotificationError
from .notification import Link, ResourceChange
from .safexml import (
    LASTMOD,
    LOC,
    NSMAP,
    RS_LN,
    RS_MD,
    SITEMAP,
    SITEMAPINDEX,
    URL,
    URLSET,
    describe_element,
    extra_attributes,
    hash_text,
    iterparse_batches,
    link_attributes,
    optional_datetime,
    optional_int,
    read_datetime,
    read_hashes,
    read_length,
    read_link,
)
from .xml import (  # one reader for every <url>, shared with notifications
    read_change,
    read_url,
)

log = logging.getLogger(__name__)

RESOURCE_LIST = "resourcelist"
CHANGE_LIST = "changelist"

_RESOURCE_ATTRIBUTES = frozenset({"hash", "length", "type"})
_LIST_ATTRIBUTES = ("at", "completed", "from", "until")


@dataclass(frozen=True, slots=True)
class Resource:
    """One `<url>` of a Resource List: a resource's state at the list's `at`."""

    loc: str
    lastmod: datetime | None = None
    hashes: tuple[tuple[str, str], ...] = ()  # XML: rs:md/@hash, as (algorithm, hex) pairs
    length: int | None = None
    media_type: str | None = None             # XML: rs:md/@type
    links: tuple[Link, ...] = ()
    extra: tuple[tuple[str, str], ...] = ()   # other rs:md attributes, Clark-notation names

    def __post_init__(self) -> None:
        if not self.loc:
            raise NotificationError("a Resource List entry needs a <loc>, got an empty one")
        if self.length is not None and self.length < 0:
            raise NotificationError(f"<rs:md> for {self.loc} has length={self.length}; expected >= 0")
        if self.lastmod is not None and self.lastmod.tzinfo is None:
            raise NotificationError(f"lastmod of {self.loc} must be timezone-aware, got naive {self.lastmod.isoformat()}")

    @property
    def hash(self) -> str | None:
        return hash_text(self.hashes)


@dataclass(frozen=True, slots=True)
class ListInfo:
    """A list's root `<rs:md>` and `<rs:ln>`s, and whether it is an index."""

    capability: str                      # "resourcelist", "changelist", ...
    is_index: bool = False               # <sitemapindex> (or a <urlset> of <sitemap>s)
    at: datetime | None = None
    completed: datetime | None = None
    from_: datetime | None = None        # XML: from
    until: datetime | None = None
    links: tuple[Link, ...] = ()

    def __post_init__(self) -> None:
        if not self.capability:
            raise NotificationError("a list needs a capability, got an empty one")
        for name in ("at", "completed", "from_", "until"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise NotificationError(f"{name.rstrip('_')} must be timezone-aware, got naive {value.isoformat()}")

    def link(self, rel: str) -> str | None:
        """The href of the first `<rs:ln>` with `rel` (e.g. "up", "index"), or None."""
        return next((link.href for link in self.links if link.rel == rel), None)


@dataclass(frozen=True, slots=True)
class ListRef:
    """One `<sitemap>` of an index: a component list and its bounds from its `<rs:md>`."""

    loc: str
    at: datetime | None = None
    completed: datetime | None = None
    from_: datetime | None = None        # XML: from
    until: datetime | None = None

    def __post_init__(self) -> None:
        if not self.loc:
            raise NotificationError("an index entry needs a <loc>, got an empty one")


Entry = Resource | ResourceChange | ListRef


# -- reading -------------------------------------------------------------------------------


class ListStream:
    """An open Resource List, Change List or index: `info` at once, then its entries.

    Iterating yields `Resource` (Resource List), `ResourceChange` (Change List) or `ListRef`
    (any index), in document order, each once. Raises `DocumentParseError` naming the entry
    and its line on bad input (after the entries before it).
    """

    def __init__(self, stream: BinaryIO, *, max_bytes: int | None = None) -> None:
        # safexml's iterparse_batches screens the bytes (UTF-8 only, no DTD, size, element and
        # attribute caps) as it reads them, and translates lxml's errors. Only end events: an
        # element is complete then, and where it sits (a root child or deeper) is its parent's
        # business, so one event per element is enough.
        self._batches = self._checked(iterparse_batches(stream, ("end",), max_bytes=max_bytes))
        self._batch: list[tuple[str, etree._Element]] = []   # the events read last
        self._at = 0                                         # the first of them not looked at yet
        self._root: etree._Element | None = None
        self._count = 0
        self._first: etree._Element | None = None  # the entry that ended the head, read next
        self._ready: deque[Entry] = deque()        # entries read, not yet handed out
        self._error: DocumentParseError | None = None   # raised once the entries before it are out
        self._done = False
        self.info = self._read_head()

    def __iter__(self) -> Iterator[Entry]:
        return self

    def __next__(self) -> Entry:
        if not self._ready and not self._done:
            self._read_batch()
        if self._ready:
            return self._ready.popleft()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        raise StopIteration

    def take(self, size: int) -> list[Entry]:
        """The next `size` entries (fewer at the end), in one call: `list(islice(self, size))`,
        without a call per entry. An entry that cannot be read raises, as iterating would."""
        taken: list[Entry] = []
        ready = self._ready
        while len(taken) < size:
            if not ready:
                if self._done:
                    break
                self._read_batch()
                continue
            if len(ready) <= size - len(taken):
                taken.extend(ready)
                ready.clear()
            else:
                taken.extend(ready.popleft() for _ in range(size - len(taken)))
        if len(taken) < size and self._error is not None:
            error, self._error = self._error, None
            raise error
        return taken

    # -- internals --

    def _checked(self, batches: Iterator[list[tuple[str, etree._Element]]]
                 ) -> Iterator[list[tuple[str, etree._Element]]]:
        """The batches of events; the root is checked once the first element is seen."""
        try:
            for batch in batches:
                if self._root is None:
                    self._root = batch[0][1].getroottree().getroot()
                    self._check_root(self._root)
                yield batch
        except DocumentParseError:
            self._done = True
            raise

    def _next_element(self) -> etree._Element | None:
        """The next element to end, one at a time (the head); None at the document's end."""
        while self._at >= len(self._batch):
            batch = next(self._batches, None)
            if batch is None:
                return None
            self._batch, self._at = batch, 0
        element = self._batch[self._at][1]
        self._at += 1
        return element

    def _read_batch(self) -> None:
        """Read the entries of the rest of the current batch of events (or of the next batches,
        until one has any) into `_ready`, then drop every root child read from the tree at
        once, so it never grows. An entry that cannot be read stops the list: its error waits
        in `_error` behind the entries before it."""
        root = self._root
        ready = self._ready
        last: etree._Element | None = None      # the last root child read
        try:
            if self._first is not None:
                last, self._first = self._first, None
                ready.append(self._read_entry(last))
            while True:
                batch, at = self._batch, self._at
                self._at = len(batch)
                for _, element in itertools.islice(batch, at, None):
                    if element.getparent() is not root:
                        continue            # inside an entry (read with it), or the root itself
                    last = element          # stray root children after the head: dropped unread
                    if element.tag in (URL, SITEMAP):
                        ready.append(self._read_entry(element))
                if ready:
                    return
                following = next(self._batches, None)
                if following is None:
                    self._done = True
                    return
                self._batch, self._at = following, 0
        except DocumentParseError as exc:
            self._done = True
            self._error = exc
        finally:
            if last is not None:
                self._drop_through(last)

    def _drop_through(self, element: etree._Element) -> None:
        """Free the root child `element` (read) and every sibling before it."""
        root = element.getparent()
        if root is not None:
            del root[:root.index(element) + 1]

    def _read_head(self) -> ListInfo:
        """Read up to the end of the first entry: the root, its `<rs:md>` and `<rs:ln>`s."""
        md: etree._Element | None = None
        link_elements: list[etree._Element] = []
        while (element := self._next_element()) is not None:
            if element.getparent() is not self._root:
                continue
            if element.tag in (URL, SITEMAP):
                self._first = element
                break
            if element.tag == RS_MD and md is None:
                md = element
            elif element.tag == RS_LN:
                link_elements.append(element)
        if self._root is None:
            raise DocumentParseError("not an XML document: it is empty; expected a <urlset> or <sitemapindex>")
        if self._first is None:
            self._done = True
        return self._head_info(md, link_elements, None if self._first is None else self._first.tag)

    def _check_root(self, root: etree._Element) -> None:
        if root.tag not in (URLSET, SITEMAPINDEX):
            raise DocumentParseError(
                f"root element is {describe_element(root.tag)}; expected <urlset> or <sitemapindex> "
                "in the Sitemap namespace"
            )

    def _head_info(self, md: etree._Element | None, link_elements: list[etree._Element], first_entry: str | None) -> ListInfo:
        assert self._root is not None
        root_name = "sitemapindex" if self._root.tag == SITEMAPINDEX else "urlset"
        capability = None if md is None else md.get("capability")
        if not capability:
            raise DocumentParseError(f"<{root_name}> has no <rs:md capability=...> (line {self._root.sourceline}); expected one")
        problems: list[str] = []
        owner = f"<rs:md> of <{root_name}>"
        bounds = {name: read_datetime(md.get(name), f"{owner} has {name}", problems) for name in _LIST_ATTRIBUTES}  # type: ignore[union-attr]
        links = tuple(link for e in link_elements if (link := read_link(e, f"<{root_name}>", problems)))
        if problems:
            raise DocumentParseError(f"{'; '.join(problems)} (line {md.sourceline})")  # type: ignore[union-attr]
        is_index = self._root.tag == SITEMAPINDEX
        if not is_index and first_entry == SITEMAP:
            # Some Sources serve an index with a <urlset> root (pod4lib/aggregator #327).
            log.warning("a <urlset> holds <sitemap> entries: read as an index")
            is_index = True
        self._is_index = is_index
        return ListInfo(capability, is_index, bounds["at"], bounds["completed"], bounds["from"], bounds["until"], links)

    def _read_entry(self, element: etree._Element) -> Entry:
        self._count += 1
        problems: list[str] = []
        try:
            if element.tag == SITEMAP:
                entry: Entry | None = _read_list_ref(element, self._count, problems)
            elif self._is_index:
                problems.append(f"<url> #{self._count} in an index; expected <sitemap> entries only")
                entry = None
            elif self.info.capability == CHANGE_LIST:
                entry = read_change(element, self._count, problems)
            else:
                entry = _read_resource(element, self._count, problems)
        except NotificationError as exc:
            problems.append(str(exc))
            entry = None
        if problems or entry is None:
            self._done = True
            detail = "; ".join(problems) or f"entry #{self._count} could not be read"
            raise DocumentParseError(f"{detail} (line {element.sourceline})")
        return entry


def open_list(stream: BinaryIO, *, max_bytes: int | None = None) -> ListStream:
    """Open a Resource List, Change List or index for streaming; `.info` is read at once.

    `max_bytes` bounds the document (default: the Sitemap limit, 50 MB). Raises
    `DocumentParseError` when the head is not safe, well-formed XML of a list.
    """
    return ListStream(stream, max_bytes=max_bytes)


def _read_resource(url: etree._Element, index: int, problems: list[str]) -> Resource | None:
    plain = _read_plain_resource(url)
    if plain is not None:
        return plain
    before = len(problems)
    _where, owner, loc, md, lastmod, links = read_url(url, index, problems)
    attrs: dict[str, str] = {} if md is None else dict(md.items())
    hashes = read_hashes(attrs.get("hash"), f"<rs:md> {owner} has hash", problems)
    length = read_length(attrs.get("length"), f"<rs:md> {owner} has length", problems)
    if len(problems) > before or loc is None:
        return None
    extra = () if md is None else extra_attributes(md, _RESOURCE_ATTRIBUTES)
    return Resource(loc, lastmod, hashes, length, attrs.get("type"), tuple(links), extra)


def _read_plain_resource(url: etree._Element) -> Resource | None:
    """The usual `<url>` (one `<loc>`, at most one `<lastmod>` and one `<rs:md>` with modelled
    attributes only, nothing else) read in one go by the same readers; None when anything
    about it is unusual or wrong, and _read_resource then reads it step by step, which words
    every problem. Whatever this returns, that reading returns too: it only skips the steps
    such an entry does not need (links, extras, the names messages would use)."""
    loc = lastmod = md = None
    for child in url:
        tag = child.tag
        if tag == LOC and loc is None:
            loc = (child.text or "").strip()
        elif tag == LASTMOD and lastmod is None:
            lastmod = child
        elif tag == RS_MD and md is None:
            md = child
        else:
            return None
    if not loc:
        return None
    attrs: dict[str, str] = {} if md is None else dict(md.items())
    if not attrs.keys() <= _RESOURCE_ATTRIBUTES:
        return None
    wrong: list[str] = []        # any problem at all: the step-by-step reading words it
    when = None if lastmod is None else read_datetime((lastmod.text or "").strip(), "", wrong)
    hashes = read_hashes(attrs.get("hash"), "", wrong)
    length = read_length(attrs.get("length"), "", wrong)
    if wrong:
        return None
    return Resource(loc, when, hashes, length, attrs.get("type"))


def _read_list_ref(sitemap: etree._Element, index: int, problems: list[str]) -> ListRef | None:
    loc = md = None
    for child in sitemap:
        if child.tag == LOC and loc is None:
            loc = (child.text or "").strip()
        elif child.tag == RS_MD and md is None:
            md = child
    if not loc:
        problems.append(f"<sitemap> #{index} has no <loc>; expected the URI of a list")
        return None
    owner = f"<rs:md> of <sitemap> for {loc}"
    bounds = {
        name: read_datetime(None if md is None else md.get(name), f"{owner} has {name}", problems)
        for name in _LIST_ATTRIBUTES
    }
    if problems:
        return None
    return ListRef(loc, bounds["at"], bounds["completed"], bounds["from"], bounds["until"])


# -- writing -------------------------------------------------------------------------------


class _CountingWriter:
    """Counts the bytes written to `out`, so callers can rotate before the Sitemap limit."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        self._out.write(data)
        return len(data)

    def flush(self) -> None:
        if hasattr(self._out, "flush"):
            self._out.flush()


class ListWriter:
    """Write a list or index to `out`, one entry at a time (a context manager).

    `info.is_index` writes a `<sitemapindex>` of `ListRef`s; otherwise a `<urlset>` of
    `Resource`s or `ResourceChange`s. `entries` and `bytes_written` tell how big it has grown.
    Raises `NotificationError` for a value that cannot be XML text.
    """

    def __init__(self, out: BinaryIO, info: ListInfo) -> None:
        self.info = info
        self.entries = 0
        self._out = _CountingWriter(out)
        self._file: etree.xmlfile | None = None
        self._writer: object | None = None
        self._root: object | None = None

    @property
    def bytes_written(self) -> int:
        """Bytes so far; the closing root tag adds len('</sitemapindex>') at most."""
        return self._out.count

    def __enter__(self) -> Self:
        self._file = etree.xmlfile(self._out, encoding="UTF-8")
        self._writer = self._file.__enter__()
        self._writer.write_declaration()  # type: ignore[attr-defined]
        self._root = self._writer.element(SITEMAPINDEX if self.info.is_index else URLSET, nsmap=NSMAP)  # type: ignore[attr-defined]
        self._root.__enter__()  # type: ignore[attr-defined]
        self._newline()
        info = self.info
        for link in info.links:
            self._leaf(RS_LN, link_attributes(link))
            self._newline()
        self._leaf(RS_MD, [
            ("capability", info.capability),
            ("at", optional_datetime(info.at)),
            ("completed", optional_datetime(info.completed)),
            ("from", optional_datetime(info.from_)),
            ("until", optional_datetime(info.until)),
        ])
        self._newline()
        self._writer.flush()  # type: ignore[attr-defined]
        return self

    def write(self, entry: Entry) -> None:
        """Append one entry: a ListRef in an index, a Resource or ResourceChange in a list."""
        if self._writer is None:
            raise RuntimeError("ListWriter.write() outside its `with` block")
        if self.info.is_index != isinstance(entry, ListRef):
            kind = "an index" if self.info.is_index else "a list"
            raise NotificationError(f"{type(entry).__name__} for {entry.loc} cannot go into {kind}")
        try:
            if isinstance(entry, ListRef):
                self._write_list_ref(entry)
            elif isinstance(entry, ResourceChange):
                self._write_url(entry.loc, entry.lastmod, _change_md(entry), entry.links)
            else:
                self._write_url(entry.loc, entry.lastmod, _resource_md(entry), entry.links)
        except ValueError as exc:  # lxml: "All strings must be XML compatible"
            if isinstance(exc, NotificationError):
                raise
            raise NotificationError(f"<url> for {entry.loc!r} cannot be written as XML: {exc}") from None
        self.entries += 1

    def __exit__(self, *exc_info: object) -> None:
        root, file = self._root, self._file
        self._root = self._file = self._writer = None
        if root is not None:
            root.__exit__(*exc_info)  # type: ignore[attr-defined]
        if file is not None:
            file.__exit__(*exc_info)
        self._out.flush()

    # -- internals --

    def _newline(self) -> None:
        self._writer.write("\n")  # type: ignore[union-attr]

    def _leaf(self, tag: str, attributes: list[tuple[str, str | None]], text: str | None = None) -> None:
        # lxml refuses text that cannot be XML (NUL, control characters) with a ValueError.
        with self._writer.element(tag, {k: v for k, v in attributes if v is not None}):  # type: ignore[union-attr]
            if text is not None:
                self._writer.write(text)  # type: ignore[union-attr]

    def _write_url(
        self, loc: str, lastmod: datetime | None, md: list[tuple[str, str | None]], links: tuple[Link, ...]
    ) -> None:
        writer = self._writer
        with writer.element(URL):  # type: ignore[union-attr]
            with writer.element(LOC):  # type: ignore[union-attr]
                writer.write(loc)  # type: ignore[union-attr]
            if lastmod is not None:
                with writer.element(LASTMOD):  # type: ignore[union-attr]
                    writer.write(format_datetime(lastmod))  # type: ignore[union-attr]
            attributes = {k: v for k, v in md if v is not None}
            if attributes:
                with writer.element(RS_MD, attributes):  # type: ignore[union-attr]
                    pass
            for link in links:
                self._leaf(RS_LN, link_attributes(link))
        writer.write("\n")  # type: ignore[union-attr]

    def _write_list_ref(self, ref: ListRef) -> None:
        md = [
            ("at", optional_datetime(ref.at)),
            ("completed", optional_datetime(ref.completed)),
            ("from", optional_datetime(ref.from_)),
            ("until", optional_datetime(ref.until)),
        ]
        with self._writer.element(SITEMAP):  # type: ignore[union-attr]
            self._leaf(LOC, [], ref.loc)
            if any(v is not None for _, v in md):
                self._leaf(RS_MD, md)
        self._newline()


def _change_md(change: ResourceChange) -> list[tuple[str, str | None]]:
    pairs = [
        ("change", change.change.value),
        ("datetime", optional_datetime(change.changed_at)),
        ("hash", hash_text(change.hashes)),
        ("length", optional_int(change.length)),
        ("type", change.media_type),
    ]
    modelled = {name for name, _ in pairs}
    return pairs + [(name, value) for name, value in change.extra if name not in modelled]


def _resource_md(resource: Resource) -> list[tuple[str, str | None]]:
    pairs = [
        ("hash", hash_text(resource.hashes)),
        ("length", optional_int(resource.length)),
        ("type", resource.media_type),
    ]
    modelled = {name for name, _ in pairs}
    return pairs + [(name, value) for name, value in resource.extra if name not in modelled]


__all__ = [
    "CHANGE_LIST",
    "RESOURCE_LIST",
    "ListInfo",
    "ListRef",
    "ListStream",
    "ListWriter",
    "Resource",
    "open_list",
]

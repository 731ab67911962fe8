"""The one safe XML parser, the namespaces, and readers/writers for shared pieces (`rs:ln`,
attribute syntax) used by every document kind.

Safety: UTF-8 only and no DTD (both checked on the raw bytes before parsing), a resolver that
denies every external URI, no entity expansion, no network, bounded size, elements and
attributes per element; depth is bounded by libxml2 itself (256 levels without
XML_PARSE_HUGE, which we never set). Async code parses through `parse_in_thread` (a worker
thread and a time bound); streams go through `iterparse`. Elements are matched by namespace
URI, never by prefix. No I/O here beyond reading the stream handed to `iterparse`.
"""
from __future__ import annotations

import asyncio
import functools
import re
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import IO, TypeVar

from lxml import etree

from .datetimes import EXAMPLE as DATETIME_EXAMPLE
from .datetimes import format_datetime, parse_w3c_datetime
from .errors import DatetimeError, DocumentParseError, NotificationError
from .notification import Link

SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS_NS = "http://www.openarchives.org/rs/terms/"
NSMAP = {None: SITEMAP_NS, "rs": RS_NS}

URLSET = f"{{{SITEMAP_NS}}}urlset"
SITEMAPINDEX = f"{{{SITEMAP_NS}}}sitemapindex"
URL = f"{{{SITEMAP_NS}}}url"
SITEMAP = f"{{{SITEMAP_NS}}}sitemap"
LOC = f"{{{SITEMAP_NS}}}loc"
LASTMOD = f"{{{SITEMAP_NS}}}lastmod"
RS_MD = f"{{{RS_NS}}}md"
RS_LN = f"{{{RS_NS}}}ln"

# sitemaps.org: "no larger than 50MB (52,428,800 bytes)"; callers (the hub) pass smaller limits.
DEFAULT_MAX_BYTES = 52_428_800
MAX_ENTRIES = 50_000  # Sitemap limit on <url> entries per document (core §7)
# The richest ResourceSync element (<rs:ln>) has 8 attributes; a few foreign ones are kept, but
# thousands only serve to make attribute handling (validation, the model's extras) slow.
MAX_ATTRIBUTES = 64
# 50,000 entries of <url>, <loc>, <lastmod>, <rs:md> and up to six <rs:ln> each.
MAX_ELEMENTS = 500_000
# Seconds a parse handed to a worker thread may take (queueing included) before it is refused.
PARSE_TIMEOUT = 30.0
# Bytes up to which parse_soon parses on the event loop itself: a 70-entry change notification,
# parsed and read in ~0.3 ms on the 2-core bench machine (about 20 us per KB since the one-pass
# reading of rsnotify.xml; up to 100 us per KB was measured before it).
INLINE_BYTES = 16 * 1024
# Threads that parse for event loops: a dedicated pool, so parses never starve other to_thread work.
PARSE_THREADS = 4

_LINK_ATTRIBUTES = frozenset({"rel", "href", "type", "hash", "length", "modified", "path", "pri"})
_HASH_EXAMPLE = "md5:1584abdf8ebdc9802ac0c6a7402c03b6"
_DTD_REFUSED = "document has a DTD (<!DOCTYPE ...>); expected none: DTDs and entities are refused"
_UTF8_BOM = b"\xef\xbb\xbf"
_OTHER_BOMS = (
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\xfe\xff", "UTF-16"),
    (b"\xff\xfe", "UTF-16"),
)
_BOM_STARTS = frozenset(bom[:1] for bom, _ in _OTHER_BOMS)
_DECLARATION_ENCODING = re.compile(rb"<\?xml\b[^>]*?\bencoding\s*=\s*[\"']([^\"']*)[\"']")
_PROLOG_WINDOW = 512  # bytes screened for the XML declaration (it must come first)

T = TypeVar("T")

_local = threading.local()  # lxml parser objects must not be shared between threads
_executor_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


class _ExternalReferenceRefused(Exception):
    """Raised by the resolver inside lxml; translated at the parse boundary."""


class _DenyEveryURI(etree.Resolver):
    """Refuses every external reference (DTDs, parameter entities, XInclude): libxml2 reads
    external parameter entities even with load_dtd=False and resolve_entities=False."""

    def resolve(self, system_url, public_id, context):  # type: ignore[override]
        raise _ExternalReferenceRefused()


_PARSER_OPTIONS = {
    "resolve_entities": False,
    "no_network": True,
    "dtd_validation": False,
    "load_dtd": False,
    "huge_tree": False,
    "remove_comments": True,
    "remove_pis": True,
    "collect_ids": False,
    # Sitemaps are UTF-8; forcing it means libxml2 reads exactly the bytes screened below.
    "encoding": "utf-8",
}


def _harden(parser: etree._FeedParser) -> etree._FeedParser:
    parser.resolvers.add(_DenyEveryURI())
    return parser


def _parser() -> etree.XMLParser:
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _harden(etree.XMLParser(**_PARSER_OPTIONS))
        _local.parser = parser
    return parser


def screen_prolog(head: bytes, error: type[DocumentParseError] = DocumentParseError) -> None:
    """Refuse a document whose first bytes show another encoding than UTF-8 (a BOM, NUL bytes,
    an encoding declaration), without parsing it.

    Run on the raw bytes, so a UTF-16 document cannot hide a DTD from the byte scan; the
    parser is told the document is UTF-8, so libxml2 reads what was screened (an EBCDIC
    document is then merely not well-formed).
    """
    if head.startswith(_DECLARATION):    # what serialize writes: UTF-8 said so, no BOM, no NUL
        return
    if head[:1] in _BOM_STARTS:     # every other BOM starts with one of these bytes
        for bom, name in _OTHER_BOMS:
            if head.startswith(bom):
                raise error(f"document starts with a {name} byte order mark; expected UTF-8 (Sitemaps are UTF-8)")
    if b"\x00" in head[:4]:
        raise error("document looks like UTF-16 or UTF-32 (NUL bytes at its start); expected UTF-8")
    text = head.removeprefix(_UTF8_BOM)
    if text.startswith(b"<?xml"):
        found = _DECLARATION_ENCODING.match(text[:_PROLOG_WINDOW])
        if found and found.group(1).decode("ascii", "replace").lower() not in ("utf-8", "utf8"):
            encoding = found.group(1).decode("ascii", "replace")
            raise error(f"document declares encoding='{encoding}'; expected UTF-8 (Sitemaps are UTF-8)")


def screen_body(chunk: bytes, error: type[DocumentParseError] = DocumentParseError, *, offset: int = 0) -> None:
    """Refuse bytes holding a DTD or a NUL byte (never valid in UTF-8 XML)."""
    # a one-byte search first: most bodies hold no "!" at all, and it costs a sixth of the other
    if b"!" in chunk and b"<!DOCTYPE" in chunk:
        raise error(_DTD_REFUSED)
    nul = chunk.find(b"\x00")
    if nul >= 0:
        raise error(f"document has a NUL byte at offset {offset + nul}; expected UTF-8 XML")


# Compiled once per process: compiling an XPath cost as much as running it on a publish.
_COUNT_ELEMENTS = etree.XPath("count(//*)")
# "has a 65th attribute" rather than count(@*) > 64: the same elements, found in half the time
_FIRST_CROWDED = etree.XPath(f"(//*[@*[{MAX_ATTRIBUTES + 1}]])[1]")
# The smallest element is 4 bytes (<a/>) and every attribute needs its own '=' (entities are
# refused, so nothing adds either): a document below these sizes cannot break a cap, and is not
# searched for one.
_ELEMENT_BYTES = 4


def _check_shape(root: etree._Element, data: bytes, error: type[DocumentParseError]) -> None:
    """Element and attribute caps, counted by libxml2's XPath engine (no Python loop), unless
    `data` (the parsed bytes) is too small to hold that many elements or attributes."""
    if len(data) > MAX_ELEMENTS * _ELEMENT_BYTES:
        elements = int(_COUNT_ELEMENTS(root))
        if elements > MAX_ELEMENTS:
            raise error(f"document has {elements} elements; expected at most {MAX_ELEMENTS}")
    if data.count(b"=") <= MAX_ATTRIBUTES:
        return
    crowded = _FIRST_CROWDED(root)
    if crowded:
        element = crowded[0]
        raise error(
            f"{describe_element(element.tag)} has {len(element.attrib)} attributes; "
            f"expected at most {MAX_ATTRIBUTES}"
        )


MAX_DEPTH = 256   # libxml2's limit without XML_PARSE_HUGE (which is never set)


def _translate(exc: Exception, error: type[DocumentParseError]) -> DocumentParseError:
    if isinstance(exc, _ExternalReferenceRefused):
        # Says nothing about the reference: whether a local file exists must not leak.
        return error("document refers to an external resource; expected none: external references are refused")
    if isinstance(exc, etree.XMLSyntaxError):
        if "Excessive depth" in str(exc):   # libxml2's own words advise an option we never set
            return error(f"elements nested past the maximum depth of {MAX_DEPTH} levels; expected at most {MAX_DEPTH}")
        return error(f"not well-formed XML: {exc}")
    return error(f"not an XML document: {exc}")  # lxml's ValueError: e.g. empty or unsupported input


def parse_root(
    data: bytes | bytearray | memoryview | str,
    *,
    max_bytes: int | None = None,
    error: type[DocumentParseError] = DocumentParseError,
) -> etree._Element:
    """The root element of `data`, parsed safely; raises `error` when it is not safe, well-formed XML.

    A `str` is encoded as UTF-8 first. `max_bytes` defaults to the Sitemap limit. Refused before
    parsing: another encoding than UTF-8 (BOM, declaration, NUL bytes) and any `<!DOCTYPE`, so no
    internal subset (billion laughs, XXE, external parameter entities) is ever read. Refused after:
    more than MAX_ELEMENTS elements, or an element with more than MAX_ATTRIBUTES attributes.
    Synchronous: event loops call it through `parse_in_thread`.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    elif not isinstance(data, bytes):  # bytearray, memoryview: lxml wants bytes
        data = bytes(data)
    limit = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    if len(data) > limit:
        raise error(f"document is {len(data)} bytes; expected at most {limit} bytes")
    screen_prolog(data[:_PROLOG_WINDOW], error)
    # A '<!DOCTYPE' in a comment is refused too: no valid ResourceSync document needs one.
    screen_body(data, error)
    try:
        root = etree.fromstring(data, _parser())
    except (_ExternalReferenceRefused, etree.XMLSyntaxError, ValueError) as exc:
        raise _translate(exc, error) from None
    if root is None:
        raise error("not an XML document: it is empty; expected a <urlset> or <sitemapindex>")
    docinfo = root.getroottree().docinfo
    # Defence in depth: the byte scan above already refused any DTD.
    if docinfo.doctype or docinfo.internalDTD is not None or docinfo.externalDTD is not None:
        raise error(_DTD_REFUSED)
    _check_shape(root, data, error)
    return root


def _parse_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="rsnotify-xml")
        return _executor


async def parse_soon(
    parse: Callable[..., T],
    data: bytes | bytearray | memoryview | str,
    /,
    *,
    timeout: float = PARSE_TIMEOUT,
    error: type[DocumentParseError] = DocumentParseError,
    **kwargs: object,
) -> T:
    """`parse(data, **kwargs)` for async code: right here when `data` is at most INLINE_BYTES
    (a bounded, short parse), else in a parser thread as parse_in_thread does.

    A thread hop costs more than parsing a small document (two loop wake-ups, a GIL hand-over
    each way), so most publishes are cheaper inline; a large one still never holds the loop.
    """
    if len(data) <= INLINE_BYTES:
        return parse(data, **kwargs)
    return await parse_in_thread(parse, data, timeout=timeout, error=error, **kwargs)


async def parse_in_thread(
    parse: Callable[..., T],
    data: bytes | bytearray | memoryview | str,
    /,
    *,
    timeout: float = PARSE_TIMEOUT,
    error: type[DocumentParseError] = DocumentParseError,
    **kwargs: object,
) -> T:
    """`parse(data, **kwargs)` in a parser thread, so the event loop never parses, whatever the
    body's size; raises `error` when it takes longer than `timeout` seconds (queueing included).

    The one way async code parses XML: `await parse_in_thread(parse_notification, body,
    max_bytes=limit, error=NotificationParseError)`. `parse` is any of rsnotify's parsers
    (parse_root, parse_notification, parse_document, ...); its own errors pass through.
    """
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_parse_executor(), functools.partial(parse, data, **kwargs))
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        raise error(f"parsing took longer than {timeout:g} s; refused") from None


def iterparse(
    source: IO[bytes],
    events: Sequence[str] = ("end",),
    tag: str | Sequence[str] | None = None,
    *,
    max_bytes: int | None = None,
    max_elements: int = MAX_ELEMENTS,
    chunk_size: int = 65_536,
    error: type[DocumentParseError] = DocumentParseError,
) -> Iterator[tuple[str, etree._Element]]:
    """`lxml.etree.iterparse` with parse_root's protections, for documents too big to hold.

    Yields (event, element) for `events` ("start", "end") on elements whose tag is in `tag`
    (Clark names; None means every element), as lxml's iterparse does; the caller may clear
    elements it is done with. The stream is screened as it is read: encoding and DTD as in
    parse_root, at most `max_bytes` (default: the Sitemap limit), `max_elements` elements and
    MAX_ATTRIBUTES attributes per element. Raises `error`. Synchronous: async code runs the
    loop that consumes it in a thread.
    """
    wanted = frozenset(events)
    unknown = wanted - {"start", "end"}
    if unknown:
        raise ValueError(f"events must be 'start' and/or 'end', got {sorted(unknown)}")
    tags = None if tag is None else frozenset([tag] if isinstance(tag, str) else tag)
    # Both events from the parser, whatever the caller asked for: elements are counted and
    # checked at their start, before their content is read.
    for batch in iterparse_batches(source, ("start", "end"), max_bytes=max_bytes, max_elements=max_elements,
                                   chunk_size=chunk_size, error=error):
        for event, element in batch:
            if event in wanted and (tags is None or element.tag in tags):
                yield event, element


def iterparse_batches(
    source: IO[bytes],
    events: Sequence[str] = ("end",),
    *,
    max_bytes: int | None = None,
    max_elements: int = MAX_ELEMENTS,
    chunk_size: int = 65_536,
    error: type[DocumentParseError] = DocumentParseError,
) -> Iterator[list[tuple[str, etree._Element]]]:
    """The events of `iterparse`, one list per chunk read, with the same screens and caps.

    For readers of many small elements (a list's entries): one step per chunk instead of one
    generator hop per element, and with `events=("end",)` half the events, which made reading
    a Resource List a quarter cheaper. Every element is counted and its attributes checked at
    the event it has: its start when "start" is asked for, else its end (libxml2 bounds the
    elements open at once to MAX_DEPTH, so a cap is at most that many elements late).
    """
    wanted = tuple(events)
    if not wanted or set(wanted) - {"start", "end"}:
        raise ValueError(f"events must be 'start' and/or 'end', got {sorted(wanted)}")
    counted = "start" if "start" in wanted else "end"
    limit = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    parser = _harden(etree.XMLPullParser(events=wanted, **_PARSER_OPTIONS))
    head = b""
    tail = b""  # the last bytes of the previous chunk: a '<!DOCTYPE' may straddle two reads
    read = 0
    elements = 0
    screened_head = False
    while True:
        chunk = source.read(chunk_size)
        if not chunk:
            break
        if isinstance(chunk, str):  # a text stream: the screens and libxml2 want bytes
            chunk = chunk.encode("utf-8")
        read += len(chunk)
        if read > limit:
            raise error(f"document is more than {limit} bytes; expected at most {limit} bytes")
        if not screened_head:
            head += chunk
            if len(head) < _PROLOG_WINDOW:
                continue
            screen_prolog(head[:_PROLOG_WINDOW], error)
            screened_head = True
            chunk, head = head, b""
        window = tail + chunk
        screen_body(window, error, offset=read - len(window))
        tail = window[-8:]
        _feed(parser, chunk, error)
        elements = yield from _checked_batch(parser, counted, elements, max_elements, error)
    if read == 0:
        raise error("not an XML document: it is empty; expected a <urlset> or <sitemapindex>")
    if not screened_head:
        screen_prolog(head, error)
        screen_body(head, error)
        _feed(parser, head, error)
        elements = yield from _checked_batch(parser, counted, elements, max_elements, error)
    try:
        root = parser.close()
    except (_ExternalReferenceRefused, etree.XMLSyntaxError, ValueError) as exc:
        raise _translate(exc, error) from None
    yield from _checked_batch(parser, counted, elements, max_elements, error)
    if root is None:
        raise error("not an XML document: it is empty; expected a <urlset> or <sitemapindex>")


def _feed(parser: etree.XMLPullParser, chunk: bytes, error: type[DocumentParseError]) -> None:
    try:
        parser.feed(chunk)
    except (_ExternalReferenceRefused, etree.XMLSyntaxError, ValueError) as exc:
        raise _translate(exc, error) from None


def _checked_batch(
    parser: etree.XMLPullParser,
    counted: str,
    elements: int,
    max_elements: int,
    error: type[DocumentParseError],
) -> Generator[list[tuple[str, etree._Element]], None, int]:
    """Yield the events read so far (if any) and return the count; a refused element is
    raised after the events before it, as a stream of single events would."""
    batch, elements, refusal = _checked(parser, counted, elements, max_elements, error)
    if batch:
        yield batch
    if refusal is not None:
        raise refusal
    return elements


def _checked(
    parser: etree.XMLPullParser,
    counted: str,
    elements: int,
    max_elements: int,
    error: type[DocumentParseError],
) -> tuple[list[tuple[str, etree._Element]], int, DocumentParseError | None]:
    """The events read so far, each element counted and its attributes checked on the way:
    (the events before any refused element, the count, the refusal to raise after them)."""
    batch = list(parser.read_events())
    for position, (event, element) in enumerate(batch):
        if event != counted:
            continue
        elements += 1
        if elements > max_elements:
            refusal = error(f"document has more than {max_elements} elements; expected at most {max_elements}")
        elif len(element.attrib) > MAX_ATTRIBUTES:
            refusal = error(
                f"{describe_element(element.tag)} has {len(element.attrib)} attributes; "
                f"expected at most {MAX_ATTRIBUTES}"
            )
        else:
            continue
        return batch[:position], elements, refusal
    return batch, elements, None


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
# \s in a str pattern is str.isspace (Unicode spaces included); plus C0 controls, DEL, the C1
# controls (U+0080-U+009F: U+009B is a terminal's CSI) and the bidirectional formatting
# characters RFC 3987 (4.1) forbids in IRIs (they make a shown loc read as another one)
_SPACES_AND_CONTROLS = r"\s\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069"
_SPACE_OR_CONTROL = re.compile(f"[{_SPACES_AND_CONTROLS}]")
_HTTP_SCHEMES = ("http", "https")
# What almost every loc is, in one match: http(s), "//", a host (not empty: the first character
# after "//" is no "/"), and no space or control character anywhere. It passes every check below.
_PLAIN_HTTP_LOC = re.compile(f"[hH][tT][tT][pP][sS]?://[^/{_SPACES_AND_CONTROLS}][^{_SPACES_AND_CONTROLS}]*")
LOC_EXAMPLE = "http://example.com/res1"


def loc_problem(loc: str, *, http_only: bool = True) -> str | None:
    """Why `loc` cannot be a resource's `<loc>`, or None: it must be an absolute URI without
    spaces or control characters, and (with `http_only`, as the hub and publishers require)
    an http(s) URI with a host. The text reads after "<loc> '...' "."""
    if _PLAIN_HTTP_LOC.fullmatch(loc):
        return None
    if _SPACE_OR_CONTROL.search(loc):
        return f"has a space or control character; expected a URI such as {LOC_EXAMPLE} (spaces as %20)"
    scheme = _SCHEME.match(loc)
    if scheme is None:
        return f"is relative; expected an absolute http(s) URI such as {LOC_EXAMPLE}"
    name = scheme.group()[:-1].lower()
    if name in _HTTP_SCHEMES:
        if not loc[len(name) + 1 :].startswith("//") or len(loc.split("/", 3)[2]) == 0:
            return f"has no host; expected an absolute http(s) URI such as {LOC_EXAMPLE}"
    elif http_only:
        return f"has scheme '{name}'; expected an http(s) URI such as {LOC_EXAMPLE}"
    return None


# Locs joined by "\n" (which no plain loc holds) in one match: a notification's locs checked in
# one regex call instead of one each.
_PLAIN_HTTP_LOCS = re.compile(f"{_PLAIN_HTTP_LOC.pattern}(?:\n{_PLAIN_HTTP_LOC.pattern})*")


def has_loc_problem(locs: Sequence[str]) -> bool:
    """True when loc_problem finds something wrong with any of `locs` (as `<loc>`s, http_only)."""
    joined = "\n".join(locs)
    # as many lines as locs: no loc holds a "\n" of its own, so each line is one loc
    if joined.count("\n") == len(locs) - 1 and _PLAIN_HTTP_LOCS.fullmatch(joined):
        return False
    return any(loc_problem(loc) for loc in locs)


def tag_name(tag: object) -> str:
    """An element name as the spec writes it: `urlset`, `rs:md`, else `{namespace}name`."""
    text = str(tag)
    if text.startswith(f"{{{SITEMAP_NS}}}"):
        return text[len(SITEMAP_NS) + 2 :]
    if text.startswith(f"{{{RS_NS}}}"):
        return "rs:" + text[len(RS_NS) + 2 :]
    return text


def describe_element(tag: object) -> str:
    """`<name>` as in tag_name, saying so when the element has no namespace (a missing xmlns)."""
    text = str(tag)
    return f"<{text}> in no namespace" if not text.startswith("{") else f"<{tag_name(text)}>"


def read_datetime(value: str | None, what: str, problems: list[str]) -> datetime | None:
    """`value` as a datetime, or None (absent, or invalid: then a problem naming `what`)."""
    if value is None:
        return None
    try:
        return parse_w3c_datetime(value)
    except DatetimeError:
        problems.append(f"{what}='{value}'; expected a W3C datetime such as {DATETIME_EXAMPLE}")
        return None


MAX_LENGTH = 2**63 - 1


def read_length(value: str | None, what: str, problems: list[str]) -> int | None:
    if value is None:
        return None
    text = value.strip()
    # at most 19 digits and below 2**63: int() fails past 4,300 digits, and SQLite (the change
    # memory, the sync state) stores no larger integer
    number = int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else -1
    if not 0 <= number <= MAX_LENGTH:
        shown = value if len(value) <= 40 else f"{value[:40]}… ({len(value)} characters)"
        problems.append(f"{what}='{shown}'; expected a non-negative integer (bytes) below 2**63")
        return None
    return number


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def read_media_type(value: str | None, what: str, problems: list[str]) -> str | None:
    """`type`: taken as given (Sources write all sorts), but never with a control character: a
    Destination may put it in a Content-Type header, where CR LF would start a header of its own."""
    if value is not None and _CONTROL.search(value):
        shown = value if len(value) <= 60 else f"{value[:60]}… ({len(value)} characters)"
        problems.append(f"{what}={shown!r}, with a control character; expected a media type such as text/html")
        return None
    return value


def read_hashes(value: str | None, what: str, problems: list[str]) -> tuple[tuple[str, str], ...]:
    """`hash`: a whitespace-separated list of `algorithm:digest` (digests are not forced to be
    hex: core Example 27 uses made-up values, and receivers should be lenient)."""
    if value is None:
        return ()
    pairs: list[tuple[str, str]] = []
    for token in value.split():
        algorithm, _, digest = token.partition(":")
        if not algorithm or not digest:
            problems.append(
                f"{what}='{value}'; expected a whitespace-separated list of algorithm:hexdigest "
                f"such as {_HASH_EXAMPLE}"
            )
            return ()
        pairs.append((algorithm, digest))
    if not pairs:
        problems.append(f"{what}='{value}' is empty; expected algorithm:hexdigest such as {_HASH_EXAMPLE}")
    return tuple(pairs)


def read_link(element: etree._Element, owner: str, problems: list[str]) -> Link | None:
    """An `<rs:ln>` as a Link, or None after adding its problems. `owner` names its parent."""
    attrs = dict(element.items())
    rel = attrs.get("rel", "").strip()
    href = attrs.get("href", "").strip()
    what = f"<rs:ln rel='{rel}'> of {owner}" if rel else f"<rs:ln> of {owner}"
    before = len(problems)
    if not rel:
        problems.append(f"{what} has no rel; expected a relation type such as up, hub or describedby")
    if not href:
        problems.append(f"{what} has no href; expected the URI of the linked resource")
    modified = read_datetime(attrs.get("modified"), f"{what} has modified", problems)
    length = read_length(attrs.get("length"), f"{what} has length", problems)
    hashes = read_hashes(attrs.get("hash"), f"{what} has hash", problems)
    media_type = read_media_type(attrs.get("type"), f"{what} has type", problems)
    pri = None
    if "pri" in attrs:
        text = attrs["pri"].strip()
        if text.isascii() and text.isdigit() and 1 <= int(text) <= 999_999:
            pri = int(text)
        else:
            problems.append(f"{what} has pri='{attrs['pri']}'; expected an integer from 1 to 999999")
    if len(problems) > before:
        return None
    extra = tuple((name, value) for name, value in attrs.items() if name not in _LINK_ATTRIBUTES)
    try:
        return Link(rel, href, media_type, hashes, length, modified, attrs.get("path"), pri, extra)
    except NotificationError as exc:
        problems.append(str(exc))
        return None


def extra_attributes(element: etree._Element, known: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """Attributes the model has no field for, in document order (foreign ones in Clark notation)."""
    return tuple((name, value) for name, value in element.items() if name not in known)


def set_attributes(
    element: etree._Element, pairs: Iterable[tuple[str, str | None]], skip: frozenset[str] = frozenset()
) -> None:
    """Set each non-None pair, except names in `skip` (an `extra` never overrides a modelled field)."""
    for name, value in pairs:
        if value is not None and name not in skip:
            element.set(name, value)


def hash_text(hashes: tuple[tuple[str, str], ...]) -> str | None:
    return " ".join(f"{algorithm}:{digest}" for algorithm, digest in hashes) or None


def optional_datetime(value: datetime | None) -> str | None:
    return None if value is None else format_datetime(value)


def optional_int(value: int | None) -> str | None:
    return None if value is None else str(value)


def link_attributes(link: Link) -> list[tuple[str, str | None]]:
    """An <rs:ln>'s attributes in document order: the modelled fields (None where unset), then the
    extras the model has no field for (an extra never overrides a modelled field)."""
    pairs = [
        ("rel", link.rel),
        ("href", link.href),
        ("type", link.media_type),
        ("hash", hash_text(link.hashes)),
        ("length", optional_int(link.length)),
        ("modified", optional_datetime(link.modified)),
        ("path", link.path),
        ("pri", optional_int(link.pri)),
    ]
    return pairs + [(name, value) for name, value in link.extra if name not in _LINK_ATTRIBUTES]


def write_link(parent: etree._Element, link: Link) -> etree._Element:
    element = etree.SubElement(parent, RS_LN)
    set_attributes(element, link_attributes(link))
    return element


def new_root(tag: str = URLSET) -> etree._Element:
    """A root element with the sitemap namespace as default and `rs` bound to the rs namespace."""
    return etree.Element(tag, nsmap=NSMAP)  # type: ignore[arg-type]


_DECLARATION = b'<?xml version="1.0" encoding="UTF-8"?>\n'


def serialize(root: etree._Element, *, pretty: bool = False) -> bytes:
    """UTF-8 bytes with an XML declaration (written by hand only for its double quotes).

    `pretty` indents: for documents people edit by hand (Capability Lists, Source
    Descriptions); notifications stay compact, since they are machine traffic.
    """
    if pretty:
        etree.indent(root, space="  ")
    return _DECLARATION + etree.tostring(root, encoding="UTF-8", xml_declaration=False)

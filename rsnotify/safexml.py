"""The one safe XML parser, the namespaces, and readers/writers for shared pieces (`rs:ln`,
attribute syntax) used by every document kind.

Safety: no DTD (a document with one is refused), no entity expansion, no network, bounded
size; depth is bounded by libxml2 itself (256 levels without XML_PARSE_HUGE, which we never
set). Elements are matched by namespace URI, never by prefix. No I/O here.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime

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

_LINK_ATTRIBUTES = frozenset({"rel", "href", "type", "hash", "length", "modified", "path", "pri"})
_HASH_EXAMPLE = "md5:1584abdf8ebdc9802ac0c6a7402c03b6"

_local = threading.local()  # lxml parser objects must not be shared between threads


def _parser() -> etree.XMLParser:
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = etree.XMLParser(
            resolve_entities=False,
            no_network=True,
            dtd_validation=False,
            load_dtd=False,
            huge_tree=False,
            remove_comments=True,
            remove_pis=True,
            collect_ids=False,
        )
        _local.parser = parser
    return parser


def parse_root(
    data: bytes | bytearray | memoryview | str,
    *,
    max_bytes: int | None = None,
    error: type[DocumentParseError] = DocumentParseError,
) -> etree._Element:
    """The root element of `data`, parsed safely; raises `error` when it is not safe, well-formed XML.

    A `str` is encoded as UTF-8 first. `max_bytes` defaults to the Sitemap limit.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    elif not isinstance(data, bytes):  # bytearray, memoryview: lxml wants bytes
        data = bytes(data)
    limit = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    if len(data) > limit:
        raise error(f"document is {len(data)} bytes; expected at most {limit} bytes")
    # Refused before parsing, so no internal subset (billion laughs, XXE) is ever read. A
    # '<!DOCTYPE' in a comment is refused too: no valid ResourceSync document needs one.
    if b"<!DOCTYPE" in data:
        raise error("document has a DTD (<!DOCTYPE ...>); expected none: DTDs and entities are refused")
    try:
        root = etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as exc:
        raise error(f"not well-formed XML: {exc}") from exc
    except ValueError as exc:  # lxml: e.g. empty or unsupported input
        raise error(f"not an XML document: {exc}") from exc
    if root is None:
        raise error("not an XML document: it is empty; expected a <urlset> or <sitemapindex>")
    docinfo = root.getroottree().docinfo
    # Catches a DTD in another encoding (UTF-16) that the byte scan above cannot see.
    if docinfo.doctype or docinfo.internalDTD is not None or docinfo.externalDTD is not None:
        raise error("document has a DTD (<!DOCTYPE ...>); expected none: DTDs and entities are refused")
    return root


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


def read_length(value: str | None, what: str, problems: list[str]) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        problems.append(f"{what}='{value}'; expected a non-negative integer (bytes)")
        return None
    return int(text)


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
        return Link(rel, href, attrs.get("type"), hashes, length, modified, attrs.get("path"), pri, extra)
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


def write_link(parent: etree._Element, link: Link) -> etree._Element:
    element = etree.SubElement(parent, RS_LN)
    set_attributes(
        element,
        (
            ("rel", link.rel),
            ("href", link.href),
            ("type", link.media_type),
            ("hash", hash_text(link.hashes)),
            ("length", optional_int(link.length)),
            ("modified", optional_datetime(link.modified)),
            ("path", link.path),
            ("pri", optional_int(link.pri)),
        ),
    )
    set_attributes(element, link.extra, _LINK_ATTRIBUTES)
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

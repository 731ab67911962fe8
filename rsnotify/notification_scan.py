"""The values of a usual change notification, found in its bytes without building a tree.

The hub reads every publish. lxml's parse and the walk over its tree cost ~45 us of the ~160 us
a publish takes in the web process on the bench machine, and about 75 us there with the caches
that the other processes leave cold. Most notifications have one shape, the one rsnotify's
to_xml, the bench and common serializers write: an optional UTF-8 declaration, <urlset> with
its two namespace declarations, <rs:ln> links, one <rs:md>, then <url> entries of one <loc>
and one <rs:md>, with nothing but whitespace between the tags.

scan_notification matches exactly that shape: a fixed skeleton whose only variable parts are
attribute values and loc texts drawn from a class that holds no markup (<, >, &), no quote and
no character XML refuses or rewrites (every C0 control, so also tab, CR and LF, which a parser
turns into spaces in attribute values and normalizes in text; U+FFFE, U+FFFF), in a document
that is valid UTF-8. Such a document is well-formed XML, and lxml would give exactly the values
matched here: no entity, comment, CDATA section, DTD or processing instruction can be in it.
Anything else is None, and the caller parses the document with rsnotify.safexml, which reads
every other form and words every problem. Only the shape is checked here; the values are held
to the rules by rsnotify.xml, as it does for a parsed tree.
"""
from __future__ import annotations

import re
from datetime import datetime

from .safexml import DEFAULT_MAX_BYTES, MAX_ELEMENTS, MAX_ENTRIES, RS_NS, SITEMAP_NS, has_loc_problem

_WS = r"[ \t\r\n]*"
# An attribute value in double quotes, or a loc's text: nothing a parser would read otherwise,
# and far below libxml2's cap on one text or value (10 MB without XML_PARSE_HUGE), which a
# longer one could pass here and fail there.
_LONGEST = 16384
_VALUE = rf'"([^"<>&\x00-\x1f\ufffe\uffff]{{0,{_LONGEST}}})"'
_TEXT = rf"([^<>&\x00-\x1f\ufffe\uffff]{{0,{_LONGEST}}})"
_END = r" ?/>"

_HEAD = re.compile(
    r"(?:<\?xml version=(?:\"1\.0\"|'1\.0')(?: encoding=(?:\"(?:UTF|utf)-8\"|'(?:UTF|utf)-8'))? ?\?>)?" + _WS
    + "(?:" + re.escape(f'<urlset xmlns="{SITEMAP_NS}" xmlns:rs="{RS_NS}">')
    + "|" + re.escape(f'<urlset xmlns:rs="{RS_NS}" xmlns="{SITEMAP_NS}">') + ")"
)
_LINK = re.compile(_WS + r"<rs:ln (rel|href)=" + _VALUE + r" (rel|href)=" + _VALUE + _END)
_URLSET_MD = re.compile(_WS + "<rs:md capability=" + _VALUE + " from=" + _VALUE + " until=" + _VALUE + _END)
_URL = re.compile(
    _WS + "<url>" + _WS + "<loc>" + _TEXT + "</loc>" + _WS + "<rs:md change=" + _VALUE
    + "(?: datetime=" + _VALUE + ")?(?: hash=" + _VALUE + ")?(?: length=" + _VALUE + ")?(?: type=" + _VALUE + ")?"
    + _END + _WS + "</url>"
)
_TAIL = re.compile(_WS + "</urlset>" + _WS + r"\Z")

# (capability, from, until), the links' (rel, href), the entries' (loc text, change, datetime,
# hash, length, type): strings as written, None for an absent attribute
Links = list[tuple[str, str]]
Entry = tuple[str, str, "str | None", "str | None", "str | None", "str | None"]
Found = tuple[tuple[str, str, str], Links, list[Entry]]


def scan_notification(data: bytes, max_bytes: int | None = None) -> Found | None:
    """The values of `data` when it is a change notification of the usual shape (see the module),
    at most `max_bytes` long (default: the Sitemap limit) and within the element cap; else None."""
    if len(data) > (DEFAULT_MAX_BYTES if max_bytes is None else max_bytes):
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    head = _HEAD.match(text)
    if head is None:
        return None
    position = head.end()
    links: Links = []
    while link := _LINK.match(text, position):
        first, first_value, second, second_value = link.groups()
        if first == second:
            return None
        links.append((first_value, second_value) if first == "rel" else (second_value, first_value))
        position = link.end()
    md = _URLSET_MD.match(text, position)
    if md is None:
        return None
    position = md.end()
    entries: list[Entry] = []
    match_url = _URL.match
    while url := match_url(text, position):
        entries.append(url.groups())    # type: ignore[arg-type]
        position = url.end()
    if _TAIL.match(text, position) is None or 2 + len(links) + 3 * len(entries) > MAX_ELEMENTS:
        return None
    return md.groups(), links, entries     # type: ignore[return-value]


# -- a verdict without the values ----------------------------------------------------------
# The hub only needs to know that a publish is valid (it relays the body as sent), and most are
# of the usual shape with every value in its usual form too. One regular expression holds such a
# document to the shape and every value to a form the full reading accepts, in C; what is left
# for Python is the order of the datetimes (strings of one fixed form sort as the instants do),
# the day of the month past the 28th, and the locs (one match over all of them).

# a value with nothing a parser reads otherwise and nothing that strip() would take off:
# visible ASCII without a quote, <, > or &
_PLAIN = r"[!#-%'-;=?-~]"
_STAMP = r"(?!0000)\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\dZ"
_STRICT_VALUE = rf'"{_PLAIN}{{1,{_LONGEST}}}"'
_STRICT_ENTRY = (
    _WS + "<url>" + _WS + f"<loc>{_PLAIN}{{1,{_LONGEST}}}</loc>" + _WS
    + '<rs:md change="(?:created|updated|deleted)"'
    + f'(?: datetime="{_STAMP}")?'
    + rf'(?: hash="[!#-%\'-9;=?-~]{{1,{_LONGEST}}}:{_PLAIN}{{1,{_LONGEST}}}")?'
    + r'(?: length="\d{1,18}")?'
    + rf'(?: type="[ !#-%\'-;=?-~]{{0,{_LONGEST}}}")?'
    + _END + _WS + "</url>"
)
_STRICT = re.compile(
    _HEAD.pattern
    + "(?:" + _WS + "<rs:ln (?:rel=" + _STRICT_VALUE + " href=" + _STRICT_VALUE + "|href=" + _STRICT_VALUE
    + " rel=" + _STRICT_VALUE + ")" + _END + ")*+"
    + _WS + f'<rs:md capability="change-notification" from="({_STAMP})" until="({_STAMP})"' + _END
    + "(?:" + _STRICT_ENTRY + ")*+"
    + _TAIL.pattern,
    re.ASCII,
)
_LOCS = re.compile(r"<loc>([^<]*)</loc>")
_DATETIMES = re.compile(r' datetime="([^"]*)"')


def is_valid_usual_notification(data: bytes, latest: str) -> bool:
    """True when `data` is a change notification of the usual shape with every value in its usual
    form (datetimes as UTC whole seconds, as `latest` is) that parse_notification reads without a
    problem, dated no later than `latest`. False says only that this quick look cannot tell: the
    caller then reads the document the full way, which words every problem."""
    if len(data) > DEFAULT_MAX_BYTES or not data.isascii():
        return False
    text = data.decode("ascii")
    document = _STRICT.fullmatch(text)
    if document is None:
        return False
    from_text, until_text = document.groups()
    stamps = _DATETIMES.findall(text)
    locs = _LOCS.findall(text)
    if len(locs) > MAX_ENTRIES or 2 + text.count("<rs:ln ") + 3 * len(locs) > MAX_ELEMENTS:
        return False
    if not from_text <= until_text <= latest:
        return False
    if stamps and not (from_text <= stamps[0] and stamps[-1] <= until_text and stamps == sorted(stamps)):
        return False
    for stamp in (from_text, until_text, *stamps):
        if stamp[8:10] > "28" and not _is_a_day(stamp):
            return False
    return not has_loc_problem(locs)


def _is_a_day(stamp: str) -> bool:
    """Whether the 29th, 30th or 31st in `stamp` is in its month (February 29th in leap years)."""
    try:
        datetime.fromisoformat(stamp)
    except ValueError:
        return False
    return True

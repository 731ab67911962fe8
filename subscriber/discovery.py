"""Discovery: from a URL to the topic to subscribe to and the hub(s) that serve it.

Three starting points:
- a Source's base URL: /.well-known/resourcesync -> Source Description -> Capability Lists ->
  the change-notification entry (topic = <loc>, hubs = <rs:ln rel="hub">);
- a Capability List URL: the same, from its entry;
- any WebSub topic URL: Link headers first, then <link> in an HTML <head>, then Atom/RSS
  links; redirects are followed and the final rel="self" is the topic (WebSub §4, S-01..S-04).

Each public function takes `(url, session=None)`: without a session one is opened for the call.
`discover(url)` tries the three in turn.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import TypeVar
from urllib.parse import urljoin, urlsplit

import aiohttp
from lxml import etree

from rsnotify.bodies import bounded_chunks, head_within
from rsnotify.errors import DocumentParseError, ValidationError, WireError
from rsnotify.neterrors import describe_client_error
from rsnotify.notification import (
    CAPABILITY_LIST,
    CHANGE_NOTIFICATION,
    LEGACY_CHANGE_NOTIFICATION,
)
from rsnotify.safexml import (
    LOC,
    RS_LN,
    RS_MD,
    SITEMAP,
    SITEMAPINDEX,
    URL,
    URLSET,
    parse_in_thread,
    parse_root,
)
from rsnotify.websub import links_by_rel, parse_link_header
from rsnotify.xml import parse_capability_list, parse_source_description

from .errors import DiscoveryError

log = logging.getLogger(__name__)

WELL_KNOWN = "/.well-known/resourcesync"
ATOM_NS = "http://www.w3.org/2005/Atom"
MAX_DOCUMENT_BYTES = 52_428_800  # a Sitemap document is at most 50 MiB
MAX_REDIRECTS = 10
_CHANNEL_CAPABILITIES = (CHANGE_NOTIFICATION, LEGACY_CHANGE_NOTIFICATION)
T = TypeVar("T")


@dataclass(frozen=True)
class DiscoveredTopic:
    """A topic to subscribe to, the hubs that serve it, and where that was found."""

    topic: str
    hubs: tuple[str, ...]
    found_in: str                        # link-header, html, atom, rss or capability-list
    url: str                             # the URL that was fetched (after redirects)
    capability_list: str | None = None   # the Capability List that advertised it, if any
    discovered_from: str | None = None   # where to discover it again when renewing
    discovery: str | None = None         # how: "topic" or "capability-list"


class DiscoveryNotFoundError(DiscoveryError):
    """The URL answered, but with 404/410: a wrong address, not an outage."""


class DiscoveryUnreachableError(DiscoveryError):
    """No answer (connection, timeout) or a server error (5xx, 429): try again later."""


@dataclass(frozen=True)
class _Fetched:
    url: str                 # final URL, after redirects
    status: int
    content_type: str
    link_headers: tuple[str, ...]
    body: bytes


async def _fetch(session: aiohttp.ClientSession, url: str, what: str) -> _Fetched:
    """GET `url` following redirects (S-04); DiscoveryError unless the final answer is 200."""
    # a head or a body dripped a byte at a time would hold `sync`'s start for hours (bodies.py)
    window = session.timeout.sock_read
    try:
        answer = await head_within(session.get(url, allow_redirects=True, max_redirects=MAX_REDIRECTS),
                                   MAX_REDIRECTS, window)
        async with answer as response:
            if response.content_length is not None and response.content_length > MAX_DOCUMENT_BYTES:
                raise DiscoveryError(f"{what} at {url} is {response.content_length} bytes; "
                                     f"expected at most {MAX_DOCUMENT_BYTES}")
            body = await read_bounded(response, MAX_DOCUMENT_BYTES, f"{what} at {url}", window=window)
            fetched = _Fetched(str(response.url), response.status, response.headers.get("Content-Type", ""),
                               tuple(response.headers.getall("Link", [])), body)
    except aiohttp.TooManyRedirects as exc:
        raise DiscoveryError(f"{what} at {url} redirected more than {MAX_REDIRECTS} times") from exc
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise DiscoveryUnreachableError(f"cannot fetch {what} at {url}: {describe_client_error(exc)}") from exc
    if fetched.status in (404, 410):
        raise DiscoveryNotFoundError(f"{what} not found at {fetched.url} (answered {fetched.status}; expected 200)")
    if fetched.status >= 500 or fetched.status == 429:
        raise DiscoveryUnreachableError(f"{what} at {url} answered {fetched.status}; expected 200")
    if fetched.status != 200:
        raise DiscoveryError(f"{what} at {url} answered {fetched.status}; expected 200")
    return fetched


def _url_first(func: Callable[[aiohttp.ClientSession, str], Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Public signature `(url, session=None)` for a function of (session, url). The
    (session, url) order of earlier versions keeps working."""

    @functools.wraps(func)
    async def wrapper(url: str, session: aiohttp.ClientSession | None = None) -> T:
        if isinstance(url, aiohttp.ClientSession):
            url, session = session, url  # type: ignore[assignment]
        if not isinstance(url, str):
            raise TypeError(f"{func.__name__}(url, session=None) needs a URL string, got {type(url).__name__}")
        if session is None:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as own:
                return await func(own, url)
        return await func(session, url)

    return wrapper


async def discover(url: str, session: aiohttp.ClientSession | None = None) -> list[DiscoveredTopic]:
    """The channel(s) at `url`, whatever it is: a WebSub topic, a Capability List, or a Source
    (base URL or its /.well-known/resourcesync). DiscoveryError says what each attempt found."""
    if urlsplit(url).path.endswith(WELL_KNOWN):
        return await discover_source(url, session)
    problems = []
    for kind, attempt in (("a topic", discover_topic), ("a Capability List", discover_capability_list),
                          ("a Source", discover_source)):
        try:
            found = await attempt(url, session)
        except DiscoveryError as exc:
            problems.append(f"as {kind}: {exc}")
            continue
        return found if isinstance(found, list) else [found]
    raise DiscoveryError(f"no change-notification channel found from {url}: " + "; ".join(problems))


async def read_bounded(response: aiohttp.ClientResponse, limit: int, what: str, *,
                       window: float | None = None) -> bytes:
    """The whole body, read to its end (StreamReader.read(n) stops at what is buffered, often
    64 KiB); DiscoveryError past `limit` bytes; too slow (a TimeoutError) under the
    bodies.MIN_RATE floor over windows of `window` seconds."""
    def too_large(size: int) -> DiscoveryError:
        return DiscoveryError(f"{what} is larger than {limit} bytes; expected at most {limit}")

    return b"".join([chunk async for chunk in bounded_chunks(response, limit, too_large, window=window)])


# --- plain WebSub discovery --------------------------------------------------------------

@_url_first
async def discover_topic(session: aiohttp.ClientSession, url: str) -> DiscoveredTopic:
    """The hub(s) and self URL of the topic at `url` (WebSub §4).

    Link headers win over links in the body (S-03); the final response's rel=self is the
    topic, else the final URL. Raises DiscoveryError when no hub is advertised.
    """
    fetched = await _fetch(session, url, "topic")
    try:
        header_links = parse_link_header(fetched.link_headers)
    except WireError as exc:
        log.warning("ignored a malformed Link header at %s: %s", fetched.url, exc)
        header_links = []
    hubs = [urljoin(fetched.url, href) for href in links_by_rel(header_links, "hub")]
    selfs = [urljoin(fetched.url, href) for href in links_by_rel(header_links, "self")]
    found_in = "link-header"
    if not hubs or not selfs:
        kind, body_links = await _body_links(fetched)
        body_hubs = [urljoin(fetched.url, h) for rel, h in body_links if rel == "hub"]
        body_selfs = [urljoin(fetched.url, h) for rel, h in body_links if rel == "self"]
        if not hubs and body_hubs:
            hubs, found_in = body_hubs, kind
        if not selfs:
            selfs = body_selfs
    if not hubs:
        raise DiscoveryError(
            f"no hub advertised at {fetched.url}: no Link header with rel=\"hub\", and the body "
            f"({fetched.content_type or 'no Content-Type'}) has no hub link in an HTML <head>, Atom or RSS feed"
        )
    return DiscoveredTopic(topic=selfs[0] if selfs else fetched.url, hubs=tuple(dict.fromkeys(hubs)),
                           found_in=found_in, url=fetched.url, discovered_from=url, discovery="topic")


async def _body_links(fetched: _Fetched) -> tuple[str, list[tuple[str, str]]]:
    """('html'|'atom'|'rss', [(rel, href), ...]) found in the body, or ('', [])."""
    media_type = fetched.content_type.split(";")[0].strip().lower()
    head = fetched.body.lstrip()[:512].lower()
    if media_type in ("text/html", "application/xhtml+xml") or head.startswith((b"<!doctype html", b"<html")):
        return "html", _html_head_links(fetched.body, fetched.url)
    if "xml" in media_type or head.startswith((b"<?xml", b"<feed", b"<rss")):
        return await _feed_links(fetched.body)
    return "", []


class _HeadLinks(HTMLParser):
    """Collects <link rel href> from an HTML <head> only (S-02); <base href> is honoured."""

    def __init__(self, url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base = url
        self.links: list[tuple[str, str]] = []
        self.done = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.done:
            return
        values = {name: value or "" for name, value in attrs}
        if tag == "body":
            self.done = True
        elif tag == "base" and values.get("href"):
            self.base = urljoin(self.base, values["href"])
        elif tag == "link" and values.get("href"):
            for rel in values.get("rel", "").lower().split():
                self.links.append((rel, urljoin(self.base, values["href"].strip())))

    def handle_endtag(self, tag: str) -> None:
        if tag == "head":
            self.done = True


def _html_head_links(body: bytes, url: str) -> list[tuple[str, str]]:
    parser = _HeadLinks(url)
    parser.feed(body.decode("utf-8", errors="replace"))
    parser.close()
    return parser.links


async def _feed_links(body: bytes) -> tuple[str, list[tuple[str, str]]]:
    try:
        root = await parse_in_thread(parse_root, body)
    except DocumentParseError as exc:
        log.warning("topic body is not well-formed XML: %s", exc)
        return "", []
    atom_link = f"{{{ATOM_NS}}}link"
    if root.tag == f"{{{ATOM_NS}}}feed":
        kind, parent = "atom", root
    elif root.tag == "rss" and (channel := root.find("channel")) is not None:
        kind, parent = "rss", channel
    else:
        return "", []
    links = [(rel, (link.get("href") or "").strip())
             for link in parent.iterchildren(atom_link)
             for rel in (link.get("rel") or "").lower().split() if link.get("href")]
    return kind, links


# --- ResourceSync discovery ---------------------------------------------------------------

@_url_first
async def discover_capability_list(session: aiohttp.ClientSession, url: str) -> list[DiscoveredTopic]:
    """The change-notification channels a Capability List advertises (CN §5)."""
    fetched = await _fetch(session, url, "Capability List")
    entries = await _capability_list_entries(fetched)
    channels = []
    for loc, capability, hubs in entries:
        if capability not in _CHANNEL_CAPABILITIES:
            continue
        if not hubs:
            log.warning("change-notification channel %s in %s has no <rs:ln rel=\"hub\">", loc, fetched.url)
            continue
        channels.append(_channel(fetched.url, urljoin(fetched.url, loc), hubs))
    if not channels:
        raise DiscoveryError(
            f"Capability List {fetched.url} advertises no change-notification channel with a hub; "
            f"expected a <url> with <rs:md capability=\"{CHANGE_NOTIFICATION}\"/> and <rs:ln rel=\"hub\" href=...>"
        )
    return channels


@_url_first
async def discover_source(session: aiohttp.ClientSession, base_url: str) -> list[DiscoveredTopic]:
    """Every change-notification channel of the Source at `base_url` (core §8, CN §5)."""
    description_url, capability_lists = await source_capability_lists(session, base_url)
    channels: list[DiscoveredTopic] = []
    problems: list[str] = []
    for capability_list in capability_lists:
        try:
            channels.extend(await discover_capability_list(session, capability_list))
        except DiscoveryError as exc:
            problems.append(str(exc))
    if not channels:
        detail = "; ".join(problems) if problems else "it lists no Capability List"
        raise DiscoveryError(f"no change-notification channel found from Source Description {description_url}: {detail}")
    return channels


def source_description_url(base_url: str) -> str:
    """`base_url` itself when it names the well-known document, else the Source's well-known URL."""
    return base_url if urlsplit(base_url).path.endswith(WELL_KNOWN) else urljoin(base_url, WELL_KNOWN)


async def source_capability_lists(session: aiohttp.ClientSession, base_url: str) -> tuple[str, list[str]]:
    """(the Source Description URL, the absolute URLs of its Capability Lists).

    A Source Description Index (a `<sitemapindex>` of Source Descriptions, core §8) is
    followed one level down.
    """
    fetched = await _fetch(session, source_description_url(base_url), "Source Description")
    root = await _root_or_error(fetched, "Source Description")
    if root.tag == SITEMAPINDEX:
        capability_lists: list[str] = []
        for sitemap in root.iterchildren(SITEMAP):
            loc = (sitemap.findtext(LOC) or "").strip()
            if not loc:
                continue
            part = await _fetch(session, urljoin(fetched.url, loc), "Source Description")
            capability_lists.extend(await _capability_lists_of(part))
        return fetched.url, capability_lists
    return fetched.url, await _capability_lists_of(fetched)


@dataclass(frozen=True)
class FoundSource:
    """Where `find_source` found the Source, and the Capability Lists to sync from."""

    url: str                       # the Source Description or Capability List found
    kind: str                      # "description" or "capabilitylist"
    capability_lists: tuple[str, ...]
    tried: tuple[str, ...]         # what was looked at before it, and why it was passed over


async def find_source(session: aiohttp.ClientSession, url: str) -> FoundSource:
    """The Source at `url`, tried in order: `url` itself when it is a Source Description or
    Capability List, `url/.well-known/resourcesync`, `url/sourcedescription.xml`, then the
    host root's well-known. A Source Description found for a URL with a path must list
    Capability Lists under that path (the others are passed over; none left: refused).

    Raises DiscoveryNotFoundError when no place holds a Source (404/410, another refusal such
    as a folder's 403, or a document that is not a Source Description or Capability List),
    DiscoveryUnreachableError when the host cannot be reached, DiscoveryError when what was
    found is refused.
    """
    parts = urlsplit(url)
    folder = url if url.endswith("/") else url + "/"
    root_well_known = urljoin(url, WELL_KNOWN)
    candidates = [url] if parts.path.endswith(WELL_KNOWN) else \
        [url, urljoin(folder, WELL_KNOWN.lstrip("/")), urljoin(folder, "sourcedescription.xml"), root_well_known]
    tried: list[str] = []
    for position, candidate in enumerate(dict.fromkeys(candidates)):
        try:
            fetched = await _fetch(session, candidate, "Source Description")
        except DiscoveryNotFoundError:
            tried.append(f"not found at {candidate}")
            continue
        except DiscoveryUnreachableError:
            raise
        except DiscoveryError as exc:
            # e.g. a web server's 403 for a folder URL without an index: not the Source, look on
            tried.append(str(exc))
            continue
        kind = await _document_kind(fetched)
        if kind not in ("description", "capabilitylist"):
            tried.append(f"{candidate} is not a Source Description or Capability List")
            continue
        if kind == "capabilitylist":
            return FoundSource(fetched.url, kind, (fetched.url,), tuple(tried))
        lists = await _description_lists(session, fetched)
        if position > 0 and parts.path not in ("", "/"):
            lists = _within(url, folder, fetched.url, lists)
        return FoundSource(fetched.url, kind, tuple(lists), tuple(tried))
    raise DiscoveryNotFoundError(f"no Source found for {url}: " + "; ".join(tried))


async def _document_kind(fetched: _Fetched) -> str | None:
    """The `capability` of a ResourceSync document's `<rs:md>` ("description", ...), else None."""
    try:
        root = await parse_in_thread(parse_root, fetched.body)
    except DocumentParseError:
        return None
    if root.tag not in (URLSET, SITEMAPINDEX):
        return None
    md = root.find(RS_MD)
    return md.get("capability") if md is not None else None


async def _description_lists(session: aiohttp.ClientSession, fetched: _Fetched) -> list[str]:
    """The Capability Lists of a fetched Source Description (an index is followed one level)."""
    root = await _root_or_error(fetched, "Source Description")
    if root.tag != SITEMAPINDEX:
        return await _capability_lists_of(fetched)
    capability_lists: list[str] = []
    for sitemap in root.iterchildren(SITEMAP):
        loc = (sitemap.findtext(LOC) or "").strip()
        if loc:
            part = await _fetch(session, urljoin(fetched.url, loc), "Source Description")
            capability_lists.extend(await _capability_lists_of(part))
    return capability_lists


def _within(url: str, folder: str, description: str, lists: list[str]) -> list[str]:
    """The Capability Lists under `folder` (same scheme, host, port and path prefix); a
    DiscoveryError naming them when none is."""
    inside = [item for item in lists if item.startswith(folder)]
    if lists and not inside:
        raise DiscoveryError(f"the Source Description {description} lists no Capability List under {url}: "
                             f"{', '.join(lists)} lie outside it; refused (give one with --capability-list)")
    return inside


async def _root_or_error(fetched: _Fetched, what: str) -> etree._Element:
    try:
        return await parse_in_thread(parse_root, fetched.body)
    except DocumentParseError as exc:
        raise DiscoveryError(f"{fetched.url} is not a {what}: {exc}") from exc


async def _capability_lists_of(fetched: _Fetched) -> list[str]:
    try:
        locs = (await parse_in_thread(parse_source_description, fetched.body)).capability_lists
    except ValidationError as exc:
        log.warning("Source Description %s breaks the spec: %s", fetched.url, "; ".join(exc.problems))
        locs = [loc for loc, capability, _ in await _lenient_entries(fetched.body, fetched.url)
                if capability in (None, CAPABILITY_LIST)]
    except DocumentParseError as exc:
        raise DiscoveryError(f"{fetched.url} is not a Source Description: {exc}") from exc
    return [urljoin(fetched.url, loc) for loc in locs]


@dataclass(frozen=True)
class SourceCapabilities:
    """What one Capability List offers a Destination that keeps a copy (core §9, CN §5)."""

    capability_list: str                     # its URL (after redirects)
    resourcelist: str | None = None          # a Resource List or Resource List Index
    changelist: str | None = None            # a Change List or Change List Index
    changelist_archive: str | None = None
    channels: tuple[DiscoveredTopic, ...] = ()


async def discover_capabilities(session: aiohttp.ClientSession, url: str) -> SourceCapabilities:
    """Every capability of the Capability List at `url` that sync uses; DiscoveryError when it
    cannot be fetched or read."""
    fetched = await _fetch(session, url, "Capability List")
    entries = await _capability_list_entries(fetched)
    found: dict[str, str] = {}
    channels = []
    for loc, capability, hubs in entries:
        absolute = urljoin(fetched.url, loc)
        if capability in _CHANNEL_CAPABILITIES:
            if hubs:
                channels.append(_channel(fetched.url, absolute, hubs))
            else:
                log.warning("change-notification channel %s in %s has no <rs:ln rel=\"hub\">", loc, fetched.url)
        elif capability and capability not in found:
            found[capability] = absolute
    return SourceCapabilities(fetched.url, found.get("resourcelist"), found.get("changelist"),
                              found.get("changelist-archive"), tuple(channels))


async def _capability_list_entries(fetched: _Fetched) -> list[tuple[str, str | None, tuple[str, ...]]]:
    """(loc, capability, hub hrefs) of every entry of a fetched Capability List."""
    try:
        return [(entry.loc, entry.capability, tuple(entry.links_with("hub")))
                for entry in (await parse_in_thread(parse_capability_list, fetched.body)).entries]
    except ValidationError as exc:
        # Postel: a list that breaks a rule unrelated to the channel (say, no rel="up") still
        # names the channel; read it leniently and say what was wrong.
        log.warning("Capability List %s breaks the spec: %s", fetched.url, "; ".join(exc.problems))
        return await _lenient_entries(fetched.body, fetched.url)
    except DocumentParseError as exc:
        raise DiscoveryError(f"{fetched.url} is not a Capability List: {exc}") from exc


def _channel(capability_list: str, topic: str, hubs: tuple[str, ...]) -> DiscoveredTopic:
    """A channel advertised by the Capability List at `capability_list` (hub hrefs made absolute)."""
    return DiscoveredTopic(
        topic=topic, hubs=tuple(urljoin(capability_list, h) for h in hubs), found_in="capability-list",
        url=capability_list, capability_list=capability_list, discovered_from=capability_list,
        discovery="capability-list",
    )


async def _lenient_entries(body: bytes, url: str) -> list[tuple[str, str | None, tuple[str, ...]]]:
    """(loc, capability, hub hrefs) of every <url> entry, without the spec's other rules."""
    try:
        root = await parse_in_thread(parse_root, body)
    except DocumentParseError as exc:
        raise DiscoveryError(f"{url} is not a ResourceSync document: {exc}") from exc
    if root.tag != URLSET:
        raise DiscoveryError(f"{url} has root <{etree.QName(root).localname}>; expected a Sitemap <urlset>")
    entries = []
    for url_element in root.iterchildren(URL):
        loc = (url_element.findtext(LOC) or "").strip()
        md = url_element.find(RS_MD)
        hubs = tuple(ln.get("href", "") for ln in url_element.iterchildren(RS_LN)
                     if ln.get("rel") == "hub" and ln.get("href"))
        if loc:
            entries.append((loc, md.get("capability") if md is not None else None, hubs))
    return entries

"""Any ResourceSync document: what it is and which rules it breaks (for `rsnotify validate`).

Change notifications, Capability Lists and Source Descriptions go through their full readers
in `rsnotify.xml`; the other core documents (Resource/Change Lists, Dumps, Manifests, their
indexes, framework notifications) get the core spec's structural and attribute checks. No I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from lxml import etree

from .errors import DocumentParseError, ValidationError
from .notification import (
    CAPABILITY_LIST,
    CHANGE_NOTIFICATION,
    LEGACY_CHANGE_NOTIFICATION,
    SOURCE_DESCRIPTION,
    CapabilityList,
    ChangeNotification,
    ChangeType,
    ResourceChange,
    SourceDescription,
    change_order_problems,
)
from .safexml import (
    LASTMOD,
    LOC,
    MAX_ENTRIES,
    RS_LN,
    RS_MD,
    SITEMAP,
    SITEMAP_NS,
    SITEMAPINDEX,
    URL,
    URLSET,
    parse_root,
    read_datetime,
    read_hashes,
    read_length,
    read_link,
    describe_element,
    loc_problem,
    tag_name,
)
from .xml import read_capability_list, read_notification, read_source_description

FRAMEWORK_NOTIFICATION = "framework-notification"

# capability -> the spec's name for the document (an index adds " Index")
DOCUMENT_NAMES = {
    CHANGE_NOTIFICATION: "change notification",
    LEGACY_CHANGE_NOTIFICATION: "change notification",
    CAPABILITY_LIST: "Capability List",
    SOURCE_DESCRIPTION: "Source Description",
    "resourcelist": "Resource List",
    "changelist": "Change List",
    "resourcedump": "Resource Dump",
    "changedump": "Change Dump",
    "resourcedump-manifest": "Resource Dump Manifest",
    "changedump-manifest": "Change Dump Manifest",
    FRAMEWORK_NOTIFICATION: "framework notification",
}
_NEEDS_AT = frozenset({"resourcelist", "resourcedump", "resourcedump-manifest"})
_NEEDS_FROM = frozenset({"changelist", "changedump", "changedump-manifest"})
_NEEDS_CHANGE = frozenset({"changelist", "changedump-manifest", FRAMEWORK_NOTIFICATION})
_NO_INDEX = frozenset({CHANGE_NOTIFICATION, LEGACY_CHANGE_NOTIFICATION, CAPABILITY_LIST, FRAMEWORK_NOTIFICATION})
_CHANGE_VALUES = {change.value: change for change in ChangeType}

Model = ChangeNotification | CapabilityList | SourceDescription


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    """A document's kind, size and verdict: `problems` empty means it follows the rules checked.

    `notes` are remarks that do not make it invalid (a legacy capability, a superseded format,
    a recommended element left out). `model` is set for the kinds rsnotify models.
    """

    root: str                       # "urlset", "sitemapindex", or the unexpected root's name
    capability: str | None          # the root <rs:md>'s capability, None when absent
    entries: int                    # <url> (or <sitemap>) children
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    model: Model | None = None

    @property
    def is_valid(self) -> bool:
        return not self.problems

    @property
    def description(self) -> str:
        """What the document is, in the spec's words: "change notification", "Change List Index"."""
        if self.root not in ("urlset", "sitemapindex"):
            return f"<{self.root}> document"
        if self.capability is None:
            return f"Sitemap <{self.root}> without a ResourceSync capability"
        name = DOCUMENT_NAMES.get(self.capability, f"document with capability '{self.capability}'")
        return f"{name} Index" if self.root == "sitemapindex" else name


def parse_document(data: bytes | str, *, max_bytes: int | None = None) -> ParsedDocument:
    """Detect and check the document in `data`.

    Raises `DocumentParseError` only when `data` is not safe, well-formed XML; every other
    failing is reported in `ParsedDocument.problems`.
    """
    return read_document(parse_root(data, max_bytes=max_bytes))


def read_document(root: etree._Element) -> ParsedDocument:
    name = tag_name(root.tag)
    if root.tag not in (URLSET, SITEMAPINDEX):
        return ParsedDocument(
            name,
            None,
            0,
            (f"root element is {describe_element(root.tag)}; expected <urlset> or <sitemapindex> "
             f"in the Sitemap namespace {SITEMAP_NS}",),
        )
    md = root.find(RS_MD)
    capability = None if md is None else md.get("capability")
    entries = sum(1 for child in root if child.tag in (URL, SITEMAP))
    if root.tag == URLSET and capability in (CHANGE_NOTIFICATION, LEGACY_CHANGE_NOTIFICATION, CAPABILITY_LIST, SOURCE_DESCRIPTION):
        return _read_modelled(root, name, capability, entries)
    problems, notes = _core_problems(root, md, capability)
    return ParsedDocument(name, capability, entries, tuple(problems), tuple(notes))


def _read_modelled(root: etree._Element, name: str, capability: str | None, entries: int) -> ParsedDocument:
    """Change notifications, Capability Lists and Source Descriptions: the full readers."""
    notes: list[str] = []
    model: Model
    try:
        if capability == CAPABILITY_LIST:
            model = read_capability_list(root)
        elif capability == SOURCE_DESCRIPTION:
            model = read_source_description(root)
        else:
            model = read_notification(root)
    except ValidationError as exc:
        return ParsedDocument(name, capability, entries, tuple(exc.problems))
    if capability == LEGACY_CHANGE_NOTIFICATION:
        notes.append(
            f"capability '{LEGACY_CHANGE_NOTIFICATION}' is Change Notification 1.0's value; "
            f"1.0.1 uses '{CHANGE_NOTIFICATION}' (accepted as a legacy alias)"
        )
    return ParsedDocument(name, capability, entries, (), tuple(notes), model)


def _core_problems(
    root: etree._Element, md: etree._Element | None, capability: str | None
) -> tuple[list[str], list[str]]:
    """The core spec's checks for documents rsnotify does not model."""
    problems: list[str] = []
    notes: list[str] = []
    root_name = tag_name(root.tag)
    owner = f"<rs:md> of <{root_name}>"
    if md is None or capability is None:
        problems.append(
            f"<{root_name}> has no <rs:md capability=...>; expected one: it is mandatory in "
            "every ResourceSync document"
        )
        if _looks_like_beta_notification(root):
            notes.append(
                "this looks like a notification payload of the superseded 0.9 beta, which had no capability, "
                "from or until; 1.0.1 requires <rs:md capability='change-notification' from until>"
            )
    elif capability not in DOCUMENT_NAMES:
        problems.append(f"{owner} has capability='{capability}'; expected one of {', '.join(sorted(DOCUMENT_NAMES))}")
    if capability in _NO_INDEX and root.tag == SITEMAPINDEX:
        problems.append(f"a {DOCUMENT_NAMES[capability]} uses <sitemapindex>; expected <urlset>")
    if capability == FRAMEWORK_NOTIFICATION:
        notes.append("a framework notification is not a change notification; it travels on its own channel")
    bounds: dict[str, datetime | None] = {}
    if md is not None:
        for attribute in ("at", "completed", "from", "until"):
            bounds[attribute] = read_datetime(md.get(attribute), f"{owner} has {attribute}", problems)
        required = "at" if capability in _NEEDS_AT else "from" if capability in _NEEDS_FROM else None
        if required and md.get(required) is None:
            problems.append(f"{owner} has no {required}; expected a W3C datetime (mandatory for a {DOCUMENT_NAMES[capability or '']})")
    if root.find(RS_LN) is None or all(link.get("rel") != "up" for link in root.iterfind(RS_LN)):
        if capability in DOCUMENT_NAMES and capability != SOURCE_DESCRIPTION:
            notes.append(f"<{root_name}> has no <rs:ln rel='up'> to the Capability List (the core spec makes it mandatory)")
    for element in root.iterfind(RS_LN):
        read_link(element, f"<{root_name}>", problems)
    changes = _check_entries(root, capability, problems, notes)
    if capability in ("changelist", "changedump-manifest") and root.tag == URLSET:
        problems.extend(change_order_problems(bounds.get("from"), bounds.get("until"), changes))
    return problems, notes


def _looks_like_beta_notification(root: etree._Element) -> bool:
    mds = [url.find(RS_MD) for url in root.iterfind(URL)]
    return bool(mds) and all(md is not None and md.get("change") for md in mds)


def _check_entries(
    root: etree._Element, capability: str | None, problems: list[str], notes: list[str]
) -> list[ResourceChange]:
    """Check every `<url>`/`<sitemap>`; returns the resource changes that have a change value."""
    entry_tag = URL if root.tag == URLSET else SITEMAP
    entry_name = tag_name(entry_tag)
    changes: list[ResourceChange] = []
    not_http: list[str] = []  # absolute URIs of other schemes: allowed by the core spec
    count = 0
    for index, entry in enumerate(root.iterfind(entry_tag), 1):
        count = index
        loc = (entry.findtext(LOC) or "").strip()
        where = f"<{entry_name}> for {loc}" if loc else f"<{entry_name}> #{index}"
        owner = f"for {loc}" if loc else f"of <{entry_name}> #{index}"
        if not loc:
            problems.append(f"<{entry_name}> #{index} has no <loc>; expected a URI")
        elif issue := loc_problem(loc, http_only=False):
            problems.append(f"<loc> '{loc}' {issue}")
        elif loc_problem(loc):
            not_http.append(loc)
        mds = entry.findall(RS_MD)
        if len(mds) > 1:
            problems.append(f"{where} has more than one <rs:md>; expected at most one (it is not repeatable)")
        lastmod = entry.findtext(LASTMOD)
        if lastmod is not None:
            read_datetime(lastmod.strip(), f"<lastmod> {owner} is", problems)
        for element in entry.iterfind(RS_LN):
            read_link(element, where, problems)
        # index entries point to documents, not resources: no change/path rules for them
        kind = capability if entry_tag == URL else None
        change = _check_entry_md(mds[0] if mds else None, where, owner, kind, problems)
        if change is not None and loc:
            changes.append(change)
    if count > MAX_ENTRIES:
        problems.append(f"<{tag_name(root.tag)}> has {count} entries; expected at most {MAX_ENTRIES}")
    if not_http:
        notes.append(
            f"{len(not_http)} <loc> {'is not an http(s) URI' if len(not_http) == 1 else 'are not http(s) URIs'} "
            f"(first: '{not_http[0]}'); rsnotify's hub and publisher accept http(s) only"
        )
    return changes


def _check_entry_md(
    md: etree._Element | None, where: str, owner: str, capability: str | None, problems: list[str]
) -> ResourceChange | None:
    needs_change = capability in _NEEDS_CHANGE
    if md is None:
        if needs_change or capability == "resourcedump-manifest":
            problems.append(f"{where} has no <rs:md>; expected one (mandatory in a {DOCUMENT_NAMES[capability or '']})")
        return None
    what = f"<rs:md> {owner}"
    changed_at = read_datetime(md.get("datetime"), f"{what} has datetime", problems)
    read_hashes(md.get("hash"), f"{what} has hash", problems)
    read_length(md.get("length"), f"{what} has length", problems)
    change = md.get("change")
    if change is None and needs_change:
        problems.append(f"{what} has no change; expected created, updated or deleted")
    elif change is not None and change not in _CHANGE_VALUES:
        problems.append(f"{what} has change='{change}'; expected created, updated or deleted")
        change = None
    needs_path = capability == "resourcedump-manifest" or (capability == "changedump-manifest" and change != "deleted")
    if needs_path and not md.get("path"):
        problems.append(f"{what} has no path; expected the bitstream's path in the package, e.g. /resources/res1")
    if change is None:
        return None
    loc = owner.removeprefix("for ")
    return ResourceChange(loc, _CHANGE_VALUES[change], changed_at)


__all__ = ["DOCUMENT_NAMES", "DocumentParseError", "ParsedDocument", "parse_document", "read_document"]

"""One broken document per rule, each failing with its own message; all problems at once."""
from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from rsnotify.documents import parse_document
from rsnotify.errors import (
    DocumentParseError,
    NotificationError,
    NotificationParseError,
    ValidationError,
)
from rsnotify.notification import (
    CapabilityEntry,
    ChangeNotification,
    Link,
    ResourceChange,
)
from rsnotify.xml import (
    capability_list_to_xml,
    parse_capability_list,
    parse_notification,
    to_xml,
)

HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
)
MD = '<rs:md capability="change-notification" from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>'


def document(*urls: str, md: str = MD) -> bytes:
    return (HEAD + md + "".join(urls) + "</urlset>").encode()


def url(loc: str = "http://example.com/res1", md: str = 'change="created" datetime="2013-01-03T00:07:22Z"', extra: str = "") -> str:
    return f"<url><loc>{loc}</loc><rs:md {md}/>{extra}</url>"


def problems_of(data: bytes) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        parse_notification(data)
    return caught.value.problems


def test_a_valid_minimal_notification_parses() -> None:
    notification = parse_notification(document(url()))
    assert notification.changes[0].loc == "http://example.com/res1"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (document(url(), md=""), "<urlset> has no <rs:md>; expected <rs:md capability=\"change-notification\""),
        (document(url(), md='<rs:md from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>'),
         "<rs:md> of <urlset> has no capability; expected capability='change-notification'"),
        (document(url(), md='<rs:md capability="change-notification" until="2013-01-03T00:10:00Z"/>'),
         "<rs:md> of <urlset> has no from; expected a W3C datetime"),
        (document(url(), md='<rs:md capability="change-notification" from="2013-01-03T00:00:00Z"/>'),
         "<rs:md> of <urlset> has no until; expected a W3C datetime"),
        (document(url(), md='<rs:md capability="change-notification" from="03/01/2013" until="2013-01-03T00:10:00Z"/>'),
         "<rs:md> of <urlset> has from='03/01/2013'; expected a W3C datetime such as 2013-01-03T00:07:22Z"),
        (document(md='<rs:md capability="change-notification" from="2013-01-03T00:10:00Z" until="2013-01-03T00:00:00Z"/>'),
         "<rs:md> of <urlset> has until=2013-01-03T00:00:00Z before from=2013-01-03T00:10:00Z; expected until >= from"),
        (document("<url><rs:md change=\"created\"/></url>"), "<url> #1 has no <loc>; expected the resource's URI"),
        (document("<url><loc> </loc><rs:md change=\"created\"/></url>"), "<url> #1 has an empty <loc>"),
        (document("<url><loc>http://example.com/res1</loc></url>"),
         "<url> for http://example.com/res1 has no <rs:md>; expected <rs:md change=...> with change created, updated or deleted"),
        (document(url(md='datetime="2013-01-03T00:07:22Z"')),
         "<rs:md> for http://example.com/res1 has no change; expected created, updated or deleted"),
        (document(url(md='change="moved"')),
         "<rs:md> for http://example.com/res1 has change='moved'; expected created, updated or deleted"),
        (document(url(md='change="created" datetime="2013-01-04T00:00:00Z"')),
         "<rs:md> for http://example.com/res1 has datetime=2013-01-04T00:00:00Z; expected a datetime inside "
         "[2013-01-03T00:00:00Z, 2013-01-03T00:10:00Z]"),
        (document(url(md='change="created" datetime="2013-01-02T23:59:59Z"')),
         "<rs:md> for http://example.com/res1 has datetime=2013-01-02T23:59:59Z; expected a datetime inside"),
        (document(url("http://example.com/a", 'change="created" datetime="2013-01-03T00:05:00Z"'),
                  url("http://example.com/b", 'change="created" datetime="2013-01-03T00:01:00Z"')),
         "<url> for http://example.com/b has datetime=2013-01-03T00:01:00Z before the previous entry's "
         "2013-01-03T00:05:00Z; expected forward chronological order"),
        (document(url(md='change="created" datetime="now"')),
         "<rs:md> for http://example.com/res1 has datetime='now'; expected a W3C datetime"),
        (document(url(md='change="created" length="12kB"')),
         "<rs:md> for http://example.com/res1 has length='12kB'; expected a non-negative integer"),
        (document(url(md='change="created" hash="1584abdf8ebdc9802ac0c6a7402c03b6"')),
         "<rs:md> for http://example.com/res1 has hash='1584abdf8ebdc9802ac0c6a7402c03b6'; expected a "
         "whitespace-separated list of algorithm:hexdigest"),
        (document(url(extra='<rs:md change="updated"/>')),
         "<url> for http://example.com/res1 has more than one <rs:md> (it is not repeatable); expected one"),
        (document("<url><loc>http://example.com/res1</loc><lastmod>soon</lastmod><rs:md change=\"created\"/></url>"),
         "<lastmod> for http://example.com/res1 is='soon'; expected a W3C datetime"),
        (document(url(extra='<rs:ln href="http://example.com/x"/>')),
         "<rs:ln> of <url> for http://example.com/res1 has no rel; expected a relation type"),
        (document(url(extra='<rs:ln rel="describedby"/>')),
         "<rs:ln rel='describedby'> of <url> for http://example.com/res1 has no href"),
        (document(url(extra='<rs:ln rel="alternate" href="http://example.com/x" pri="0"/>')),
         "has pri='0'; expected an integer from 1 to 999999"),
        (document(url(), md=MD + MD), "<urlset> has more than one <rs:md>; expected exactly one"),
    ],
)
def test_each_rule_fails_with_its_own_message(data: bytes, message: str) -> None:
    problems = problems_of(data)
    assert any(message in problem for problem in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    data = document(
        url("http://example.com/a", 'change="moved"'),
        url("http://example.com/b", 'change="created" length="-1"'),
        "<url><rs:md change=\"created\"/></url>",
        md='<rs:md capability="change-notification" from="2013-01-03T00:00:00Z"/>',
    )
    problems = problems_of(data)
    assert len(problems) == 4
    assert str(ValidationError(problems)) == "\n".join(problems)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"<urlset", "not well-formed XML"),
        (b"", "not well-formed XML"),
        (b'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"/>', "root element is <sitemapindex>"),
        (b'<urlset xmlns="http://example.com/not-sitemaps"/>', "root element is <{http://example.com/not-sitemaps}urlset>"),
        (b"<urlset/>", "root element is <urlset> in no namespace; expected <urlset> in the Sitemap namespace"),
        (document(url(), md='<rs:md capability="changelist" from="2013-01-03T00:00:00Z"/>'),
         "<rs:md> of <urlset> has capability='changelist'; expected change-notification"),
        (document(md='<rs:md capability="framework-notification"/>'), "capability='framework-notification'"),
    ],
)
def test_what_is_not_a_change_notification_is_a_parse_error(data: bytes, message: str) -> None:
    with pytest.raises(NotificationParseError, match=re.escape(message)) as caught:
        parse_notification(data)
    assert isinstance(caught.value, DocumentParseError)


def test_namespaces_are_matched_by_uri_not_prefix() -> None:
    data = (
        b'<s:urlset xmlns:s="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:x="http://www.openarchives.org/rs/terms/">'
        b'<x:md capability="change-notification" from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>'
        b'<s:url><s:loc>http://example.com/res1</s:loc><x:md change="deleted"/></s:url></s:urlset>'
    )
    assert parse_notification(data).changes[0].change.value == "deleted"


def test_foreign_attributes_are_kept_and_never_fatal() -> None:
    data = document(url(md='change="created" xmlns:ex="http://example.org/ns" ex:batch="7" encoding="gzip"'))
    change = parse_notification(data).changes[0]
    assert change.extra == (("{http://example.org/ns}batch", "7"), ("encoding", "gzip"))


def test_child_order_inside_url_is_free() -> None:
    data = document(
        '<url><rs:ln rel="describedby" href="http://example.com/m"/><rs:md change="updated"/>'
        "<lastmod>2013-01-01</lastmod><loc>http://example.com/res1</loc><changefreq>daily</changefreq></url>"
    )
    change = parse_notification(data).changes[0]
    assert change.links == (Link("describedby", "http://example.com/m"),)


def test_max_bytes_bounds_the_document() -> None:
    data = document(url())
    with pytest.raises(NotificationParseError, match=f"document is {len(data)} bytes; expected at most 100 bytes"):
        parse_notification(data, max_bytes=100)


CAPABILITY_LIST = (
    HEAD.replace("<urlset ", '<urlset xmlns:ex="http://example.org/ns" ')
    + '<rs:ln rel="describedby" href="http://example.com/info.xml" ex:note="kept"/>'
    + '<rs:ln rel="up" href="http://example.com/.well-known/resourcesync"/>'
    + '<rs:md capability="capabilitylist" ex:owner="team"/>'
    + '<url><loc>http://example.com/resourcelist.xml</loc><rs:md capability="resourcelist" ex:size="3"/>'
    + '<rs:ln rel="describedby" href="http://example.com/rl-info" type="text/html" length="10" pri="2"/></url>'
    + '<url><loc>http://example.com/change/</loc><rs:ln rel="hub" href="http://hub.example.org/"/>'
    + '<rs:md capability="change-notification"/></url></urlset>'
).encode()


def test_an_edited_capability_list_keeps_every_other_entry() -> None:
    original = parse_capability_list(CAPABILITY_LIST)
    channel = CapabilityEntry("http://example.com/change/", "change-notification", (Link("hub", "http://hub2.example.org/"),))
    edited = replace(original, entries=(original.entries[0], channel))
    reparsed = parse_capability_list(capability_list_to_xml(edited))
    assert reparsed.entries[0] == original.entries[0]
    assert reparsed.entries[0].extra == (("{http://example.org/ns}size", "3"),)
    assert reparsed.links == original.links and reparsed.extra_md == original.extra_md
    assert reparsed.change_notification_channels()[0].hubs == ("http://hub2.example.org/",)


@pytest.mark.parametrize(
    ("replace_from", "replace_to", "message"),
    [
        ('<rs:ln rel="up" href="http://example.com/.well-known/resourcesync"/>', "",
         "<urlset> of the Capability List has no <rs:ln rel='up'>"),
        ('capability="change-notification"', 'capability="resourcelist"',
         "<rs:md> for http://example.com/change/ repeats capability='resourcelist'; expected one entry per capability"),
        ('<rs:md capability="change-notification"/>', "",
         "<url> for http://example.com/change/ has no <rs:md capability='...'>"),
    ],
)
def test_capability_list_rules(replace_from: str, replace_to: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_capability_list(CAPABILITY_LIST.replace(replace_from.encode(), replace_to.encode()))
    assert any(problem.startswith(message) for problem in caught.value.problems), caught.value.problems


def test_a_change_notification_is_not_a_capability_list() -> None:
    with pytest.raises(DocumentParseError, match="has capability='change-notification'; expected capabilitylist"):
        parse_capability_list(document(url()))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'<html xmlns="http://www.w3.org/1999/xhtml"/>', "root element is <{http://www.w3.org/1999/xhtml}html>"),
        (HEAD.encode() + b'<rs:md capability="resourcelist"/></urlset>', "<rs:md> of <urlset> has no at"),
        (HEAD.encode() + b'<rs:md capability="changelist"/></urlset>', "<rs:md> of <urlset> has no from"),
        (HEAD.encode() + b'<rs:md capability="resource-list" at="2013"/></urlset>',
         "<rs:md> of <urlset> has capability='resource-list'; expected one of"),
        (HEAD.encode() + b'<rs:md capability="changelist" from="2013-01-03T00:00:00Z"/><url><loc>http://example.com/a</loc>'
         b'<rs:md datetime="2013-01-03T00:00:00Z"/></url></urlset>', "<rs:md> for http://example.com/a has no change"),
        (HEAD.encode() + b'<rs:md capability="resourcedump-manifest" at="2013"/><url><loc>http://example.com/a</loc>'
         b"<rs:md/></url></urlset>", "<rs:md> for http://example.com/a has no path"),
        (HEAD.replace("urlset", "sitemapindex").encode() + b'<rs:md capability="capabilitylist"/></sitemapindex>',
         "a Capability List uses <sitemapindex>; expected <urlset>"),
    ],
)
def test_other_documents_get_the_core_checks(data: bytes, message: str) -> None:
    document = parse_document(data)
    assert any(problem.startswith(message) for problem in document.problems), document.problems


def test_text_xml_cannot_carry_is_refused_when_writing() -> None:
    now = datetime(2024, 1, 1, tzinfo=timezone.utc)
    notification = ChangeNotification(now, now, (ResourceChange("http://example.com/\x00", "created"),))
    with pytest.raises(NotificationError, match="control character|cannot be written as XML"):
        to_xml(notification)


def test_an_extra_never_overrides_a_modelled_attribute() -> None:
    now = datetime(2024, 1, 1, tzinfo=timezone.utc)
    change = ResourceChange("http://example.com/a", "created", extra=(("change", "deleted"),))
    parsed = parse_notification(bytearray(to_xml(ChangeNotification(now, now, (change,)))))
    assert parsed.changes[0].change.value == "created"

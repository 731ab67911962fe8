"""What the parser refuses before and while parsing: other encodings than UTF-8, DTDs hidden in
UTF-16, external references, crowds of attributes and elements; the same rules hold for the
streaming parser, and async code parses in a thread with a time bound."""
from __future__ import annotations

import asyncio
import io
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime

import pytest

from rsnotify.documents import parse_document
from rsnotify.errors import (
    DocumentParseError,
    NotificationError,
    NotificationParseError,
    ValidationError,
)
from rsnotify.lists import open_list
from rsnotify.notification import ChangeNotification, ResourceChange
from rsnotify.safexml import (
    INLINE_BYTES,
    MAX_ATTRIBUTES,
    MAX_ELEMENTS,
    URL,
    iterparse,
    parse_in_thread,
    parse_root,
    parse_soon,
)
from rsnotify.xml import parse_notification, to_xml

URLSET_OPEN = (
    '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
    '<rs:md capability="change-notification" from="2013-01-03T00:00:00Z" until="2013-01-03T00:10:00Z"/>'
)
ONE_CHANGE = '<url><loc>{loc}</loc><rs:md change="created" datetime="2013-01-03T00:05:00Z"/></url>'
PARAMETER_ENTITY = (
    '<?xml version="1.0" encoding="UTF-16"?>\n'
    '<!DOCTYPE urlset [<!ENTITY % x SYSTEM "{target}"> %x;]>\n' + URLSET_OPEN + "</urlset>"
)


def notification(loc: str = "http://example.com/res1") -> bytes:
    return (URLSET_OPEN + ONE_CHANGE.format(loc=loc) + "</urlset>").encode()


def test_utf16_parameter_entity_to_dev_zero_is_refused_at_once() -> None:
    # In a child process: before the fix this froze the parser for good, which would hang pytest.
    code = (
        "from rsnotify.xml import parse_notification\n"
        "from rsnotify.errors import NotificationParseError\n"
        f"data = {PARAMETER_ENTITY.format(target='file:///dev/zero')!r}.encode('utf-16')\n"
        "try:\n    parse_notification(data)\nexcept NotificationParseError as exc:\n    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "UTF-16 byte order mark; expected UTF-8" in result.stdout


@pytest.mark.parametrize("encode", ["utf-16", "utf-8"])
def test_refusal_does_not_tell_whether_a_local_file_exists(encode: str, tmp_path) -> None:
    present = tmp_path / "present.dtd"
    present.write_text("<!ENTITY leak 'x'>")
    messages = set()
    for target in (present.as_uri(), (tmp_path / "absent.dtd").as_uri()):
        text = PARAMETER_ENTITY.format(target=target)
        if encode == "utf-8":
            text = text.replace('encoding="UTF-16"', 'encoding="UTF-8"')
        with pytest.raises(NotificationParseError) as refused:
            parse_notification(text.encode(encode))
        messages.add(str(refused.value))
    assert len(messages) == 1, messages
    assert "present" not in messages.pop()


@pytest.mark.parametrize(
    "data, message",
    [
        (("<!DOCTYPE urlset>" + URLSET_OPEN + "</urlset>").encode("utf-16-le"), "UTF-16 or UTF-32"),
        (("<!DOCTYPE urlset>" + URLSET_OPEN + "</urlset>").encode("utf-16-be"), "UTF-16 or UTF-32"),
        (("<!DOCTYPE urlset>" + URLSET_OPEN + "</urlset>").encode("utf-32"), "UTF-32 byte order mark"),
        (b'<?xml version="1.0" encoding="ISO-8859-1"?>' + notification(), "encoding='ISO-8859-1'; expected UTF-8"),
        (b"\xef\xbb\xbf<?xml version='1.0' encoding='utf-16'?>" + notification(), "encoding='utf-16'"),
        (notification().replace(b"</urlset>", b"<!-- <!DOCTYPE x> --></urlset>"), "document has a DTD"),
        (notification().replace(b"http", b"\x00http"), "NUL byte at offset"),
    ],
    ids=["utf16le-doctype", "utf16be-doctype", "utf32", "latin1-declared", "bom-then-utf16-declared",
         "doctype-in-comment", "nul"],
)
def test_other_encodings_and_dtds_are_refused_before_parsing(data: bytes, message: str) -> None:
    with pytest.raises(NotificationParseError, match=message):
        parse_notification(data)
    with pytest.raises(DocumentParseError, match=message):
        list(iterparse(io.BytesIO(data), chunk_size=7))


@pytest.mark.parametrize(
    "data",
    [notification(), b'<?xml version="1.0" encoding="utf-8"?>' + notification(), b"\xef\xbb\xbf" + notification()],
    ids=["no-declaration", "utf-8-declared", "utf-8-bom"],
)
def test_utf8_documents_still_parse(data: bytes) -> None:
    assert parse_notification(data).changes[0].loc == "http://example.com/res1"


def test_a_hundred_thousand_attributes_are_refused_quickly() -> None:
    crowd = " ".join(f'a{i}="1"' for i in range(100_000))
    data = notification().replace(b'<rs:md change="created"', f'<rs:md change="created" {crowd}'.encode())

    async def parse() -> None:
        # The bound is generous (validating this took 28 s when it was quadratic); bench/ times it.
        await parse_in_thread(parse_notification, data, timeout=20, error=NotificationParseError)

    with pytest.raises(NotificationParseError, match=f"<rs:md> has 100002 attributes; expected at most {MAX_ATTRIBUTES}"):
        asyncio.run(parse())
    with pytest.raises(DocumentParseError, match="100002 attributes"):
        list(iterparse(io.BytesIO(data)))


def test_element_count_is_capped() -> None:
    data = (URLSET_OPEN + "<x/>" * MAX_ELEMENTS + "</urlset>").encode()
    with pytest.raises(NotificationParseError, match=f"elements; expected at most {MAX_ELEMENTS}"):
        parse_notification(data)
    small = (URLSET_OPEN + "<x/>" * 1_000 + "</urlset>").encode()
    assert len(list(iterparse(io.BytesIO(small), max_elements=1_002))) == 1_002
    with pytest.raises(DocumentParseError, match="more than 1001 elements; expected at most 1001"):
        list(iterparse(io.BytesIO(small), max_elements=1_001))


def test_iterparse_screens_a_dtd_split_across_reads_and_the_size() -> None:
    data = b'<?xml version="1.0"?>' + b" " * 600 + b"<!DOCTYPE urlset>" + notification()
    for chunk_size in (3, 610, 615, 4096):
        with pytest.raises(DocumentParseError, match="document has a DTD"):
            list(iterparse(io.BytesIO(data), chunk_size=chunk_size))
    with pytest.raises(DocumentParseError, match="expected at most 100 bytes"):
        list(iterparse(io.BytesIO(notification()), max_bytes=100))


def test_iterparse_yields_the_events_and_tags_asked_for() -> None:
    data = (URLSET_OPEN + ONE_CHANGE.format(loc="http://e.org/a") + ONE_CHANGE.format(loc="http://e.org/b")
            + "</urlset>").encode()
    seen = [(event, element.findtext("{http://www.sitemaps.org/schemas/sitemap/0.9}loc"))
            for event, element in iterparse(io.BytesIO(data), tag=URL, chunk_size=16)]
    assert seen == [("end", "http://e.org/a"), ("end", "http://e.org/b")]


def test_streamed_lists_use_the_same_screens() -> None:
    data = ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
            '<rs:md capability="resourcelist" at="2013-01-03T09:00:00Z"/></urlset>').encode("utf-16")
    with pytest.raises(DocumentParseError, match="UTF-16 byte order mark"):
        open_list(io.BytesIO(data))


def test_parse_in_thread_keeps_the_loop_free_and_bounds_the_time() -> None:
    release = threading.Event()
    threads: list[str] = []

    def slow_parse(data: bytes) -> None:
        threads.append(threading.current_thread().name)
        release.wait(60)

    async def run() -> None:
        with pytest.raises(NotificationParseError, match="parsing took longer than 0.2 s"):
            await parse_in_thread(slow_parse, b"<x/>", timeout=0.2, error=NotificationParseError)
        release.set()
        root = await parse_in_thread(parse_root, b"<x/>")
        assert root.tag == "x"

    asyncio.run(run())
    assert threads and threads[0] != threading.main_thread().name


def test_parse_soon_parses_small_bodies_on_the_loop_and_large_ones_in_the_parser_thread() -> None:
    threads: list[str] = []

    def parse_here(data: bytes) -> object:
        threads.append(threading.current_thread().name)
        return parse_notification(data)

    small = notification()
    # a valid notification just past the inline limit: padding in a comment
    large = notification().replace(b"</urlset>", b"<!--" + b"x" * INLINE_BYTES + b"--></urlset>")
    crowd = " ".join(f'a{i}="1"' for i in range(MAX_ATTRIBUTES + 1))
    hostile = notification().replace(b'<rs:md change="created"', f'<rs:md change="created" {crowd}'.encode())
    assert len(small) <= INLINE_BYTES < len(large) and len(hostile) <= INLINE_BYTES

    async def run() -> None:
        assert (await parse_soon(parse_here, small, error=NotificationParseError)).changes
        assert (await parse_soon(parse_here, large, error=NotificationParseError)).changes
        with pytest.raises(NotificationParseError, match=f"expected at most {MAX_ATTRIBUTES}"):
            await parse_soon(parse_notification, hostile, error=NotificationParseError)   # inline: the same checks

    asyncio.run(run())
    assert threads[0] == threading.main_thread().name
    assert threads[1].startswith("rsnotify-xml")


@pytest.mark.parametrize(
    "loc, message",
    [
        ("/res1", "is relative; expected an absolute http(s) URI"),
        ("res1", "is relative"),
        ("http://example.com/a b", "has a space or control character"),
        ("http://example.com/a\x9b2Jb", "has a space or control character"),        # C1: a terminal's CSI
        ("http://example.com/a\x80b", "has a space or control character"),
        ("http://example.com/\u202eexe.txt", "has a space or control character"),   # right-to-left override
        ("http://example.com/a\u2066b", "has a space or control character"),
        ("ftp://example.com/res1", "has scheme 'ftp'; expected an http(s) URI"),
        ("http:/res1", "has no host"),
    ],
)
def test_a_change_loc_must_be_an_absolute_http_uri(loc: str, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        parse_notification(notification(loc))
    now = datetime(2013, 1, 3, tzinfo=UTC)
    with pytest.raises(NotificationError, match=re.escape(message)):
        to_xml(ChangeNotification(now, now, (ResourceChange(loc, "created", now),)))


@pytest.mark.parametrize("element", [
    '<rs:md change="created" type="text/html&#13;&#10;X-Injected: 1"/>',
    '<rs:md change="created"/><rs:ln rel="alternate" href="http://example.com/res1.pdf" type="application/pdf&#10;"/>',
])
def test_a_type_with_a_control_character_is_refused(element: str) -> None:
    # a Destination may put `type` in a Content-Type header, where CR LF would start another header
    body = URLSET_OPEN + f"<url><loc>http://example.com/res1</loc>{element}</url></urlset>"
    with pytest.raises(ValidationError, match="has type=.*, with a control character; expected a media type"):
        parse_notification(body.encode())
    fine = parse_notification(body.replace("&#13;&#10;X-Injected: 1", "; charset=utf-8").replace("&#10;", "")
                              .encode())
    assert fine.changes[0].media_type in ("text/html; charset=utf-8", None)


def test_validate_warns_about_other_schemes_and_refuses_relative_locs() -> None:
    resource_list = (
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
        '<rs:ln rel="up" href="http://example.com/capabilitylist.xml"/>'
        '<rs:md capability="resourcelist" at="2013-01-03T09:00:00Z"/>'
        "<url><loc>{loc}</loc></url></urlset>"
    )
    other = parse_document(resource_list.format(loc="urn:isbn:0451450523"))
    assert other.is_valid
    assert any("'urn:isbn:0451450523'" in note and "http(s) only" in note for note in other.notes)
    relative = parse_document(resource_list.format(loc="res/1"))
    assert any("<loc> 'res/1' is relative" in problem for problem in relative.problems)

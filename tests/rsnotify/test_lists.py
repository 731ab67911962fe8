"""Resource Lists, Change Lists and indexes read and written streaming: the spec's examples
read, round-trip, validate with `rsnotify validate`'s checks and parse with resync."""
from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from resync.change_list import ChangeList as ResyncChangeList
from resync.resource_list import ResourceList as ResyncResourceList

from rsnotify.documents import parse_document
from rsnotify.errors import DocumentParseError, NotificationError
from rsnotify.lists import ListInfo, ListRef, ListWriter, Resource, open_list
from rsnotify.notification import ChangeType, Link, ResourceChange
from rsnotify.safexml import MAX_ATTRIBUTES, MAX_ELEMENTS

CORE = Path(__file__).resolve().parents[1] / "fixtures" / "core-1.1"

# example -> (capability, is_index, entries)
LISTS = {
    1: ("resourcelist", False, 2),
    2: ("resourcelist", False, 2),
    3: ("changelist", False, 3),
    8: ("resourcelist", True, 2),
    14: ("resourcelist", False, 2),
    15: ("resourcelist", True, 3),
    16: ("resourcelist", False, 2),
    19: ("changelist", False, 4),
    20: ("changelist", True, 3),
    21: ("changelist", False, 4),
    **{n: ("changelist", False, 1) for n in (24, 25, 26, 29, 30, 31, 32, 33)},
    27: ("changelist", False, 2),
    28: ("changelist", False, 2),
}
T = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def _read(data: bytes) -> tuple[ListInfo, list]:
    stream = open_list(io.BytesIO(data))
    return stream.info, list(stream)


def _write(info: ListInfo, entries: list) -> bytes:
    out = io.BytesIO()
    with ListWriter(out, info) as writer:
        for entry in entries:
            writer.write(entry)
    return out.getvalue()


@pytest.mark.parametrize("number", sorted(LISTS))
def test_spec_example_reads_and_round_trips(number: int) -> None:
    capability, is_index, count = LISTS[number]
    info, entries = _read((CORE / f"resourcesync_ex_{number}.xml").read_bytes())
    assert (info.capability, info.is_index, len(entries)) == (capability, is_index, count)
    expected_type = ListRef if is_index else ResourceChange if capability == "changelist" else Resource
    assert all(isinstance(entry, expected_type) for entry in entries)
    written = _write(info, entries)
    assert _read(written) == (info, entries)
    verdict = parse_document(written)
    assert verdict.is_valid, verdict.problems
    assert verdict.entries == count


def test_example_19_keeps_the_entry_without_datetime_last() -> None:
    info, entries = _read((CORE / "resourcesync_ex_19.xml").read_bytes())
    assert info.from_ == datetime(2013, 1, 3, tzinfo=UTC) and info.until is None
    assert info.link("up") == "http://example.com/dataset1/capabilitylist.xml"
    assert [(e.loc.rsplit("/", 1)[1], e.change, e.changed_at is None) for e in entries] == [
        ("res1.html", ChangeType.CREATED, False),
        ("res2.pdf", ChangeType.UPDATED, False),
        ("res3.tiff", ChangeType.DELETED, False),
        ("res2.pdf", ChangeType.UPDATED, True),
    ]


def test_example_20_index_gives_each_lists_bounds() -> None:
    info, refs = _read((CORE / "resourcesync_ex_20.xml").read_bytes())
    assert info.is_index and info.capability == "changelist"
    assert [(r.from_.day, r.until.day if r.until else None) for r in refs] == [(1, 2), (2, 3), (3, None)]


def _resources(n: int) -> list[Resource]:
    return [
        Resource(
            f"http://example.com/a%20b/{i}.txt",
            T,
            (("md5", "0" * 32), ("sha-256", "f" * 64)),
            i,
            "text/plain",
            (Link("duplicate", f"http://mirror.example.com/{i}"),) if i % 2 else (),
        )
        for i in range(n)
    ]


def test_written_resource_list_is_read_by_resync() -> None:
    info = ListInfo("resourcelist", at=T, links=(Link("up", "http://example.com/capabilitylist.xml"),))
    data = _write(info, _resources(3))
    parsed = ResyncResourceList()
    parsed.parse(str_data=data.decode())
    assert [r.uri for r in parsed] == [f"http://example.com/a%20b/{i}.txt" for i in range(3)]
    assert [(r.md5, r.length, r.mime_type) for r in parsed][2] == ("0" * 32, 2, "text/plain")
    assert parsed.md_at == "2026-11-21T10:00:00Z"
    assert parse_document(data).is_valid


def test_written_change_list_is_read_by_resync() -> None:
    changes = [
        ResourceChange("http://example.com/x", ChangeType.CREATED, T, T, (("md5", "1" * 32),), 5, "text/plain"),
        ResourceChange("http://example.com/x", ChangeType.DELETED, T),
    ]
    data = _write(ListInfo("changelist", from_=T), changes)
    parsed = ResyncChangeList()
    parsed.parse(str_data=data.decode())
    assert [(r.uri, r.change) for r in parsed] == [("http://example.com/x", "created"), ("http://example.com/x", "deleted")]
    assert parsed.md_from == "2026-11-21T10:00:00Z" and parsed.md_until is None
    assert parse_document(data).is_valid


def test_a_long_list_streams_in_order() -> None:
    data = _write(ListInfo("resourcelist", at=T), _resources(5000))
    stream = open_list(io.BytesIO(data))
    assert [entry.length for entry in stream] == list(range(5000))


def test_entries_before_a_bad_one_come_first_and_the_tree_stays_small() -> None:
    # Entries are read a batch of parser events at a time; the ones before a bad entry are
    # still handed out first, then its error, then nothing; stray and nested elements are
    # skipped, and what was read is dropped from the tree as the list goes on.
    entries = "".join(f'<url><loc>http://e.org/{n}</loc><rs:md length="{n}"/></url>' for n in range(3000))
    data = (RL_OPEN + '<stray/>' + entries + '<url><loc>http://e.org/nested</loc><x><url><loc>http://e.org/in</loc>'
            '</url></x></url>' + '<url><loc>http://e.org/bad</loc><rs:md length="-1"/></url>'
            + '<url><loc>http://e.org/after</loc></url></urlset>').encode()
    stream = open_list(io.BytesIO(data))
    read = []
    sizes = []
    with pytest.raises(DocumentParseError, match=r"length='-1'.*\(line 1\)"):
        for entry in stream:
            read.append(entry.loc)
            root = stream._root
            assert root is not None
            sizes.append(len(root))
    assert read == [f"http://e.org/{n}" for n in range(3000)] + ["http://e.org/nested"]
    assert max(sizes) < 1000         # one batch of events at most, never the whole list
    assert list(stream) == []


def test_take_hands_out_chunks_in_order_and_raises_for_a_bad_entry_in_its_chunk() -> None:
    data = _write(ListInfo("resourcelist", at=T), _resources(2500))
    stream = open_list(io.BytesIO(data))
    chunks = [stream.take(1000) for _ in range(4)]
    assert [len(c) for c in chunks] == [1000, 1000, 500, 0]
    assert [e.length for c in chunks for e in c] == list(range(2500))
    entries = "".join(f'<url><loc>http://e.org/{n}</loc></url>' for n in range(1500))
    bad = (RL_OPEN + entries + '<url><loc>http://e.org/bad</loc><rs:md length="x"/></url></urlset>').encode()
    stream = open_list(io.BytesIO(bad))
    assert len(stream.take(1000)) == 1000
    with pytest.raises(DocumentParseError, match="length='x'"):
        stream.take(1000)        # as list(islice(stream, 1000)) would: the chunk's good entries go with it
    assert stream.take(1000) == []


def test_urlset_rooted_index_is_read_as_an_index() -> None:
    data = (
        b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
        b'<rs:md capability="resourcelist" at="2026-11-21T10:00:00Z"/>'
        b"<sitemap><loc>http://example.com/rl1.xml</loc></sitemap></urlset>"
    )
    info, refs = _read(data)
    assert info.is_index and refs == [ListRef("http://example.com/rl1.xml")]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'<!DOCTYPE x [<!ENTITY a "b">]><urlset/>', "DTD"),
        (b"", "empty"),
        (b"<html/>", "root element is <html> in no namespace"),
        (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><url><loc>x</loc></url></urlset>', "no <rs:md capability"),
        (
            (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
            b'<rs:md capability="changelist" from="2013-01-03T00:00:00Z"/>\n<url><loc>x</loc></url>\n'
            b'<url><loc>y</loc><rs:md change="moved"/></url></urlset>'),
            "line 2",
        ),
        (
            (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
            b'<rs:md capability="resourcelist" at="2013-01-03T00:00:00Z"/><url><loc>x</loc>'),
            "not well-formed",
        ),
        (
            (b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
            b'<rs:md capability="resourcelist" at="yesterday"/></urlset>'),
            "at='yesterday'",
        ),
    ],
)
def test_bad_input_is_a_parse_error(data: bytes, message: str) -> None:
    with pytest.raises(DocumentParseError, match=message):
        _read(data)


def test_change_value_error_names_the_entry_and_line() -> None:
    data = (
        b'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">\n'
        b'<rs:md capability="changelist" from="2013-01-03T00:00:00Z"/>\n'
        b'<url><loc>http://e.com/y</loc><rs:md change="moved"/></url></urlset>'
    )
    with pytest.raises(DocumentParseError, match=r"for http://e.com/y has change='moved'.*\(line 3\)"):
        _read(data)


def test_size_limit_is_enforced_while_streaming() -> None:
    data = _write(ListInfo("resourcelist", at=T), _resources(200))
    with pytest.raises(DocumentParseError, match="at most 10000 bytes"):
        list(open_list(io.BytesIO(data), max_bytes=10_000))


def test_writer_refuses_wrong_entries_and_bad_text() -> None:
    with pytest.raises(NotificationError, match="cannot go into a list"):
        _write(ListInfo("resourcelist", at=T), [ListRef("http://example.com/l.xml")])
    with pytest.raises(NotificationError, match="cannot be written as XML"):
        _write(ListInfo("resourcelist", at=T), [Resource("http://example.com/\x00")])


RL_OPEN = ('<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">'
           '<rs:md capability="resourcelist" at="2026-11-21T10:00:00Z"/>')


def test_a_list_keeps_the_parsers_element_and_attribute_caps() -> None:
    # The list reader counts each element once it is complete: the caps and their words stay.
    entry = '<url><loc>http://e.org/{n}</loc></url>'
    crowded = RL_OPEN + entry.format(n=1) + "<x/>" * MAX_ELEMENTS + "</urlset>"
    stream = open_list(io.BytesIO(crowded.encode()))
    with pytest.raises(DocumentParseError, match=f"more than {MAX_ELEMENTS} elements; expected at most {MAX_ELEMENTS}"):
        list(stream)
    attributes = " ".join(f'a{i}="1"' for i in range(MAX_ATTRIBUTES + 1))
    data = RL_OPEN + entry.format(n=1) + f'<url><loc>http://e.org/2</loc><rs:md {attributes}/></url></urlset>'
    stream = open_list(io.BytesIO(data.encode()))
    # the entry before the refused element is still read, as with one event at a time
    assert next(stream) == Resource("http://e.org/1")
    with pytest.raises(DocumentParseError, match=f"<rs:md> has {MAX_ATTRIBUTES + 1} attributes; expected at most"):
        next(stream)


def test_unusual_entries_read_as_written() -> None:
    # links, attributes the model has no field for, another child order, stray root children
    # between entries: each entry as written, in order
    link = Link("duplicate", "http://mirror.org/a", hashes=(("md5", "aa"),))
    resources = [Resource("http://e.org/a", T, (("md5", "11"), ("sha-256", "22")), 5, "text/plain", (link,)),
                 Resource("http://e.org/b", None, (), 7, extra=(("{http://other.org/}x", "y"),)),
                 Resource("http://e.org/c", T)]
    data = _write(ListInfo("resourcelist", at=T), resources)
    data = data.replace(b"<url><loc>http://e.org/b</loc>", b"<stray><url><loc>inside</loc></url></stray>"
                        b"<url><loc>http://e.org/b</loc>")
    data = data.replace(b"<url><loc>http://e.org/c</loc><lastmod>2026-11-21T10:00:00Z</lastmod>",
                        b"<url><lastmod>2026-11-21T10:00:00Z</lastmod><loc> http://e.org/c </loc>")
    assert b"<stray>" in data and b"<loc> http://e.org/c </loc>" in data
    assert _read(data)[1] == resources


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("<url><loc>http://e.org/a</loc><lastmod>today</lastmod></url>", "<lastmod> for http://e.org/a is='today'"),
        ('<url><loc>http://e.org/a</loc><rs:md length="-1"/></url>', "<rs:md> for http://e.org/a has length='-1'"),
        ('<url><loc>http://e.org/a</loc><rs:md hash="md5"/></url>', "<rs:md> for http://e.org/a has hash='md5'"),
        ("<url><loc>http://e.org/a</loc><loc>http://e.org/b</loc></url>", "<url> for http://e.org/a has more than one <loc>"),
        ("<url><loc> </loc></url>", "<url> #1 has an empty <loc>"),
    ],
)
def test_a_bad_resource_entry_is_worded_by_the_step_by_step_reading(entry: str, message: str) -> None:
    with pytest.raises(DocumentParseError, match=re.escape(message)):
        _read((RL_OPEN + entry + "</urlset>").encode())

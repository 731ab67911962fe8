"""Where a loc lands: each path segment percent-decoded once, so the copy has the Source's own
names; names no file system can hold get the documented `%%` escape, which is reversible and
never equal to a real name or another escape; hosts that are no DNS name or IP get no folder."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsnotify.subscriber.sync.sink import (
    FolderSink,
    LocRefusedError,
    escape_name,
    unescape_name,
)


@pytest.mark.parametrize(("loc", "relative"), [
    ("http://h.example/x%20y.txt", "h.example/x y.txt"),
    ("http://h.example/x%2520y.txt", "h.example/x%20y.txt"),
    ("http://h.example:8080/%E6%97%A5%E6%9C%AC/caf%C3%A9%23%3F+.txt", "h.example_8080/日本/café#?+.txt"),
    ("http://h.example/a/", "h.example/a/%%"),                   # the empty last segment, escaped
    ("http://h.example", "h.example/%%"),
    ("http://h.example/d/%2E%2E", "h.example/d/%%.."),
    ("http://h.example/a%2Fb", "h.example/%%a%2Fb"),
    ("http://h.example/nul%00", "h.example/%%nul%00"),
    ("http://h.example/%FF", "h.example/%%%FF"),
    ("http://h.example/%25%25x", "h.example/%%%25%25x"),         # a real name starting with the escape
    ("http://h.example/.partial-7", "h.example/%%.partial-7"),   # a real name like our temp files
    ("http://h.example/q?a=1&b=%2F", "h.example/%%q?a=1&b=%252F"),
    ("http://[::1]:9/x", "::1_9/x"),
])
def test_locs_land_at_their_decoded_names(tmp_path, loc, relative):
    sink = FolderSink(tmp_path)
    assert sink.relative(sink.path_for(loc)) == relative


@pytest.mark.parametrize("loc", ["http://.rsnotify/state.db", "http://a_b/x", "http://-x.example/y",
                                 "ftp://h.example/x", "http://h.example:99999/x", "http:///x"])
def test_hosts_that_are_no_dns_name_or_ip_get_no_folder(tmp_path, loc):
    with pytest.raises(ValueError, match="cannot store"):
        FolderSink(tmp_path).path_for(loc)


def test_a_name_over_the_limit_is_shortened_with_its_hash(tmp_path):
    sink = FolderSink(tmp_path)
    one, two = (sink.place("http://h.example/" + "n" * 300 + tail) for tail in ("1", "2"))
    assert one.path != two.path and one.escaped and all(len(p.name.encode()) <= 255 for p in (one.path, two.path))
    assert one.path.name.startswith("%%nnn") and one.path.name.count("%%") == 2
    assert unescape_name(one.path.name) is None      # its loc is in the state, not in its name


@given(st.binary(max_size=40), st.one_of(st.none(), st.text(max_size=10)))
def test_escaping_is_one_to_one_and_reversible(raw, query):
    name, reason = escape_name(raw, query)
    assert "/" not in name and "\x00" not in name and name not in ("", ".", "..")
    assert unescape_name(name) == (raw, query)
    assert (reason is None) == (not name.startswith("%%"))


def test_a_loc_deeper_than_any_real_tree_gets_no_place(tmp_path):
    sink = FolderSink(tmp_path)
    with pytest.raises(LocRefusedError, match="more than 128 path segments") as refused:
        sink.path_for("http://h.example/" + "a/" * 200 + "x")
    assert refused.value.rule == "depth"
    deep = sink.path_for("http://h.example/" + "a/" * 120 + "x")      # deep but fine: two fds at a time
    sink.write_small(deep, b"deep")
    assert sink.is_file(deep) and deep.read_bytes() == b"deep"
    assert sink.delete(deep) and not (tmp_path / "h.example" / "a").exists()

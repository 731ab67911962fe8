"""The one-call shortcuts of the folder sink (openat2, renameat2: sync/beneath.py) keep every
rule of the step-by-step path: a link on the way or at the name is refused and left alone, a
folder or file in the way is a conflict, a taken name is replaced only after its check, and no
temp file is left behind."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rsnotify.subscriber.sync import beneath
from rsnotify.subscriber.sync.sink import FolderSink, PathConflictError, SymlinkRefusedError

LINUX = sys.platform == "linux"


def _leftovers(root: Path) -> list[str]:
    return [p.name for p in root.rglob(".partial-*")]


@pytest.mark.skipif(not LINUX, reason="openat2 and renameat2 are Linux calls")
def test_the_calls_are_used_here() -> None:
    # Linux >= 5.6 and glibc >= 2.28 (the suite's machine): the shortcuts are taken, so the
    # tests below check them, not only the step-by-step path.
    assert beneath.available() == (True, True)


def test_writes_land_in_new_and_known_folders_and_replace_a_file(tmp_path: Path) -> None:
    sink = FolderSink(tmp_path / "copy")
    first, second = sink.path_for("http://example.org/a/b/1"), sink.path_for("http://example.org/a/b/2")
    sink.write_small(first, b"one")          # folders made on the way (the step-by-step path)
    sink.write_small(second, b"two")         # the folder is there: one call each
    sink.write_small(first, b"one again")    # the name is taken by a file: checked, then replaced
    assert (first.read_bytes(), second.read_bytes()) == (b"one again", b"two")
    assert _leftovers(tmp_path) == []


def test_a_delete_run_again_after_its_file_went_removes_the_folders_left_empty(tmp_path: Path) -> None:
    # a sync killed between the unlink and the folders' removal (or before the record's commit)
    # runs the delete again: the file is gone, the folders it leaves empty go now (diff -r clean)
    sink = FolderSink(tmp_path / "copy")
    gone, kept = sink.path_for("http://example.org/a/b/1"), sink.path_for("http://example.org/a/2")
    sink.write_small(gone, b"one")
    sink.write_small(kept, b"two")
    os.unlink(gone)
    assert sink.delete(gone) is False
    assert not gone.parent.exists() and kept.read_bytes() == b"two"     # a/b went, a (not empty) stays


def test_a_link_on_the_way_or_at_the_name_is_refused_and_kept(tmp_path: Path) -> None:
    sink = FolderSink(tmp_path / "copy")
    outside = tmp_path / "outside"
    outside.mkdir()
    sink.write_small(sink.path_for("http://example.org/real/x"), b"x")
    host = tmp_path / "copy" / "example.org"
    (host / "linked").symlink_to(outside, target_is_directory=True)
    (host / "real" / "name").symlink_to(outside / "target")
    with pytest.raises(SymlinkRefusedError):
        sink.write_small(sink.path_for("http://example.org/linked/y"), b"y")
    with pytest.raises(SymlinkRefusedError):
        sink.write_small(sink.path_for("http://example.org/real/name"), b"z")
    assert list(outside.iterdir()) == []
    assert (host / "linked").is_symlink() and (host / "real" / "name").is_symlink()
    assert _leftovers(tmp_path) == []


def test_a_folder_or_file_in_the_way_is_a_conflict(tmp_path: Path) -> None:
    sink = FolderSink(tmp_path / "copy")
    sink.write_small(sink.path_for("http://example.org/f/inner"), b"i")
    sink.write_small(sink.path_for("http://example.org/file"), b"f")
    with pytest.raises(PathConflictError, match="a folder of that name exists"):
        sink.write_small(sink.path_for("http://example.org/f"), b"where a folder is")
    with pytest.raises(PathConflictError, match="a file of that name exists"):
        sink.write_small(sink.path_for("http://example.org/file/below"), b"below a file")
    assert sink.path_for("http://example.org/file").read_bytes() == b"f"
    assert _leftovers(tmp_path) == []


@pytest.mark.skipif(not LINUX, reason="openat2 and renameat2 are Linux calls")
def test_the_calls_answer_only_the_plain_case(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "link").symlink_to(root / "a")
    (root / "a" / "file").write_bytes(b"")
    fd = beneath.open_folder(str(root), ("a", "b"))
    assert fd is not None
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(root / "a" / "b"))
        (root / "a" / "b" / "tmp").write_bytes(b"new")
        (root / "a" / "b" / "tmp2").write_bytes(b"newer")
        (root / "a" / "b" / "dangling").symlink_to(tmp_path / "nowhere")
        assert beneath.rename_new(fd, "tmp", "name") is True
        assert beneath.rename_new(fd, "tmp2", "name") is False          # taken: nothing renamed
        assert beneath.rename_new(fd, "tmp2", "dangling") is False      # a link, even dangling
        assert (root / "a" / "b" / "name").read_bytes() == b"new" and (root / "a" / "b" / "tmp2").exists()
    finally:
        os.close(fd)
    for folders in (("link", "b"), ("a", "missing"), ("a", "file"), ("..", "root", "a"), ()):
        assert beneath.open_folder(str(root), folders) is None, folders


@pytest.mark.skipif(not LINUX, reason="openat2 and renameat2 are Linux calls")
def test_a_root_named_through_a_link_is_followed_and_links_below_it_still_refused(tmp_path: Path) -> None:
    # The one call from DIR's full path refuses every link on it; DIR's own path as the user
    # named it may hold one, which is followed (as before), while a link below DIR never is.
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "link").symlink_to(root / "a")
    named = tmp_path / "named"
    named.symlink_to(root, target_is_directory=True)
    for given in (root, named):
        fd = beneath.open_folder(str(given), ("a", "b"))
        assert fd is not None, given
        try:
            assert os.path.samestat(os.fstat(fd), os.stat(root / "a" / "b"))
        finally:
            os.close(fd)
        for folders in (("link", "b"), ("a", "..", ".."), ("a/../..", "x"), ("a", "b", "..", "..", "..")):
            assert beneath.open_folder(str(given), folders) is None, (given, folders)   # a link, or out of DIR

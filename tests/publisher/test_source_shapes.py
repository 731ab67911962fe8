"""`rsnotify source` sees a file that became a folder (and the reverse) in the batch of file
events that made it: the delete of the old shape goes out with (and before) the new one, not
at the next full rescan."""
from __future__ import annotations

from pathlib import Path

from rsnotify.publisher.source.folder import Folder, changes_against

BASE = "http://127.0.0.1:1/d/"


def _changes(folder: Folder, recorded: dict[str, str | None], *paths) -> list[tuple[str, str]]:
    present, gone = folder.states(paths)
    return [(c.loc.removeprefix(BASE), c.change.value)
            for c in changes_against(present, recorded, complete=False, gone=gone)]


def test_a_file_that_became_a_folder_is_deleted_in_the_same_batch(tmp_path):
    folder = Folder(tmp_path, BASE)
    (tmp_path / "a.txt").write_text("a file")
    recorded = {loc: state.hash for loc, state in folder.scan().items()}
    (tmp_path / "a.txt").unlink()
    (tmp_path / "a.txt").mkdir()
    (tmp_path / "a.txt" / "in.txt").write_text("inside the folder")
    # watchfiles reports both paths in one batch
    assert _changes(folder, recorded, tmp_path / "a.txt", tmp_path / "a.txt" / "in.txt") == [
        ("a.txt", "deleted"), ("a.txt/in.txt", "created")]


def test_a_folder_that_became_a_file_is_deleted_in_the_same_batch(tmp_path):
    folder = Folder(tmp_path, BASE)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("x")
    (tmp_path / "d" / "y.txt").write_text("y")
    recorded = {loc: state.hash for loc, state in folder.scan().items()}
    for name in ("x.txt", "y.txt"):
        (tmp_path / "d" / name).unlink()
    (tmp_path / "d").rmdir()
    (tmp_path / "d").write_text("now a file")
    assert _changes(folder, recorded, tmp_path / "d") == [
        ("d/x.txt", "deleted"), ("d/y.txt", "deleted"), ("d", "created")]


def test_a_file_still_being_written_is_never_listed_with_a_length_its_hash_does_not_have(tmp_path):
    # A writer appends while the Source looks at the file again and again (what its change
    # events make it do): every state it gives must describe one moment of the file, a length
    # and the hashes of exactly that many bytes, or a Destination would be told a length that
    # the finished file's hash contradicts. Eight files: one race lost is enough to fail.
    import hashlib
    import threading

    folder = Folder(tmp_path, BASE)
    chunk = bytes(range(256)) * 256           # 64 KiB
    chunks = 160
    for number in range(8):
        path = tmp_path / f"growing{number}.bin"
        path.write_bytes(b"")
        done = threading.Event()

        def write(path: Path = path, done: threading.Event = done) -> None:
            with path.open("ab") as handle:
                for _ in range(chunks):
                    handle.write(chunk)
                    handle.flush()
            done.set()

        writer = threading.Thread(target=write)
        writer.start()
        seen = []
        while not done.is_set():
            present, _ = folder.states([path])
            seen.extend(present.values())
        writer.join()
        present, _ = folder.states([path])
        seen.extend(present.values())
        final = path.read_bytes()
        assert len(final) == chunks * len(chunk)
        for state in seen:
            prefix = final[:state.length]
            assert state.hash == f"md5:{hashlib.md5(prefix).hexdigest()} sha-256:{hashlib.sha256(prefix).hexdigest()}", \
                f"listed length {state.length} with the hashes of other bytes"
        assert seen[-1].length == len(final)     # once settled, the whole file is listed


class _DeletedWhileWalked(Folder):
    """A Folder whose folder walk deletes `victim` right after listing it, as a test's quick
    create-then-delete can do between the watcher's two looks at one batch."""

    victim: Path

    def _walk(self, top):
        for path in super()._walk(top):
            yield path
            if path == self.victim:
                path.unlink()


def test_a_file_deleted_between_two_looks_in_one_batch_is_published_as_gone(tmp_path):
    folder = _DeletedWhileWalked(tmp_path, BASE)
    recorded = {loc: state.hash for loc, state in folder.scan().items()}
    (tmp_path / "new").mkdir()
    for name in ("keep.txt", "brief.txt"):
        (tmp_path / "new" / name).write_text(name)
    folder.victim = tmp_path / "new" / "brief.txt"
    # the batch names the new folder and the file: the walk saw it, its own look did not
    present, gone = folder.states([tmp_path / "new", tmp_path / "new" / "brief.txt"])
    assert sorted(loc.removeprefix(BASE) for loc in present) == ["new/keep.txt"] and gone == {BASE + "new/brief.txt"}
    assert [(c.loc.removeprefix(BASE), c.change.value)
            for c in changes_against(present, recorded, complete=False, gone=gone)] == [("new/keep.txt", "created")]

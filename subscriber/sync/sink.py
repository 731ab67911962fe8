"""The folder sink: where a loc's bytes live under DIR, and the file operations on them.

Files live at DIR/<host>[_<port>]/<path>; a path ending in "/" is stored as `_index`, a query
is kept percent-encoded in the last segment. No loc can reach outside DIR (".." segments are
dropped, the resolved path is checked), and DIR/.rsnotify (the state) is never a target,
because a host name cannot start with ".". Bodies go to a `.partial-*` temp file beside the
target and are renamed into place only when complete and checked.
"""
from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote, unquote, urlsplit

INDEX_NAME = "_index"      # the file for a URL whose path ends with "/"
PARTIAL_PREFIX = ".partial-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._~!$&'()*+,;=@%-]")


class PathConflictError(OSError):
    """The loc's file cannot exist: a file stands where a folder is needed, or the reverse."""


class FolderSink:
    """Resources as files under `root`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self._root_text = str(self.root)
        self._root_prefix = os.path.join(self._root_text, "")
        self._folders: set[str] = set()
        self._counter = itertools.count()

    def path_for(self, loc: str) -> Path:
        """The local file for `loc`; ValueError for a URL that is not http(s) with a host."""
        parts = urlsplit(loc)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"cannot store {loc!r}: expected an absolute http or https URL")
        host = parts.hostname + (f"_{parts.port}" if parts.port else "")
        segments = [_safe_segment(unquote(s)) for s in parts.path.split("/") if s not in ("", ".", "..")]
        if not segments or parts.path.endswith("/"):
            segments.append(INDEX_NAME)
        if parts.query:
            segments[-1] += "%3F" + quote(parts.query, safe="")
        # Every segment is sanitised ("/" and ".." cannot survive _safe_segment), so a lexical
        # check suffices; it spares the lstat per path component that resolve() costs.
        joined = os.path.normpath(os.path.join(self._root_text, _safe_segment(host), *segments))
        if not joined.startswith(self._root_prefix):
            raise ValueError(f"cannot store {loc!r}: its path leaves {self.root}")
        return Path(joined)

    def relative(self, path: Path) -> str:
        text = str(path)
        if text.startswith(self._root_prefix):   # every path_for path: a slice, not pathlib's walk
            return text[len(self._root_prefix):].replace(os.sep, "/")
        return path.relative_to(self.root).as_posix()

    def absolute(self, relative: str) -> Path:
        return self.root / relative

    def write_small(self, path: Path, body: bytes) -> None:
        """Write a whole (small) body beside `path`, then rename it into place."""
        fd, tmp = self._create_partial(path)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
            os.close(fd)
            fd = -1
            self.install(Path(tmp), path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            self.discard(Path(tmp))
            raise

    def open_partial(self, path: Path) -> tuple[BinaryIO, Path]:
        """A new temp file beside `path`. PathConflictError when the folder cannot exist."""
        fd, tmp = self._create_partial(path)
        return os.fdopen(fd, "wb"), Path(tmp)

    def _create_partial(self, path: Path) -> tuple[int, str]:
        folder = os.path.dirname(path)
        self._ensure_folder(folder)
        for _ in range(3):
            tmp = os.path.join(folder, f"{PARTIAL_PREFIX}{os.getpid()}-{next(self._counter)}")
            try:
                return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), tmp
            except FileNotFoundError:        # the folder went away (a delete emptied it)
                self._folders.discard(folder)
                self._ensure_folder(folder)
            except FileExistsError:          # left by an earlier process with the same pid
                os.unlink(tmp)
        raise PathConflictError(f"cannot create a temporary file in {folder}")

    def _ensure_folder(self, folder: str) -> None:
        # Folders made (or found) before are remembered: one mkdir per folder, not per file.
        if folder in self._folders:
            return
        try:
            os.makedirs(folder, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise PathConflictError(f"cannot create folder {folder}: a file of that name exists") from exc
        if len(self._folders) > 100_000:
            self._folders.clear()
        self._folders.add(folder)

    @staticmethod
    def install(tmp: Path, path: Path) -> None:
        try:
            os.replace(tmp, path)
        except IsADirectoryError as exc:
            tmp.unlink(missing_ok=True)
            raise PathConflictError(f"cannot store a file at {path}: a folder of that name exists") from exc

    @staticmethod
    def discard(tmp: Path) -> None:
        tmp.unlink(missing_ok=True)

    def delete(self, path: Path) -> bool:
        """Remove the file (and folders left empty, up to its host folder); True if it existed."""
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return False
        except IsADirectoryError:
            return False
        parent = path.parent
        while parent != self.root and parent.parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
        return True

    def walk(self):  # type: ignore[no-untyped-def]
        """Every stored file (relative path), skipping the state folder and temp files."""
        for folder, dirs, files in os.walk(self.root):
            if Path(folder) == self.root:
                dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                if not name.startswith(PARTIAL_PREFIX):
                    yield Path(folder, name).relative_to(self.root).as_posix()


def _safe_segment(segment: str) -> str:
    cleaned = _UNSAFE.sub(lambda m: quote(m.group(0), safe=""), segment)
    return cleaned if cleaned not in ("", ".", "..") else "_"

"""A folder seen as a Source's resources: which files are served under which URL, their
state (length, sha-256 and md5, type, mtime), and the changes against what the change memory
last recorded.

Only regular files inside the folder count: a symlink whose target leaves it is neither
listed nor served. Paths are percent-encoded in the URLs. File reads only; no network.
"""
from __future__ import annotations

import hashlib
import logging
import mimetypes
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, unquote

from rsnotify.notification import ChangeType, ResourceChange

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FileState:
    """What a file is now: enough to tell a change and to describe it in a list."""

    loc: str
    path: Path
    length: int
    hash: str            # "md5:<hex> sha-256:<hex>", as written in rs:md/@hash
    media_type: str
    lastmod: datetime
    mtime_ns: int

    def hashes(self) -> tuple[tuple[str, str], ...]:
        return tuple((a, h) for a, _, h in (token.partition(":") for token in self.hash.split()))


class Folder:
    """The files of `root` served under `base_url` (which ends with "/").

    `reserved`: top-level names the Source serves itself (its lists); files with those names
    are skipped with a warning. Remembers each file's (mtime, size) so a rescan re-hashes
    only files that changed.
    """

    def __init__(self, root: str | os.PathLike[str], base_url: str, reserved: Iterable[str] = ()) -> None:
        self.root = Path(root).resolve()
        self.base_url = base_url
        self._reserved = frozenset(reserved)
        self._known: dict[Path, FileState] = {}

    # -- URLs and paths --

    def loc(self, path: Path) -> str:
        relative = path.relative_to(self.root).as_posix()
        return self.base_url + quote(relative, safe="/")

    def path_for(self, relative_url: str) -> Path | None:
        """The file that a URL path below the base serves, or None (not one of ours)."""
        relative = unquote(relative_url)
        if not relative or relative.startswith("/") or "\x00" in relative:
            return None
        candidate = self.root / relative
        if not self._is_inside(candidate) or not candidate.is_file():
            return None
        if self._is_reserved(candidate):
            return None
        return candidate

    def _is_inside(self, path: Path) -> bool:
        try:
            path.resolve().relative_to(self.root)
        except (ValueError, OSError):
            return False
        return True

    def _is_reserved(self, path: Path) -> bool:
        return path.parent == self.root and any(
            path.name == name or (name.endswith("*") and path.name.startswith(name[:-1])) for name in self._reserved
        )

    # -- state --

    def scan(self) -> dict[str, FileState]:
        """Every served file's state, by loc."""
        return {state.loc: state for state in self._states(self._walk(self.root))}

    def states(self, paths: Iterable[Path]) -> tuple[dict[str, FileState], set[str]]:
        """The state of each path that is (or is under) a served file now, and the locs of
        remembered files at or under the paths that are gone."""
        present: dict[str, FileState] = {}
        gone: set[str] = set()
        for path in map(Path, paths):
            if path.is_dir():
                found = {state.path: state for state in self._states(self._walk(path))}
                before = self._under(path)
            else:
                state = self._state(path) if path.exists() else None
                found = {path: state} if state is not None else {}
                # A path that is no file now and was none before may be a removed folder.
                before = [path] if path in self._known else self._under(path)
            present.update({state.loc: state for state in found.values()})
            for known in before:
                if known not in found:
                    gone.add(self._known.pop(known).loc)
        return present, gone

    def _under(self, folder: Path) -> list[Path]:
        prefix = f"{folder}{os.sep}"
        return [known for known in self._known if str(known).startswith(prefix)]

    def _walk(self, top: Path) -> Iterator[Path]:
        # Symlinked directories are not descended into (os.walk's default): their files would
        # have two URLs, or none inside the root.
        for directory, dirnames, filenames in os.walk(top, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                yield Path(directory) / name

    def _states(self, paths: Iterable[Path]) -> Iterator[FileState]:
        for path in paths:
            state = self._state(path)
            if state is not None:
                yield state

    def _state(self, path: Path) -> FileState | None:
        if self._is_reserved(path):
            log.warning("%s is not served: the Source serves its own document under that name", path)
            return None
        try:
            if not self._is_inside(path):
                log.warning("%s is not served: it is a symlink leaving %s", path, self.root)
                return None
            stat = path.stat()
            if not path.is_file():
                return None
            known = self._known.get(path)
            if known is not None and known.mtime_ns == stat.st_mtime_ns and known.length == stat.st_size:
                return known
            if not _is_text(path):
                log.warning("%r is not served: its name is not valid UTF-8, so it has no URL", str(path))
                return None
            state = FileState(
                self.loc(path), path, stat.st_size, _hash(path), media_type(path),
                datetime.fromtimestamp(stat.st_mtime, UTC), stat.st_mtime_ns,
            )
        except OSError as exc:  # vanished or unreadable while we looked: a later event tells
            log.debug("cannot read %s: %s", path, exc)
            return None
        self._known[path] = state
        return state


def changes_against(
    current: dict[str, FileState], recorded: dict[str, str | None], *, complete: bool, gone: Iterable[str] = ()
) -> list[ResourceChange]:
    """The resource changes that take the memory's `recorded` (loc -> hash) to `current`.

    `complete`: `current` is the whole folder, so recorded locs missing from it are deleted;
    otherwise only the `gone` locs are. Changes carry no datetime: the publisher dates them.
    """
    changes: list[ResourceChange] = []
    for loc, state in sorted(current.items()):
        before = recorded.get(loc, _ABSENT)
        if before == state.hash:
            continue
        change = ChangeType.CREATED if before is _ABSENT else ChangeType.UPDATED
        changes.append(
            ResourceChange(loc, change, None, state.lastmod, state.hashes(), state.length, state.media_type)
        )
    deleted = set(recorded) - set(current) if complete else {loc for loc in gone if loc in recorded and loc not in current}
    changes.extend(ResourceChange(loc, ChangeType.DELETED) for loc in sorted(deleted))
    return changes


_ABSENT = "\x00absent"


def _hash(path: Path) -> str:
    md5 = hashlib.md5(usedforsecurity=False)
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            md5.update(chunk)
            sha.update(chunk)
    return f"md5:{md5.hexdigest()} sha-256:{sha.hexdigest()}"


def _is_text(path: Path) -> bool:
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # bytes os.fsdecode kept as surrogates
        return False
    return True


def media_type(path: Path) -> str:
    """The file's media type, guessed from its name."""
    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"

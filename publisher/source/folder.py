"""A folder seen as a Source's resources: which files are served under which URL, their
state (length, sha-256 and md5, type, mtime), and the changes against what the change memory
last recorded.

Only regular files inside the folder count: a symlink whose target leaves it is neither
listed nor served, and neither is an excluded file (Exclusions: hidden files and folders, editor
scratch, VCS folders and the user's globs). Paths are percent-encoded in the URLs. File reads
only; no network.
"""
from __future__ import annotations

import fnmatch
import hashlib
import logging
import mimetypes
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from urllib.parse import quote, unquote

from rsnotify.copies import STATE_DIR, STATE_FILE, is_copy
from rsnotify.notification import ChangeType, ResourceChange

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024
# Characters a URL path segment may hold as they are (RFC 3986 pchar: sub-delims, ":" and "@",
# beside the unreserved ones quote() always keeps). Left unescaped because a Destination that
# maps a loc to a file name without decoding it (resync does) then copies "a+b.txt" as itself,
# not as "a%2Bb.txt"; what must be escaped (space, %, #, ?, non-ASCII, ...) still is.
_PATH_SAFE = "/!$&'()*+,;=:@"


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


# Never served, whatever the options: a VCS folder holds the history, remotes and often credentials
# of a checkout someone points `rsnotify source` at.
VCS_FOLDERS = frozenset({".git", ".hg", ".svn", ".bzr", "CVS", "_darcs", ".jj", ".pijul", ".fossil"})
# Editor scratch (backups, swap and autosave files): half-written copies, not resources.
SCRATCH_GLOBS = ("*~", "*.swp", "*.swo", "#*#", ".#*")


@dataclass(frozen=True, slots=True)
class Exclusions:
    """Which paths of a folder are not resources: VCS folders and editor scratch always, hidden
    files and folders (`.*`) unless `include_hidden`, and each glob of `globs`. A glob matches
    a file or folder by its name or by its path relative to the folder (`build/*.o`); an
    excluded folder excludes everything below it."""

    globs: tuple[str, ...] = ()
    include_hidden: bool = False

    def excludes(self, relative: PurePosixPath) -> bool:
        """Is the file or folder at `relative` (to the root) excluded, or inside an excluded folder?"""
        parts = relative.parts
        for depth, name in enumerate(parts, 1):
            if name in VCS_FOLDERS or (name.startswith(".") and not self.include_hidden):
                return True
            path = "/".join(parts[:depth])
            if any(fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(path, g) for g in self.globs):
                return True
        return bool(parts) and any(fnmatch.fnmatchcase(parts[-1], g) for g in SCRATCH_GLOBS)


class Folder:
    """The files of `root` served under `base_url` (which ends with "/").

    `reserved`: top-level names the Source serves itself (its lists); files with those names
    are skipped with a warning, unless `owns_reserved` (the Source writes them into this very
    folder, with --write). `exclusions`: paths that are no resources (never listed, served or
    published). Remembers each file's (mtime, size) so a rescan re-hashes only files that changed.
    """

    def __init__(self, root: str | os.PathLike[str], base_url: str, reserved: Iterable[str] = (),
                 exclusions: Exclusions = Exclusions(), *, owns_reserved: bool = False) -> None:
        self.root = Path(root).resolve()
        self.base_url = base_url
        self._reserved = frozenset(reserved)
        self.exclusions = exclusions
        self._owns_reserved = owns_reserved
        self._known: dict[Path, FileState] = {}
        self._copies: set[Path] = set()    # copies found inside the root (each warned about once)

    # -- URLs and paths --

    def loc(self, path: Path) -> str:
        relative = path.relative_to(self.root).as_posix()
        return self.base_url + quote(relative, safe=_PATH_SAFE)

    def path_for(self, relative_url: str) -> Path | None:
        """The file that a URL path below the base serves, or None (not one of ours)."""
        relative = unquote(relative_url)
        if not relative or relative.startswith("/") or "\x00" in relative:
            return None
        candidate = self.root / relative
        if not self._is_inside(candidate) or not candidate.is_file():
            return None
        if self._is_reserved(candidate) or self.is_excluded(candidate) or self._in_copy(candidate.parent):
            return None
        return candidate

    def is_excluded(self, path: Path) -> bool:
        """Is `path` excluded, by the name it is reached under or, for a symlink, by its target's?"""
        try:
            named = PurePosixPath(path.relative_to(self.root).as_posix())
        except ValueError:
            return True
        if self.exclusions.excludes(named):
            return True
        try:
            target = PurePosixPath(path.resolve().relative_to(self.root).as_posix())
        except (ValueError, OSError):
            return False  # a target outside the folder is refused as such (see _is_inside)
        return self.exclusions.excludes(target)

    def _is_inside(self, path: Path) -> bool:
        try:
            path.resolve().relative_to(self.root)
        except (ValueError, OSError):
            return False
        return True

    def _in_copy(self, folder: Path) -> bool:
        """Is `folder`, or a folder between it and the root, a copy that `rsnotify sync` keeps
        (rsnotify.copies)? Such a copy is never served: it may be a copy of this very Source."""
        try:
            parts = folder.relative_to(self.root).parts
        except ValueError:
            return False
        return any(self._is_copy(self.root.joinpath(*parts[:depth])) for depth in range(len(parts), 0, -1))

    def _is_copy(self, folder: Path) -> bool:
        if not is_copy(folder):
            return False
        if folder not in self._copies:
            self._copies.add(folder)
            log.warning("%s is not served: it is a copy that rsnotify sync keeps (it holds %s/%s), and a copy "
                        "inside the folder it copies would be copied into itself", folder, STATE_DIR, STATE_FILE)
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
                # A file that became this folder is gone now, in the same batch as the files
                # that appeared in it (not at the next rescan).
                before = self._under(path) + ([path] if path in self._known else [])
            else:
                # A path that was no file before may be a removed folder (or one that became
                # this file): asked before _state() remembers the path as a file.
                before = [path] if path in self._known else self._under(path)
                state = self._state(path) if path.exists() and not self._in_copy(path.parent) else None
                found = {path: state} if state is not None else {}
            present.update({state.loc: state for state in found.values()})
            for known in before:
                if known not in found:
                    gone.add(self._known.pop(known).loc)
        # A file looked at twice in one batch (its folder walked, and its own event) may have
        # been deleted or made between the two looks: both answers at once would publish it as
        # present while forgetting it, and its deletion would then never go out (nothing known
        # is left to be gone). It is looked at once more: what is there now counts.
        for loc in gone & present.keys():
            state = present[loc]
            if state.path.is_file():
                gone.discard(loc)
                self._known[state.path] = state
            else:
                del present[loc]
        return present, gone

    def _under(self, folder: Path) -> list[Path]:
        prefix = f"{folder}{os.sep}"
        return [known for known in self._known if str(known).startswith(prefix)]

    def _walk(self, top: Path) -> Iterator[Path]:
        # Symlinked directories are not descended into (os.walk's default): their files would
        # have two URLs, or none inside the root.
        if top != self.root and (top.is_symlink() or self.is_excluded(top) or self._in_copy(top)):
            # a change event names the link itself: walking it would serve its files under a
            # second URL, or (a link to /) visit the whole disk with a warning per file
            return
        for directory, dirnames, filenames in os.walk(top, followlinks=False):
            # excluded folders are not even walked (a .git or node_modules holds many files)
            dirnames[:] = sorted(d for d in dirnames if not self.is_excluded(Path(directory) / d)
                                 and not self._is_copy(Path(directory) / d))
            for name in sorted(filenames):
                yield Path(directory) / name

    def _states(self, paths: Iterable[Path]) -> Iterator[FileState]:
        for path in paths:
            state = self._state(path)
            if state is not None:
                yield state

    def _state(self, path: Path) -> FileState | None:
        if self.is_excluded(path):
            log.debug("%s is not served: it is excluded", path)
            return None
        if self._is_reserved(path):
            if self._owns_reserved:
                return None
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
            with path.open("rb") as handle:
                before = os.fstat(handle.fileno())
                digest, length = _hash(handle)
                after = os.fstat(handle.fileno())
            if length != after.st_size or (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
                # Still being written: a length and a hash of different moments would be listed
                # together, and the hash of the finished file would then match and hide the
                # length's error for good. The write's own later event (or the rescan) looks again.
                log.debug("%s changed while it was read; it is looked at again when it settles", path)
                return known
            state = FileState(
                self.loc(path), path, length, digest, media_type(path),
                datetime.fromtimestamp(after.st_mtime, UTC), after.st_mtime_ns,
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
    # Deletes first: a file that became a folder (or the reverse) is gone before its new
    # shape appears, so a Destination frees the name before it needs it.
    deleted = set(recorded) - set(current) if complete else {loc for loc in gone if loc in recorded and loc not in current}
    changes = [ResourceChange(loc, ChangeType.DELETED) for loc in sorted(deleted)]
    for loc, state in sorted(current.items()):
        before = recorded.get(loc, _ABSENT)
        if before == state.hash:
            continue
        change = ChangeType.CREATED if before is _ABSENT else ChangeType.UPDATED
        changes.append(
            ResourceChange(loc, change, None, state.lastmod, state.hashes(), state.length, state.media_type)
        )
    return changes


_ABSENT = "\x00absent"


def _hash(handle: BinaryIO) -> tuple[str, int]:
    """The hashes of everything `handle` reads, and how many bytes that was."""
    md5 = hashlib.md5(usedforsecurity=False)
    sha = hashlib.sha256()
    length = 0
    while chunk := handle.read(_CHUNK):
        md5.update(chunk)
        sha.update(chunk)
        length += len(chunk)
    return f"md5:{md5.hexdigest()} sha-256:{sha.hexdigest()}", length


def _is_text(path: Path) -> bool:
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # bytes os.fsdecode kept as surrogates
        return False
    return True


def media_type(path: Path) -> str:
    """The file's media type, guessed from its name."""
    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"

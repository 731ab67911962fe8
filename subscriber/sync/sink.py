"""The folder sink: where a loc's bytes live under DIR, and the file operations on them.

Names. A loc `http(s)://<host>[:<port>]/<p1>/<p2>/…` lands at `DIR/<host>[_<port>]/<n1>/<n2>/…`
where each `n` is its path segment percent-decoded once to UTF-8, so a Source's `SRC/<path>`
has the same name here. A segment that cannot be a file name as it is gets a reversible escape:

    %%<the segment's bytes percent-encoded>                  e.g. `..` -> `%%..`, `a/b` -> `%%a%2Fb`

It is used for a segment that is empty (a trailing "/" or "//"), `.` or `..`, contains "/" or
NUL, is not valid UTF-8, or starts with `%%` (the escape itself) or `.partial-` (the temp
files). A loc with a query keeps it in its last segment, `%%<segment>?<query>`, both
percent-encoded (a literal "?" appears in no other escaped name). The percent-encoding never
makes two "%" in a row, so no real name and no other escape can produce the same text: the
mapping is one-to-one. A name still longer than the file system allows (NAME_MAX, 255 bytes
on most) becomes `%%<encoded prefix>%%<32 hex of its sha-256>`: unique, and reversible through
the state database, which keeps the loc of every path.

Trust. Only hosts that are DNS names or IP literals get a folder (so never DIR/.rsnotify);
every folder on the way is opened with O_NOFOLLOW from DIR down (or at once by openat2 with
RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, see beneath.py), so a symlink inside DIR is refused
(SymlinkRefusedError), never followed; bodies go to a `.partial-*` temp file in the
target's folder and are renamed into place only when complete and checked.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import ipaddress
import itertools
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Self
from urllib.parse import quote_from_bytes, unquote_to_bytes, urlsplit

from . import beneath
from .outcomes import Refusal

ESCAPE = "%%"              # the prefix of every escaped name
PARTIAL_PREFIX = ".partial-"
DEFAULT_NAME_MAX = 255
_SAFE = "-._~!$&'()*+,;=@"   # kept as they are inside an escaped name; everything else is %XX
_HASH_HEX = 32
MAX_DEPTH = 128            # path segments: deeper locs are refused (no real tree needs more)
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_UNPLAIN = re.compile(r"[?#\t\r\n]")   # what makes urlsplit more than a split at "/"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# This process's id in the temp files' names, read once (getpid is a system call per file) and
# again in a forked child, whose temp names must not be its parent's.
_pid = os.getpid()


def _note_pid() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_note_pid)


class LocRefusedError(ValueError):
    """A loc that gets no place under DIR; `rule` says which trust rule."""

    def __init__(self, message: str, rule: Refusal = Refusal.HOST) -> None:
        super().__init__(message)
        self.rule = rule


class PathConflictError(OSError):
    """The loc's file cannot exist: a file stands where a folder is needed, or the reverse."""


class SymlinkRefusedError(OSError):
    """A symlink stands in the loc's path inside DIR: refused, never followed."""


# What a refusal of the Destination's own disk is (as opposed to a name conflict or a link):
# a full or read-only disk, no permission, an I/O error, a size limit.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                         errno.EFBIG})
WRITE_PROBLEM = "cannot write "     # how write_problem's message for a write starts
REMOVE_PROBLEM = "cannot remove "   # ... and for a remove (a delete the disk refused)


def write_problem(exc: OSError, path: Path | str, verb: str = "write") -> str:
    """One line naming the file and the cause of a local write (or remove) failure: a full or
    read-only disk, a folder without permission, an I/O error."""
    cause = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        cause = f"{cause} (the disk is full)"
    elif exc.errno == errno.EFBIG:
        cause = f"{cause} (a file size limit)"
    return f"cannot {verb} {path}: {cause}"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a loc lands, and why any of its names had to be escaped."""

    text: str                       # the file's path, as text (what the fetch path writes to)
    escaped: tuple[str, ...] = ()   # one reason per escaped name ("'..' is not a file name", ...)

    @property
    def path(self) -> Path:
        # built on demand: a baseline writes to `text` and never needs the Path object
        return Path(self.text)


def is_valid_host(host: str) -> bool:
    """A DNS name (letters, digits, hyphens; labels of 1-63; no leading dot) or an IP literal."""
    if not host or len(host) > 253:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    return all(_LABEL.match(label) for label in host.split("."))


def host_folder(loc: str) -> str:
    """`<host>[_<port>]` for an http(s) loc; ValueError when the host is not a valid one."""
    parts = urlsplit(loc)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LocRefusedError(f"cannot store {loc!r}: expected an absolute http or https URL")
    host = parts.hostname
    if not is_valid_host(host):
        raise LocRefusedError(f"cannot store {loc!r}: {host!r} is neither a DNS name nor an IP address")
    try:
        port = parts.port
    except ValueError:
        raise LocRefusedError(f"cannot store {loc!r}: its port is not a number from 0 to 65535") from None
    return host + (f"_{port}" if port is not None else "")


def escape_name(raw: bytes, query: str | None = None, name_max: int = DEFAULT_NAME_MAX) -> tuple[str, str | None]:
    """The file name for one decoded path segment (and the loc's query, for the last one), and
    why it had to be escaped (None when the segment is used as it is)."""
    reason = None if query is None else "it has a query"
    text = None
    if reason is None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            reason = "it is not valid UTF-8"
    if text is not None:
        if text in ("", ".", ".."):
            reason = f"{text!r} is not a file name"
        elif "/" in text or "\x00" in text:
            reason = "it contains '/' or NUL"
        elif text.startswith((ESCAPE, PARTIAL_PREFIX)):
            reason = f"it starts with the reserved {ESCAPE if text.startswith(ESCAPE) else PARTIAL_PREFIX!r}"
        elif len(raw) > name_max:
            reason = f"it is longer than {name_max} bytes"
        else:
            return text, None
    name = ESCAPE + quote_from_bytes(raw, safe=_SAFE)
    if query is not None:
        name += "?" + quote_from_bytes(query.encode("utf-8", "surrogateescape"), safe=_SAFE)
    if len(name.encode()) <= name_max:
        return name, reason
    digest = hashlib.sha256(raw + b"?" + (query or "").encode("utf-8", "surrogateescape")).hexdigest()[:_HASH_HEX]
    room = name_max - len(ESCAPE) * 2 - _HASH_HEX
    prefix = ""
    for byte in raw:                   # whole %XX only
        piece = quote_from_bytes(bytes([byte]), safe=_SAFE)
        if len(prefix) + len(piece) > room:
            break
        prefix += piece
    return f"{ESCAPE}{prefix}{ESCAPE}{digest}", reason


@functools.lru_cache(maxsize=8192)
def _segment_name(segment: str, name_max: int) -> tuple[str, str | None]:
    """`escape_name` of one percent-encoded path segment without a query; cached, since the
    folders of a tree repeat in most of its locs."""
    return escape_name(unquote_to_bytes(segment), None, name_max)


def unescape_name(name: str) -> tuple[bytes, str | None] | None:
    """The path segment (and query) an escaped name stands for; None for a hashed long name
    (its loc is in the state database). A name without the escape is its own segment."""
    if not name.startswith(ESCAPE):
        return name.encode("utf-8"), None
    body = name[len(ESCAPE):]
    if ESCAPE in body:
        return None
    segment, mark, query = body.partition("?")
    return unquote_to_bytes(segment), (unquote_to_bytes(query).decode("utf-8", "surrogateescape") if mark else None)


class FolderSink:
    """Resources as files under `root`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self._root_text = str(self.root)
        self._root_prefix = os.path.join(self._root_text, "")
        self._counter = itertools.count()
        self._hosts: dict[tuple[str, str], str] = {}    # (scheme, netloc) -> its host folder
        self._folders: dict[str, tuple[str, tuple[str, ...]]] = {}   # loc head -> (path text to it, reasons)
        self._made: dict[str, list[int]] = {}   # open temp file -> the folders open_partial made for it
        try:
            self.name_max = int(os.pathconf(self._root_text if self.root.exists() else "/", "PC_NAME_MAX"))
        except (OSError, ValueError, AttributeError):
            self.name_max = DEFAULT_NAME_MAX

    def place(self, loc: str) -> Placement:
        """Where `loc` lands; LocRefusedError (a ValueError) for a URL that is not http(s)
        with a valid host, or one nested deeper than MAX_DEPTH."""
        text, reasons = self._place_text(loc)
        return Placement(text, reasons)

    def path_text(self, loc: str) -> str:
        """`str(self.path_for(loc))` without building the Path (an audit places every listed loc
        and needs a Path only for the few it repairs)."""
        return self._place_text(loc)[0]

    def _place_text(self, loc: str) -> tuple[str, tuple[str, ...]]:
        # Locs of one folder differ only after their last "/": when that tail is a plain segment
        # (no "?", "#", nor the tab/newline urlsplit drops), the folder part placed for an
        # earlier loc with the same head is reused and only the tail is escaped. (Its depth was
        # within MAX_DEPTH with a tail already, so one tail more is too.)
        head, _, tail = loc.rpartition("/")
        known = self._folders.get(head)
        if known is not None and not _UNPLAIN.search(tail):
            prefix, prefix_reasons = known
            name, reason = escape_name(unquote_to_bytes(tail), None, self.name_max)
            return prefix + name, prefix_reasons + ((f"{name}: {reason}",) if reason is not None else ())
        parts = urlsplit(loc)
        # Most locs share a few hosts: the host check (an IP parse, label patterns) is done once each.
        folder = self._hosts.get((parts.scheme, parts.netloc))
        if folder is None:
            folder = host_folder(loc)
            if len(self._hosts) >= 1024:
                self._hosts.clear()
            self._hosts[(parts.scheme, parts.netloc)] = folder
        segments = (parts.path or "/")[1:].split("/") if (parts.path or "/").startswith("/") else \
            parts.path.split("/")
        if len(segments) > MAX_DEPTH:
            raise LocRefusedError(f"cannot store {loc[:200]!r}...: more than {MAX_DEPTH} path segments",
                                  Refusal.DEPTH)
        names: list[str] = []
        reasons: list[str] = []
        for index, segment in enumerate(segments):
            last = index == len(segments) - 1
            if last and parts.query:
                name, reason = escape_name(unquote_to_bytes(segment), parts.query, self.name_max)
            else:
                name, reason = _segment_name(segment, self.name_max)
            names.append(name)
            if reason is not None:
                reasons.append(f"{name}: {reason}")
        # One string: no name holds "/" or is empty, "." or "..", so Path() of it is the same Path
        # as Path(root, folder, *names), at a quarter of the cost.
        prefix = self._root_prefix + folder + "/" + "".join(name + "/" for name in names[:-1])
        if parts.path.startswith("/") and loc[:1] > " " and not _UNPLAIN.search(loc):
            if len(self._folders) >= 4096:
                self._folders.clear()
            # `reason` is still the last name's: the folder part keeps the others
            self._folders[head] = (prefix, tuple(reasons[:-1] if reason is not None else reasons))
        return prefix + names[-1], tuple(reasons)

    def path_for(self, loc: str) -> Path:
        """The local file for `loc`; ValueError for a URL that is not http(s) with a valid host."""
        return self.place(loc).path

    def relative(self, path: Path | str) -> str:
        text = str(path)
        if text.startswith(self._root_prefix):   # every path_for path: a slice, not pathlib's walk
            return text[len(self._root_prefix):].replace(os.sep, "/")
        return Path(path).relative_to(self.root).as_posix()

    def absolute(self, relative: str) -> Path:
        return self.root / relative

    # --- folders, opened without following links ------------------------------------------

    def _parts(self, path: Path | str) -> tuple[str, ...]:
        text = str(path)
        if text.startswith(self._root_prefix) and "//" not in text and "/./" not in text \
                and not text.endswith(("/", "/.")):
            # every path_for path: a split, not pathlib's walk (which would drop those)
            parts: tuple[str, ...] = tuple(text[len(self._root_prefix):].split(os.sep))
        else:
            parts = Path(path).relative_to(self.root).parts
        if not parts or parts[0].startswith("."):
            raise ValueError(f"{path} is not a resource path under {self.root}")
        return parts

    def _open_chain(self, folders: tuple[str, ...], *, create: bool, keep_all: bool = False,
                    made: list[int] | None = None) -> list[int]:
        """Open DIR and each folder below it, none through a symlink; the fds, DIR's first
        (`keep_all`), else only the last one's (each parent is closed once its child is open,
        so a deep path holds two fds at most). `made` gets the index in `folders` of each
        folder this call made (those it made are removed again if a later one fails).

        FileNotFoundError (create=False), PathConflictError (a file in the way),
        SymlinkRefusedError (a link in the way)."""
        try:
            fds = [os.open(self._root_text, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
        except FileNotFoundError:
            if not create:
                raise
            os.makedirs(self._root_text, exist_ok=True)   # DIR itself is the user's choice
            fds = [os.open(self._root_text, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
        try:
            for index, name in enumerate(folders):
                fds.append(self._open_folder(fds[-1], name, create=create, made=made, index=index))
                if not keep_all:
                    os.close(fds.pop(0))
        except BaseException:
            _close(fds)
            if made:
                self.unmake(folders, made)
            raise
        return fds

    def unmake(self, folders: tuple[str, ...], made: list[int]) -> None:
        """Remove the folders of `folders` (their indexes: `made`) that were made for a file
        that was then not written, deepest first, each only while it is empty: a write the
        disk refused leaves the copy as it was, not with an empty folder the Source has not."""
        try:
            fds = self._open_chain(folders[:max(made)], create=False, keep_all=True)
        except (OSError, ValueError):
            return
        try:
            for index in sorted(made, reverse=True):
                try:
                    os.rmdir(folders[index], dir_fd=fds[index])
                except OSError:
                    break         # not empty (another file landed there meanwhile), or gone
        finally:
            _close(fds)

    def _open_nearest(self, folders: tuple[str, ...]) -> int:
        """The fd of the deepest of DIR/folders... that exists (DIR's own when none does), each
        opened from its parent's without following a link; nothing is made. FileNotFoundError
        when DIR itself is missing, PathConflictError / SymlinkRefusedError as `_open_chain`."""
        fd = os.open(self._root_text, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for name in folders:
                try:
                    child = self._open_folder(fd, name, create=False)
                except FileNotFoundError:
                    break
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_folder(self, parent: int, name: str, *, create: bool, made: list[int] | None = None,
                     index: int = 0) -> int:
        for _ in range(3):
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o755, dir_fd=parent)
                except FileExistsError:
                    pass        # made meanwhile (or a file/link: the next open tells)
                else:
                    if made is not None:
                        made.append(index)
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                self._refuse_link(parent, name)
                raise PathConflictError(f"cannot create folder {name!r}: a file of that name exists") from None
        raise PathConflictError(f"cannot create folder {name!r}: it keeps changing")

    @staticmethod
    def _refuse_link(parent: int, name: str) -> None:
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return
        _refuse_if_link(info.st_mode, name)

    def _check_target(self, parent: int, name: str) -> None:
        """The final name may be absent or a file; a folder or a link there is refused."""
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        _refuse_if_link(info.st_mode, name)
        if stat.S_ISDIR(info.st_mode):
            raise PathConflictError(f"cannot store a file at {name!r}: a folder of that name exists")

    # --- writing -------------------------------------------------------------------------

    def write_small(self, path: Path | str, body: bytes) -> None:
        """Write a whole (small) body beside `path`, then rename it into place."""
        parts = self._parts(path)
        # One openat2 and one renameat2 where they do (see beneath.py), else step by step.
        folder = beneath.open_folder(self._root_text, parts[:-1])
        made: list[int] = []
        if folder is None:
            folder = self._open_chain(parts[:-1], create=True, made=made)[-1]
        try:
            fd, tmp = self._create_partial(folder)
            try:
                try:
                    written = os.write(fd, body)    # a small body goes in one write, but need not
                    if written < len(body):
                        view = memoryview(body)[written:]
                        while view:
                            view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
            except BaseException:
                _unlink_quietly(folder, tmp)     # a full disk must not keep half a file beside the copy
                raise
            if not beneath.rename_new(folder, tmp, parts[-1]):
                self._install_at(folder, tmp, parts[-1])
        except BaseException:
            if made:                             # ... nor the folders made for it
                self.unmake(parts[:-1], made)
            raise
        finally:
            os.close(folder)

    def disk_refusal(self, path: Path | str, size: int) -> OSError | None:
        """What the disk says to a file of `size` bytes at `path` now, found without fetching it:
        an empty temp file made and removed in the file's folder, or in its nearest existing
        ancestor when that folder is not there yet (a read-only or forbidden folder, no inode
        left; making the missing folders needs the same), and that folder's free space against
        `size`. The probe changes nothing in the copy: it makes no folder (one made for a file the
        disk then refuses would stay behind as an empty folder the Source does not have) and
        removes only its own temp file. Nothing is reserved either: room taken for a probe would
        fail the sync's other writes on a nearly full disk (its inbox among them), and a file
        system without fallocate would have every byte written. The error (one of DISK_ERRNOS),
        or None when the write may go (or the disk cannot tell)."""
        try:
            parts = self._parts(path)
            folder = self._open_nearest(parts[:-1])
        except (PathConflictError, SymlinkRefusedError, ValueError):
            return None        # not the disk: the retry itself says what it is
        except OSError as exc:
            return exc if exc.errno in DISK_ERRNOS else None
        try:
            fd, tmp = self._create_partial(folder)
        except OSError as exc:
            os.close(folder)
            return exc if exc.errno in DISK_ERRNOS else None
        try:
            room = os.fstatvfs(fd)
        except OSError:
            return None         # cannot tell: the retry finds out
        finally:
            os.close(fd)
            _unlink_quietly(folder, tmp)
            os.close(folder)
        if size > room.f_bavail * room.f_frsize:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return None

    def open_partial(self, path: Path) -> tuple[BinaryIO, Path]:
        """A new temp file beside `path`. PathConflictError when the folder cannot exist,
        SymlinkRefusedError when a link is in the way."""
        parts = self._parts(path)
        made: list[int] = []
        fds = self._open_chain(parts[:-1], create=True, made=made)
        try:
            fd, tmp = self._create_partial(fds[-1])
        except BaseException:
            if made:
                self.unmake(parts[:-1], made)
            raise
        finally:
            _close(fds)
        partial = path.with_name(tmp)
        if made:     # removed again by `discard(..., unmake=True)` when the disk refuses the body
            self._made[str(partial)] = made
        return os.fdopen(fd, "wb"), partial

    def _create_partial(self, folder: int) -> tuple[int, str]:
        for _ in range(3):
            tmp = f"{PARTIAL_PREFIX}{_pid}-{next(self._counter)}"
            try:
                return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                               dir_fd=folder), tmp
            except FileExistsError:          # left by an earlier process with the same pid
                os.unlink(tmp, dir_fd=folder)
        raise PathConflictError("cannot create a temporary file")

    def _install_at(self, folder: int, tmp: str, name: str) -> None:
        try:
            self._check_target(folder, name)
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            _unlink_quietly(folder, tmp)
            raise

    def install(self, tmp: Path, path: Path) -> None:
        """Rename a finished temp file (from open_partial) into place; removes it on failure."""
        self._made.pop(str(tmp), None)
        parts = self._parts(path)
        try:
            fds = self._open_chain(parts[:-1], create=False)
        except FileNotFoundError as exc:
            raise PathConflictError(f"the folder of {path} went away while it was written") from exc
        try:
            self._install_at(fds[-1], tmp.name, parts[-1])
        finally:
            _close(fds)

    def discard(self, tmp: Path, *, unmake: bool = False) -> None:
        """Remove a temp file from open_partial; with `unmake` (the disk refused its body), also
        the folders open_partial made for it, while they are empty. Otherwise (the Source failed:
        the fetch is tried again soon) they stay, so no other fetch into them meets a folder
        removed under it."""
        made = self._made.pop(str(tmp), None)
        try:
            folders = self._parts(tmp)[:-1]
            fds = self._open_chain(folders, create=False)
        except (OSError, ValueError):
            return
        try:
            _unlink_quietly(fds[-1], tmp.name)
        finally:
            _close(fds)
        if unmake and made:
            self.unmake(folders, made)

    # --- reading and deleting -------------------------------------------------------------

    def is_file(self, path: Path | str) -> bool:
        """A regular file is at `path`, reached without any symlink."""
        try:
            parts = self._parts(path)
            fds = self._open_chain(parts[:-1], create=False)
        except (OSError, ValueError):
            return False
        try:
            return stat.S_ISREG(os.stat(parts[-1], dir_fd=fds[-1], follow_symlinks=False).st_mode)
        except OSError:
            return False
        finally:
            _close(fds)

    def kind(self, path: Path) -> str:
        """What stands at `path`, looked at without following any link: "file", "missing",
        "symlink" (a link at the name or in a folder on the way) or "other" (a folder, a device)."""
        try:
            parts = self._parts(path)
            fds = self._open_chain(parts[:-1], create=False)
        except SymlinkRefusedError:
            return "symlink"
        except (OSError, ValueError):
            return "missing"
        try:
            mode = os.stat(parts[-1], dir_fd=fds[-1], follow_symlinks=False).st_mode
        except OSError:
            return "missing"
        finally:
            _close(fds)
        return _kind_of(mode)

    def open_read(self, path: Path) -> BinaryIO:
        """The stored file, opened for reading without following any link (an audit re-hashing
        it must never read through one). SymlinkRefusedError for a link, OSError otherwise."""
        parts = self._parts(path)
        fds = self._open_chain(parts[:-1], create=False)
        try:
            fd = _open_no_link(fds[-1], parts[-1])
        finally:
            _close(fds)
        return os.fdopen(fd, "rb")

    def delete(self, path: Path) -> bool:
        """Remove the file (and folders left empty, up to its host folder); True if it existed.

        SymlinkRefusedError when a link stands in the path (nothing is removed then)."""
        parts = self._parts(path)
        try:
            fds = self._open_chain(parts[:-1], create=False, keep_all=True)
        except (FileNotFoundError, PathConflictError):
            return False
        try:
            try:
                self._check_target(fds[-1], parts[-1])
                os.unlink(parts[-1], dir_fd=fds[-1])
                existed = True
            except FileNotFoundError:
                # gone already: a sync killed after its unlink (before the record's commit, or
                # before the removal below) left the folders; the delete run again removes them
                existed = False
            except PathConflictError:
                return False
            _remove_emptied(parts, fds)
            return existed
        finally:
            _close(fds)

    def move(self, old: Path, new: Path) -> None:
        """Rename a stored file to its new name (a layout migration), no link followed; the
        old folders left empty go. PathConflictError when something is at the new name."""
        old_parts, new_parts = self._parts(old), self._parts(new)
        source = self._open_chain(old_parts[:-1], create=False, keep_all=True)
        try:
            target = self._open_chain(new_parts[:-1], create=True)
            try:
                try:
                    os.stat(new_parts[-1], dir_fd=target[-1], follow_symlinks=False)
                except FileNotFoundError:
                    pass
                else:
                    raise PathConflictError(f"cannot rename {old} to {new}: something is there")
                self._check_target(source[-1], old_parts[-1])
                os.rename(old_parts[-1], new_parts[-1], src_dir_fd=source[-1], dst_dir_fd=target[-1])
            finally:
                _close(target)
            _remove_emptied(old_parts, source)
        finally:
            _close(source)

    def walk(self) -> Iterator[str]:
        """Every stored file (relative path), skipping the state folder and temp files."""
        for folder, dirs, files in os.walk(self._root_text):
            if folder == self._root_text:
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                prefix = ""
            else:
                prefix = folder[len(self._root_prefix):].replace(os.sep, "/") + "/"
            for name in files:
                if not name.startswith(PARTIAL_PREFIX):
                    yield prefix + name

    def looking(self) -> FolderLook:
        """A FolderLook over this sink (close it, or use it in a `with`)."""
        return FolderLook(self)


class FolderLook:
    """Looks at many stored files without following any link, as `FolderSink.kind` and
    `open_read` do, but each folder on the way is opened once (O_NOFOLLOW from DIR down) and
    kept open while the look lasts: an audit asks about every file, mostly in a few folders,
    and one chain of opens per file was a large part of its time."""

    def __init__(self, sink: FolderSink, keep: int = 256) -> None:
        self.sink = sink
        self.keep = keep                   # folders held open at most (then all are closed)
        self._fds: dict[tuple[str, ...], int] = {}
        self._failed: dict[tuple[str, ...], OSError] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        self._failed = {}
        _close(list(fds.values()))

    def _folder(self, folders: tuple[str, ...]) -> int:
        """The fd of DIR/folders..., each opened from its parent's without following a link;
        raises what `_open_chain` raises (remembered: a folder that failed fails again)."""
        fd = self._fds.get(folders)
        if fd is not None:
            return fd
        failed = self._failed.get(folders)
        if failed is not None:
            raise type(failed)(*failed.args)
        try:
            if folders:
                fd = self.sink._open_folder(self._folder(folders[:-1]), folders[-1], create=False)
            else:
                fd = os.open(self.sink._root_text, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            self._failed[folders] = exc
            raise
        self._fds[folders] = fd
        return fd

    def _start(self, path: Path | str) -> tuple[str, ...]:
        if len(self._fds) + len(self._failed) >= self.keep:
            self.close()                    # only between looks: no fd in use is closed
        return self.sink._parts(path)

    def kind(self, path: Path | str) -> str:
        """As `FolderSink.kind`: "file", "missing", "symlink" or "other"."""
        try:
            parts = self._start(path)
            folder = self._folder(parts[:-1])
        except SymlinkRefusedError:
            return "symlink"
        except (OSError, ValueError):
            return "missing"
        try:
            mode = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False).st_mode
        except OSError:
            return "missing"
        return _kind_of(mode)

    def open_read(self, path: Path | str) -> BinaryIO:
        """As `FolderSink.open_read`: never through a link."""
        parts = self._start(path)
        fd = _open_no_link(self._folder(parts[:-1]), parts[-1])
        # Unbuffered: the audit reads in 1 MB chunks, so a buffer only adds a copy per file.
        return os.fdopen(fd, "rb", buffering=0)


def _refuse_if_link(mode: int, name: str) -> None:
    if stat.S_ISLNK(mode):
        raise SymlinkRefusedError(f"{name!r} is a symlink inside the synced folder; refused, not followed")


def _kind_of(mode: int) -> str:
    """What an lstat mode is: "symlink", "file" or "other" (a folder, a device)."""
    if stat.S_ISLNK(mode):
        return "symlink"
    return "file" if stat.S_ISREG(mode) else "other"


def _open_no_link(folder: int, name: str) -> int:
    """`name` in `folder` opened for reading, never through a link (SymlinkRefusedError)."""
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SymlinkRefusedError(f"{name!r} is a symlink inside the synced folder; not read") from None
        raise


def _remove_emptied(parts: tuple[str, ...], fds: list[int]) -> None:
    """Remove the folders of `parts` left empty, deepest first, never the host folder itself;
    `fds` holds DIR's fd and each folder's (an _open_chain with keep_all)."""
    for index in range(len(parts) - 2, 0, -1):
        try:
            os.rmdir(parts[index], dir_fd=fds[index])
        except OSError:
            break


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _unlink_quietly(folder: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except OSError:
        pass

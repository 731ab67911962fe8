"""Two Linux system calls that do in one step what the folder sink otherwise does in several,
with the same guarantees: `open_folder` opens a folder below DIR refusing every symlink on
the way (openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), and `rename_new` renames a
finished temp file to a name nothing holds yet (renameat2 with RENAME_NOREPLACE).

Both are only shortcuts: they answer None / False for anything but the plain case (a folder
missing, a link or a file in the way, a name already taken, a kernel or C library without
them), and the sink then takes its step-by-step path, which decides and words every refusal.
A baseline of 10,000 small files made ~5 us of system calls and Python per file cheaper
(3 opens + 3 closes and a stat that fails for every new name, against 2 opens + 2 closes),
and ~2 us more by reaching the folder from DIR's full path in the one call (no open and close
of DIR itself) when no link is anywhere on that path.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import re
import sys
from typing import Any

# openat2 came with Linux 5.6 as call 437, the same number on every architecture that numbers
# its calls alike since 5.1; only those are trusted with it (elsewhere 437 may be another call).
_OPENAT2 = 437
_UNIFORM_MACHINES = frozenset({"x86_64", "amd64", "aarch64", "arm64", "armv7l", "armv8l", "riscv64",
                               "ppc64le", "ppc64", "s390x", "i686", "i386", "loongarch64"})
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RENAME_NOREPLACE = 1
# Answers that say the call itself is unusable here (not this folder's business): stop trying.
_UNSUPPORTED = frozenset({errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG, errno.EOPNOTSUPP})
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_AT_FDCWD = -100
# what os.fsencode does, without its Python-level call (two or three names per file written)
_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
# A name that is not a plain child of the folder before it ("", "." or ".."): the path is then
# left to the call anchored at DIR, whose RESOLVE_BENEATH judges it.
_NOT_A_CHILD = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Calls:
    """The C functions, looked up on first use; a call found unusable is switched off."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.syscall: Any = None
        self.renameat2: Any = None
        if sys.platform == "linux" and platform.machine().lower() in _UNIFORM_MACHINES:
            syscall = getattr(libc, "syscall", None)
            if syscall is not None:
                syscall.restype = ctypes.c_long
                syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
                self.syscall = syscall
            renameat2 = getattr(libc, "renameat2", None)   # glibc >= 2.28, musl >= 1.2.4
            if renameat2 is not None:
                renameat2.restype = ctypes.c_int
                renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
                self.renameat2 = renameat2
        self.how = _OpenHow(_FOLDER_FLAGS, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
        self.how_ref, self.how_size = ctypes.byref(self.how), ctypes.sizeof(self.how)
        # From the current folder, no link anywhere (DIR's own path included): for a path with
        # no "..", the same folder RESOLVE_BENEATH from DIR reaches, without opening DIR first.
        self.whole = _OpenHow(_FOLDER_FLAGS, 0, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
        self.whole_ref = ctypes.byref(self.whole)


@functools.cache
def _calls() -> _Calls:
    return _Calls()


def available() -> tuple[bool, bool]:
    """(open_folder, rename_new) can take their one-call path here (for tests and the curious)."""
    calls = _calls()
    return calls.syscall is not None, calls.renameat2 is not None


def open_folder(root: str, folders: tuple[str, ...]) -> int | None:
    """An fd of the folder DIR/<folders...>, reached without following any symlink and never
    leaving DIR (`root`, itself opened as the user named it); None when that takes more than
    the one call (a folder is missing, a link or file is in the way) or the call is missing."""
    calls = _calls()
    if calls.syscall is None or not folders:
        return None
    whole = _whole_paths.get((root, folders), _UNSEEN)
    if whole is _UNSEEN:
        whole = _whole_path(root, folders)
    if whole is not None:
        # DIR's path and the folders below it, all without a link: one call (the sink's root
        # is resolved, so this is the usual case). A link anywhere (ELOOP) may be in DIR's own
        # path as the user named it, which is followed: the call anchored at DIR then judges.
        fd = calls.syscall(_OPENAT2, _AT_FDCWD, whole, calls.whole_ref, calls.how_size)
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code != errno.ELOOP:
            if code in _UNSUPPORTED:
                calls.syscall = None
            return None
    try:
        top = os.open(root, _FOLDER_FLAGS)
    except OSError:
        return None
    try:
        fd = calls.syscall(_OPENAT2, top, os.fsencode("/".join(folders)), calls.how_ref, calls.how_size)
    finally:
        os.close(top)
    if fd < 0:
        if ctypes.get_errno() in _UNSUPPORTED:
            calls.syscall = None
        return None
    return int(fd)


_UNSEEN = b""         # "no entry yet": no whole path encodes to an empty one
# (root, folders) -> DIR's path and the folders as one encoded path, or None when a name is not a
# plain child ("", ".", ".."): text only, the same for every file of a folder (nothing about
# what is on the disk is kept)
_whole_paths: dict[tuple[str, tuple[str, ...]], bytes | None] = {}


def _whole_path(root: str, folders: tuple[str, ...]) -> bytes | None:
    below = "/".join(folders)
    whole = None if _NOT_A_CHILD.search(below) else f"{root}/{below}".encode(_FS_ENCODING, _FS_ERRORS)
    if len(_whole_paths) >= 4096:
        _whole_paths.clear()
    _whole_paths[(root, folders)] = whole
    return whole


def rename_new(folder: int, tmp: str, name: str) -> bool:
    """Rename `tmp` to `name` in `folder` if nothing (no file, folder or link) has that name;
    False when something has, or the call is missing: nothing was renamed then."""
    calls = _calls()
    if calls.renameat2 is None:
        return False
    if calls.renameat2(folder, tmp.encode(_FS_ENCODING, _FS_ERRORS), folder, name.encode(_FS_ENCODING, _FS_ERRORS),
                       _RENAME_NOREPLACE) == 0:
        return True
    if ctypes.get_errno() in _UNSUPPORTED:
        calls.renameat2 = None
    return False


__all__ = ["available", "open_folder", "rename_new"]

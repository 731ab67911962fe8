"""Exclusive locks on an open file, on every platform.

POSIX has `fcntl.flock`; Windows has no `fcntl` module, so there the lock goes through
portalocker (a maintained cross-platform lock, installed only on Windows). `fcntl` is looked
up here, not at the top of the toolkits, so they import everywhere. Either way the lock lasts
until `unlock` or until the file is closed (also when the process dies).
"""
from __future__ import annotations

from typing import IO, Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]


class LockBusyError(OSError):
    """Another process holds the lock (only with wait=False)."""


def lock(handle: IO[Any], *, wait: bool = True) -> None:
    """Hold an exclusive lock on `handle`; with wait=False raise LockBusyError at once if it is held."""
    if fcntl is not None:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise LockBusyError(f"{getattr(handle, 'name', 'the file')} is locked by another process") from None
        return
    import portalocker  # only where fcntl is missing: a dependency on Windows alone

    try:
        portalocker.lock(handle, portalocker.LOCK_EX | (0 if wait else portalocker.LOCK_NB))
    except portalocker.exceptions.AlreadyLocked:
        raise LockBusyError(f"{getattr(handle, 'name', 'the file')} is locked by another process") from None


def unlock(handle: IO[Any]) -> None:
    """Release a lock taken with `lock` (closing the file releases it too)."""
    if fcntl is not None:
        fcntl.flock(handle, fcntl.LOCK_UN)
        return
    import portalocker

    portalocker.unlock(handle)


def lock_or_holder(handle: IO[str]) -> str | None:
    """Lock `handle` (a lock file opened "a+") without waiting: None when this process holds it
    now, else who does (what its holder wrote with `write_holder`; "another process" when
    nothing), and `handle` is closed."""
    try:
        lock(handle, wait=False)
    except LockBusyError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        return holder
    return None


def write_holder(handle: IO[str], name: str) -> None:
    """Say in a lock file this process holds who holds it (what `lock_or_holder` tells others)."""
    handle.seek(0)
    handle.truncate()
    handle.write(name)
    handle.flush()

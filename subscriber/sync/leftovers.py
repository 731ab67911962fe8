"""The temp files a killed sync left in the copy. A body streams to `.partial-<pid>-<n>` beside
its target and is renamed into place when complete; a process killed meanwhile (kill -9, a power
cut) leaves that file behind, and nothing else ever removes it: `diff -r SRC COPY` would list it
and its bytes would stay on the disk. The next process that takes the folder's lock after such an
end removes them (`sweep_partials`); only one process writes a folder at a time, so every temp
file found then belongs to a dead one, but for those below a folder another sync keeps (a copy
nested in this one, with its own lock), which are left to it.
"""
from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from rsnotify.copies import STATE_FILE

from .sink import PARTIAL_PREFIX
from .state import STATE_DIR

# exactly what FolderSink._create_partial names its files: a file a user put there by hand with
# another name after the prefix is left alone (a Source's own `.partial-` names are escaped)
_PARTIAL = re.compile(re.escape(PARTIAL_PREFIX) + r"\d+-\d+")


def sweep_partials(root: Path) -> tuple[int, int]:
    """Remove every temp file of a dead sync below `root` (DIR, or a link to it; below it never
    through a symlink: fwalk opens each folder without following one, and a link named like a
    temp file is removed as a link), going on past one that cannot be removed; (how many were
    removed, how many could not be)."""
    removed = failed = 0
    top = os.path.realpath(root)
    for folder, dirs, names, fd in os.fwalk(top):
        if folder == top:
            dirs[:] = [d for d in dirs if d != STATE_DIR]
        elif STATE_DIR in dirs and _keeps_state(fd):
            dirs[:] = []        # another sync's copy: its temp files are its own
            continue
        for name in names:
            if _PARTIAL.fullmatch(name):
                try:
                    os.unlink(name, dir_fd=fd)
                    removed += 1
                except OSError as exc:
                    if exc.errno != errno.ENOENT:
                        failed += 1
    return removed, failed


def _keeps_state(folder_fd: int) -> bool:
    """Does the folder open as `folder_fd` hold a sync's state database (rsnotify.copies.is_copy)?"""
    try:
        found = os.stat(f"{STATE_DIR}/{STATE_FILE}", dir_fd=folder_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(found.st_mode)

"""The temp files a killed sync left in the copy. A body streams to `.partial-<pid>-<n>` beside
its target and is renamed into place when complete; a process killed meanwhile (kill -9, a power
cut) leaves that file behind, and nothing else ever removes it: `diff -r SRC COPY` would list it
and its bytes would stay on the disk. The next process that takes the folder's lock after such an
end removes them (`sweep_partials`); only one process writes a folder at a time, so every temp
file found then belongs to a dead one.
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from .sink import PARTIAL_PREFIX
from .state import STATE_DIR

# exactly what FolderSink._create_partial names its files: a file a user put there by hand with
# another name after the prefix is left alone (a Source's own `.partial-` names are escaped)
_PARTIAL = re.compile(re.escape(PARTIAL_PREFIX) + r"\d+-\d+")


def sweep_partials(root: Path) -> int:
    """Remove every temp file of a dead sync below `root` (never through a symlink: fwalk opens
    each folder without following one, and a link named like a temp file is removed as a link);
    how many were removed."""
    removed = 0
    for folder, dirs, names, fd in os.fwalk(root):
        if folder == str(root):
            dirs[:] = [d for d in dirs if d != STATE_DIR]
        for name in names:
            if _PARTIAL.fullmatch(name):
                try:
                    os.unlink(name, dir_fd=fd)
                    removed += 1
                except OSError as exc:
                    if exc.errno != errno.ENOENT:
                        raise
    return removed

"""What marks a folder that `rsnotify sync` keeps (a Destination's copy): its state database.

The Destination keeps it; a Source never serves a copy it finds below the folder it serves:
`rsnotify sync --dir SRC/mirror` of that very Source would otherwise be served back and copied
into itself, one level deeper each round. A Source serving a copy as its own folder (a mirror
re-published further) is another matter, and is left alone.
"""
from __future__ import annotations

from pathlib import Path

STATE_DIR = ".rsnotify"
STATE_FILE = "state.db"


def is_copy(folder: Path) -> bool:
    """Does `folder` hold the state of a `rsnotify sync`?"""
    return (folder / STATE_DIR / STATE_FILE).is_file()

"""File locks through one portable module: the toolkits import where `fcntl` does not exist."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rsnotify.filelocks import LockBusyError, lock, unlock


def test_a_second_holder_is_refused_without_waiting_and_let_in_after_unlock(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with path.open("a+") as first, path.open("a+") as second:
        lock(first, wait=False)
        with pytest.raises(LockBusyError, match="locked by another process"):
            lock(second, wait=False)
        unlock(first)
        lock(second, wait=False)


def test_the_toolkits_import_without_fcntl() -> None:
    # As on Windows: `import fcntl` raises ImportError.
    code = ("import sys; sys.modules['fcntl'] = None\n"
            "import rsnotify.subscriber, rsnotify.subscriber.store, rsnotify.publisher, rsnotify.cli\n"
            "import rsnotify.subscriber.sync.engine, rsnotify.subscriber.sync.runner\n"
            "import rsnotify.filelocks as f; print(f.fcntl)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"

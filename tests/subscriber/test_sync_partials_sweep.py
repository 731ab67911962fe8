"""What the sweep after a killed sync removes (subscriber/sync/leftovers.py), on real folders:
its temp files below DIR, also when DIR is given as a symlink; never a nested copy's (another
sync keeps that folder, with its temp files in flight); and every other one when one cannot go."""
from __future__ import annotations

from pathlib import Path

import pytest

from rsnotify.subscriber.sync.leftovers import sweep_partials
from rsnotify.subscriber.sync.state import STATE_DIR
from tests.subscriber.test_sync_live_disk import CAN_MOUNT, remount, tmpfs_over


def _temp(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"half a body")
    return path


def test_the_sweep_removes_temp_files_below_dir_given_as_a_symlink(tmp_path):
    copy = tmp_path / "copy"
    left = [_temp(copy / "host" / "a", ".partial-101-1"), _temp(copy / "host", ".partial-101-2")]
    kept = _temp(copy / "host", "r.txt")
    link = tmp_path / "link"
    link.symlink_to(copy, target_is_directory=True)
    assert sweep_partials(link) == (2, 0)
    assert not any(p.exists() for p in left) and kept.exists()


def test_the_sweep_leaves_a_nested_copy_and_its_temp_files_alone(tmp_path):
    copy = tmp_path / "copy"
    ours = _temp(copy / "host", ".partial-101-1")
    nested = copy / "host" / "sub"
    (nested / STATE_DIR).mkdir(parents=True)
    (nested / STATE_DIR / "state.db").write_bytes(b"")
    theirs = [_temp(nested, ".partial-202-5"), _temp(nested / "deep", ".partial-202-6")]
    assert sweep_partials(copy) == (1, 0)
    assert not ours.exists() and all(p.exists() for p in theirs)


@pytest.mark.skipif(not CAN_MOUNT, reason="needs root with mount(2): a read-only tmpfs refuses the unlink")
def test_the_sweep_goes_on_past_a_folder_it_cannot_change_and_counts_it(tmp_path):
    copy = tmp_path / "copy"
    (copy / "a").mkdir(parents=True)
    gone = _temp(copy / "b", ".partial-101-2")
    with tmpfs_over(copy / "a", "64k"):
        stuck = _temp(copy / "a", ".partial-101-1")
        remount(copy / "a", "ro")
        assert sweep_partials(copy) == (1, 1)
        assert stuck.exists() and not gone.exists()

"""Awkward shapes the names test does not make, with real processes (`rsnotify hub`, `rsnotify
source` at the host root, `rsnotify sync`): NFC and NFD spellings of one name side by side (two
files on Linux), a tree 60 folders deep, a subtree moved, names with a tab, a carriage return, a
backslash and brackets, a 0-byte file after a large one, an empty file. `diff -r SRC
DIR/<host>_<port>` says only the one thing the Source cannot express (an empty folder: no
resource) after an `--once` baseline, after live changes, and after a SIGKILL, changes while
down and an `--once` catch-up."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import unicodedata
from pathlib import Path

from tests.e2e.test_e2e_sync import (  # noqa: F401
    RSNOTIFY,
    Proc,
    answers,
    hub,
    serve_folder,
    spawn,
    wait_until,
)
from tests.support.ports import free_port

NFC = unicodedata.normalize("NFC", "café")
NFD = unicodedata.normalize("NFD", "café")
NAMES = [NFC + ".txt", NFD + ".txt", "tab\tname.txt", "cr\r.txt", "back\\slash.txt", "[brackets] {braces}.txt",
         "quote'\".txt", "semi;colon&amp=eq.txt", " ", "x.", "-dash", "emoji😀.txt", "%E6%97%A5 literal.txt"]
ONLY_EMPTY_FOLDER = "Only in {src}: empty-folder\n"


def make_tree(src: Path) -> None:
    for i, name in enumerate(NAMES):
        (src / name).write_bytes(f"{name!r} {i}\n".encode())
    for form in (NFC, NFD):
        (src / f"{form} dir").mkdir()
        (src / f"{form} dir" / "in.txt").write_bytes(f"in the {form!a} folder\n".encode())
    deep = src.joinpath(*["deep"] * 60)
    deep.mkdir(parents=True)
    (deep / "leaf.txt").write_bytes(b"sixty folders down\n")
    (src / "empty.txt").write_bytes(b"")
    (src / "empty-folder").mkdir()
    (src / "big.bin").write_bytes(os.urandom(3 << 20))
    (src / "swap").write_bytes(b"a file first\n")


def diff(src: Path, copy: Path) -> str:
    done = subprocess.run(["diff", "-r", str(src), str(copy)], capture_output=True, check=False)
    return (done.stdout + done.stderr).decode(errors="backslashreplace")


def settles(src: Path, copy: Path, *procs: Proc, timeout: float = 60) -> None:
    expected = ONLY_EMPTY_FOLDER.format(src=src)
    wait_until(lambda: diff(src, copy) == expected, "diff -r to show only the empty folder", timeout, *procs)


def test_awkward_names_and_shapes_diff_clean_through_once_live_kill_and_catch_up(hub, tmp_path):  # noqa: F811
    src, dest, port, base, source = serve_folder(hub, tmp_path, make_tree)
    caps = base + "capabilitylist.xml"
    copy = dest / f"127.0.0.1_{port}"

    def once() -> subprocess.CompletedProcess:
        return subprocess.run([RSNOTIFY, "sync", "--capability-list", caps, "--dir", str(dest), "--once"],
                              capture_output=True, text=True, timeout=120, check=False)

    try:
        wait_until(lambda: answers(caps), "the Source to answer", 60, source)
        first = once()
        assert first.returncode == 0 and "Traceback" not in first.stderr, first.stderr
        assert diff(src, copy) == ONLY_EMPTY_FOLDER.format(src=src)
        assert (copy / (NFC + ".txt")).read_bytes() != (copy / (NFD + ".txt")).read_bytes()

        sync_port = free_port()
        live = spawn(["sync", "--capability-list", caps, "--dir", str(dest), "--json", "--listen",
                      f"127.0.0.1:{sync_port}", "--poll-interval", "2"], tmp_path / "live.log", tmp_path / "live.jsonl")
        wait_until(lambda: any(e["event"] == "live" for e in live.events()), "sync to go live", 60, live, source)
        (src / "big.bin").write_bytes(b"")                                  # 0 bytes after 3 MiB
        (src / "swap").unlink()                                             # file -> folder
        (src / "swap").mkdir()
        (src / "swap" / "inner.txt").write_bytes(b"now a folder\n")
        (src / (NFD + ".txt")).unlink()                                     # the NFC one stays
        (src / (NFC + ".txt")).write_bytes(b"NFC changed\n")
        (src / "deep" / "deep").rename(src / "deep" / "moved")              # a 59-deep subtree moves
        settles(src, copy, live, source)
        assert (copy / "big.bin").stat().st_size == 0 and (copy / "swap" / "inner.txt").is_file()
        assert not (copy / (NFD + ".txt")).exists() and (copy / (NFC + ".txt")).read_bytes() == b"NFC changed\n"

        live.process.send_signal(signal.SIGKILL)
        live.process.wait()
        shutil.rmtree(src / "swap")                                         # folder -> file, while down
        (src / "swap").write_bytes(b"a file again\n")
        (src / "big.bin").write_bytes(os.urandom(1 << 20))
        (src / (NFD + ".txt")).write_bytes(b"NFD back\n")
        (src / "tab\tname.txt").unlink()
        (src / "deep" / "moved").rename(src / "deep" / "deep")
        time.sleep(1.5)   # the Source records and publishes; the hub gives up on the stopped sync
        caught = once()
        assert caught.returncode == 0 and "Traceback" not in caught.stderr, caught.stderr
        assert "catch-up" in caught.stderr, caught.stderr
        assert diff(src, copy) == ONLY_EMPTY_FOLDER.format(src=src)
    finally:
        source.stop()

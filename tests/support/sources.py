"""The documents of a ResourceSync Source as a subscriber discovers it: a Source Description at
/.well-known/resourcesync names a Capability List, which names one change-notification channel
(the topic BASE/changes and the hub that carries it)."""
from __future__ import annotations

import io
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from rsnotify.lists import Entry, ListInfo, ListWriter, open_list

from .http import fetch
from .ports import free_port

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/"'


def source_documents(base: str, hub: str) -> dict[str, str]:
    """Path -> XML for a Source served at `base` (no trailing slash)."""
    return {
        "/.well-known/resourcesync": (
            f'<urlset {NS}><rs:md capability="description"/><url><loc>{base}/capabilitylist.xml</loc>'
            '<rs:md capability="capabilitylist"/></url></urlset>'),
        "/capabilitylist.xml": (
            f'<urlset {NS}><rs:ln rel="up" href="{base}/.well-known/resourcesync"/>'
            f'<rs:md capability="capabilitylist"/><url><loc>{base}/changes</loc><rs:ln rel="hub" href="{hub}"/>'
            '<rs:md capability="change-notification"/></url></urlset>'),
    }


def list_bytes(info: ListInfo, entries: Iterable[Entry]) -> bytes:
    """A Resource List, Change List or index with head `info`, as `rsnotify.lists.ListWriter` writes it."""
    out = io.BytesIO()
    with ListWriter(out, info) as writer:
        for entry in entries:
            writer.write(entry)
    return out.getvalue()


def listed(url: str) -> list[str]:
    """The locs of the Resource List or Change List a Source serves at `url`, sorted (200 asserted)."""
    answer = fetch(url)
    assert answer.status == 200, answer.text
    return sorted(entry.loc for entry in open_list(io.BytesIO(answer.body)))


def serve_folder(run_source: Callable[..., subprocess.Popen], hub_url: str, tmp_path: Path,
                 files: dict[str, str]) -> tuple[str, subprocess.Popen]:
    """`rsnotify source` (the run_source fixture) serving `files` (relative path -> text) from
    tmp_path/src below /dataset1/ on a free loopback port, publishing to `hub_url`, once its
    Capability List answers: (its base URL, the process)."""
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    base = f"http://127.0.0.1:{free_port()}/dataset1/"
    source = run_source("--dir", str(src), "--base-url", base, "--hub", hub_url, "--db", str(tmp_path / "m.db"),
                        ready_url=base + "capabilitylist.xml")
    return base, source

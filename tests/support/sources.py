"""The documents of a ResourceSync Source as a subscriber discovers it: a Source Description at
/.well-known/resourcesync names a Capability List, which names one change-notification channel
(the topic BASE/changes and the hub that carries it)."""
from __future__ import annotations

import io
from collections.abc import Iterable

from rsnotify.lists import Entry, ListInfo, ListWriter, open_list

from .http import fetch

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

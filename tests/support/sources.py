"""The documents of a ResourceSync Source as a subscriber discovers it: a Source Description at
/.well-known/resourcesync names a Capability List, which names one change-notification channel
(the topic BASE/changes and the hub that carries it)."""
from __future__ import annotations

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

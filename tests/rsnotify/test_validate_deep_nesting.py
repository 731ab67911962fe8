"""A document nested past libxml2's 256 levels is refused in our words ("nested past the
maximum depth of 256 levels"), not with libxml2's advice to turn on XML_PARSE_HUGE (which we never do)."""
from __future__ import annotations

from pathlib import Path

from tests.support import cli

NOTIFICATION = """<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
<rs:md capability="changelist-notification" from="2026-01-01T00:00:00Z" until="2026-01-01T00:00:01Z"/>
<url>NEST<loc>http://data.example.org/ds1/a</loc><rs:md change="updated" datetime="2026-01-01T00:00:00Z"/></url>
</urlset>"""


def test_deep_nesting_is_refused_in_plain_words(tmp_path: Path) -> None:
    deep = tmp_path / "deep.xml"
    deep.write_text(NOTIFICATION.replace("NEST", "<x>" * 1000 + "</x>" * 1000))
    result = cli.run("validate", str(deep))
    assert result.returncode == 1, result.stderr
    output = result.stdout + result.stderr
    assert "elements nested past the maximum depth of 256 levels; expected at most 256" in output, output
    assert "XML_PARSE_HUGE" not in output
    shallow = tmp_path / "shallow.xml"
    shallow.write_text(NOTIFICATION.replace("NEST", "<x>" * 200 + "</x>" * 200))
    assert cli.run("validate", str(shallow)).returncode == 0

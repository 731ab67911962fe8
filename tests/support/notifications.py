"""A change notification for tests whose publishes' content does not matter."""
from __future__ import annotations

TOPIC = "http://data.example.org/ds1/changes"
# valid, one change, dated long ago (never in the future)
ONE_CHANGE = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9" xmlns:rs="http://www.openarchives.org/rs/terms/">
  <rs:md capability="change-notification" from="2020-01-01T00:00:00Z" until="2020-01-01T00:01:00Z"/>
  <url><loc>http://data.example.org/ds1/res1</loc><rs:md change="updated" datetime="2020-01-01T00:00:00Z"/></url>
</urlset>"""

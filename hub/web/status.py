"""The status page: GET / (the hub at a glance), GET /topics/{tid}, GET /subscriptions/{sid}.

Each path serves the same small HTML page (hub/static/status.html); its plain JavaScript
(status.js, no build step) reads the admin API and draws the view the path names. The page
itself holds no data, so it needs no token; its API calls do (it asks for the admin token
when the hub has one and keeps it in the tab's sessionStorage).
"""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

# hub/static, not hub/web/static: the wheel's package data names it there (pyproject.toml)
STATIC = Path(__file__).resolve().parent.parent / "static"
PAGE = STATIC / "status.html"


async def page(request: web.Request) -> web.StreamResponse:
    """The status page's HTML (the view is picked by its script from the path)."""
    return web.FileResponse(PAGE, headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", page)
    app.router.add_get("/topics/{tid}", page)
    app.router.add_get("/subscriptions/{sid}", page)
    app.router.add_static("/static/", STATIC)

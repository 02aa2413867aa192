"""The finance dashboard's files, served at /dashboard from `dashboards/web/`.

The page carries no data and needs no key to load: its login form keeps the finance
key in the tab's sessionStorage and the page's script sends it to the spend API as a
bearer header (never in a URL). Only the files named in `FILES` are served, so no
request path reaches the filesystem; a strict Content-Security-Policy allows this
origin's scripts and styles only.

    app.router.routes.extend(dashboard_routes())
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.errors import NotFound

WEB_DIR = Path(str(importlib.resources.files("dashboards") / "web"))
# URL path under /dashboard/ -> (file under WEB_DIR, media type)
FILES: dict[str, tuple[str, str]] = {
    "": ("index.html", "text/html; charset=utf-8"),
    "app.js": ("app.js", "text/javascript; charset=utf-8"),
    "style.css": ("style.css", "text/css; charset=utf-8"),
    "vendor/chartjs/chart.umd.min.js": (
        "vendor/chartjs/chart.umd.min.js",
        "text/javascript; charset=utf-8",
    ),
    "vendor/chartjs/LICENSE.md": ("vendor/chartjs/LICENSE.md", "text/plain; charset=utf-8"),
}
HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def dashboard_routes(web_dir: Path = WEB_DIR) -> list[Route]:
    """Routes for /dashboard/ (the page) and its assets."""

    async def page(request: Request) -> Response:
        name = request.path_params.get("name", "")
        entry = FILES.get(name)
        if entry is None:
            raise NotFound(f"no such dashboard file: /dashboard/{name}", code="not_found")
        return FileResponse(web_dir / entry[0], media_type=entry[1], headers=HEADERS)

    async def to_page(request: Request) -> Response:
        return RedirectResponse("/dashboard/", status_code=308)

    return [
        Route("/dashboard", to_page, methods=["GET"]),
        Route("/dashboard/{name:path}", page, methods=["GET"]),
    ]

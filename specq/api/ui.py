"""The web page (/ui) and the API docs (/docs), every asset served by specq itself (no CDN).

    GET /ui, /ui/…            the page shell: one HTML document for every page of the app (jobs,
                              batches, a job, a batch, workers); the script routes by path
    GET /ui/static/{name}     app.js, app.css, favicon.svg (specq/api/static)
    GET /docs                 Swagger UI for /openapi.json
    GET /docs/static/{name}   Swagger UI's script and style sheet (the `swagger-ui-bundle-v2` package,
                              Apache-2.0) and docs.js, which starts it

The shell holds no data: the script reads the API with the tab's key (SPECQ_AUTH=keys: the page
asks for one and sends it as Bearer), so a tenant sees what the API shows it and nothing more. Every
response here carries `Content-Security-Policy: default-src 'self'` (plus `img-src data:` on
/docs, whose style sheet draws its icons as data: URLs) with no inline script anywhere, and
`X-Content-Type-Options: nosniff`; the page renders user text only as text nodes (app.js).
"""

from __future__ import annotations

import html
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, Response

from .. import __version__ as _version
from ..settings import ServiceSettings
from .errors import ApiError

STATIC = Path(__file__).parent / "static"
#: what the page may load: its own origin only; no plugins, no framing, no <base> rewriting
UI_CSP = "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
DOCS_CSP = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; " \
           "frame-ancestors 'none'"
UI_FILES = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8",
            "favicon.svg": "image/svg+xml"}
SWAGGER_FILES = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8", "swagger-ui.css": "text/css; charset=utf-8"}


def security_headers(csp: str) -> dict[str, str]:
    return {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}


def shell(auth: str) -> str:
    """The one HTML document of the page; `auth` (none | keys) tells the script whether to ask for a key."""
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<meta name=\"specq-auth\" content=\"{html.escape(auth)}\">"
        f"<meta name=\"specq-version\" content=\"{html.escape(_version)}\">"
        "<title>specq</title><link rel=\"icon\" href=\"/ui/static/favicon.svg\" type=\"image/svg+xml\">"
        f"<link rel=\"stylesheet\" href=\"/ui/static/app.css?v={html.escape(_version)}\">"
        f"<script src=\"/ui/static/app.js?v={html.escape(_version)}\" defer></script>"
        "</head><body><main id=\"main\"><noscript>This page needs JavaScript; the API itself is at "
        "<a href=\"/docs\">/docs</a>.</noscript></main></body></html>\n"
    )


DOCS_PAGE = (
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>specq API</title>"
    "<link rel=\"icon\" href=\"/ui/static/favicon.svg\" type=\"image/svg+xml\">"
    "<link rel=\"stylesheet\" href=\"/docs/static/swagger-ui.css\">"
    "<script src=\"/docs/static/swagger-ui-bundle.js\" defer></script>"
    "<script src=\"/docs/static/docs.js\" defer></script>"
    "</head><body><div id=\"swagger-ui\"></div></body></html>\n"
)

#: /docs when the package with Swagger UI is not installed: the description and the page are still there
DOCS_FALLBACK = (
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>specq API</title></head><body>"
    "<h1>specq API</h1><p>Swagger UI is not installed here (<code>pip install swagger-ui-bundle-v2</code>). "
    "The OpenAPI description is at <a href=\"/openapi.json\">/openapi.json</a>; the web page at "
    "<a href=\"/ui\">/ui</a>.</p></body></html>\n"
)


def swagger_dir() -> Path | None:
    """Swagger UI's files from the swagger-ui-bundle-v2 package, or None when it is not installed."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:
        return None
    path = Path(str(swagger_ui_path))
    return path if (path / "swagger-ui-bundle.js").is_file() else None


def ui_router(settings: ServiceSettings) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    page = shell(settings.auth)
    assets = {name: (STATIC / name).read_bytes() for name in UI_FILES}
    docs_js = (STATIC / "docs.js").read_bytes()
    swagger = swagger_dir()

    @router.get("/ui")
    @router.get("/ui/{rest:path}")
    def ui_page(rest: str = "") -> Response:
        if rest.startswith("static/"):
            name = rest[len("static/"):]
            if name not in assets:
                raise ApiError(404, f"no file {name[:100]!r}", "not_found")
            return Response(assets[name], media_type=UI_FILES[name], headers=security_headers(UI_CSP))
        return HTMLResponse(page, headers=security_headers(UI_CSP))

    @router.get("/docs")
    def docs_page() -> Response:
        return HTMLResponse(DOCS_PAGE if swagger else DOCS_FALLBACK, headers=security_headers(DOCS_CSP))

    @router.get("/docs/static/{name}")
    def docs_static(name: str) -> Response:
        if name == "docs.js":
            return Response(docs_js, media_type="text/javascript; charset=utf-8", headers=security_headers(DOCS_CSP))
        if swagger is None or name not in SWAGGER_FILES:
            raise ApiError(404, f"no file {name[:100]!r}", "not_found")
        return FileResponse(swagger / name, media_type=SWAGGER_FILES[name], headers=security_headers(DOCS_CSP))

    return router


__all__ = ["ui_router", "shell", "UI_CSP", "DOCS_CSP", "swagger_dir"]

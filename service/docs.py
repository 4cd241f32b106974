"""OpenAPI docs served from the swagger-ui-bundle package, behind the same tokens as the API.

FastAPI's own `/docs` page loads Swagger UI from a CDN (blank without network) and `/redoc` does
the same; both are turned off in create_app and replaced by this page, whose script and style
come from `/docs/assets/`, the files shipped in the `swagger_ui_bundle` wheel.

`/docs`, `/docs/assets/*` and `/openapi.json` need a token (service/auth.py `docs_dependency`):
Bearer, or HTTP Basic with the token as the password, which is what a browser can send. A request
without one gets 401 with `WWW-Authenticate: Basic realm="kvstore"`, so the browser prompts; it then
sends the credentials again for the assets and for the page's same-origin fetch of /openapi.json
(all in the protection space of `/docs`, RFC 7617 section 2.2). The assets are public files, but
they answer 401 too: the issue asks for every route but /healthz behind a token, and an open asset
path would tell an unauthenticated prober which software and version answers on the port.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from service.errors import NotFoundError
from service.openapi_bodies import add_message_schemas
from service.tenants import Caller

ASSETS = "/docs/assets"
OPENAPI = "/openapi.json"


def install_offline_docs(app: FastAPI, docs_caller: Callable[..., Awaitable[Caller]]) -> None:
    """The `/docs` page, its Swagger UI files and `/openapi.json`, each answering only a caller with a
    token (`docs_caller` raises 401 otherwise). No request leaves the host. `app` must be created with
    `openapi_url=None` so that FastAPI adds no open schema route of its own."""
    from swagger_ui_bundle import swagger_ui_path

    files = {p.name: p for p in Path(swagger_ui_path).iterdir() if p.is_file()}
    guard = [Depends(docs_caller)]

    @app.get("/docs", include_in_schema=False, dependencies=guard)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=OPENAPI, title=f"{app.title} API",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")

    @app.get(ASSETS + "/{name}", include_in_schema=False, dependencies=guard)
    async def asset(name: str) -> FileResponse:
        path = files.get(name)  # only the bundle's own files: no path leaves its folder
        if path is None:
            raise NotFoundError(f"no docs asset {name[:100]!r}; the page is at /docs")
        return FileResponse(path)

    @app.get(OPENAPI, include_in_schema=False, dependencies=guard)
    async def openapi() -> JSONResponse:
        schema: dict[str, Any] = add_message_schemas(app.openapi())  # where the routes' body $refs point
        return JSONResponse(schema)

"""OpenAPI docs served from the swagger-ui-bundle package: `/docs` works on an air-gapped host.

FastAPI's own `/docs` page loads Swagger UI from a CDN (blank without network) and `/redoc` does
the same; both are turned off in create_app and replaced by this page, whose script and style
come from `/docs/assets/`, the files shipped in the `swagger_ui_bundle` wheel.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"


def install_offline_docs(app: FastAPI) -> None:
    """Mount the Swagger UI files and the `/docs` page that uses them (no request leaves the host)."""
    from swagger_ui_bundle import swagger_ui_path

    app.mount(ASSETS, StaticFiles(directory=swagger_ui_path), name="swagger-ui-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")

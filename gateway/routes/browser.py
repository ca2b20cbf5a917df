"""What a gateway serves to browsers and newcomers: the API browser, the JS client, AsyncAPI.

- ``/docs``: Swagger UI over ``/openapi.json``, its assets from the ``swagger-ui-bundle-v2``
  wheel (no CDN: many networks have no internet), "try it out" with a bearer key;
- ``/asyncapi.json``: the push protocols (:mod:`gateway.asyncapi`);
- ``/client/pushgate.js`` and ``/client/pushgate.d.ts``: the browser client of
  ``clients/js/``, packaged with the gateway (``gateway/js_client`` links to it).

All public, like ``/openapi.json``. Files are read once, at start-up.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute

from backend_store.errors import NotFound

from ..asyncapi import asyncapi_bytes
from ..services import GatewayServices
from .endpoint import route

# The Swagger UI files /docs needs, and their media types (nothing else is served).
SWAGGER_ASSETS = {
    "swagger-ui.css": "text/css; charset=utf-8",
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
CLIENT_FILES = {
    "pushgate.js": "text/javascript; charset=utf-8",
    "pushgate.d.ts": "application/typescript; charset=utf-8",
}

DOCS_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Pushgate API</title>
<link rel="stylesheet" href="docs/assets/swagger-ui.css">
<link rel="icon" type="image/png" href="docs/assets/favicon-32x32.png">
<style>
  body { margin: 0; }
  .pushgate-links { font: 14px sans-serif; padding: 8px 20px; background: #1b1b1b; color: #ddd; }
  .pushgate-links a { color: #8fd3ff; margin-right: 16px; }
</style>
</head>
<body>
<nav class="pushgate-links">
  <a href="openapi.json">openapi.json</a>
  <a href="asyncapi.json">asyncapi.json (WebSocket and SSE)</a>
  <a href="client/pushgate.js">client/pushgate.js</a>
  Click <b>Authorize</b> and paste an API key (or a JWT) to try requests.
</nav>
<div id="swagger-ui"></div>
<script src="docs/assets/swagger-ui-bundle.js"></script>
<script src="docs/init.js"></script>
</body>
</html>
"""

# validatorUrl null: Swagger UI would otherwise fetch a badge from the internet.
DOCS_INIT_JS = """window.ui = SwaggerUIBundle({
  url: "openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  docExpansion: "list",
  filter: true,
  displayRequestDuration: true,
  validatorUrl: null,
  persistAuthorization: false,
});
"""


@dataclass(frozen=True)
class StaticFile:
    content: bytes
    media_type: str
    etag: str

    @classmethod
    def read(cls, source: Traversable, media_type: str) -> StaticFile:
        content = source.read_bytes()
        return cls(content, media_type, '"' + hashlib.sha256(content).hexdigest()[:32] + '"')

    def response(self, request: Request, cache_control: str) -> Response:
        headers = {"ETag": self.etag, "Cache-Control": cache_control}
        if request.headers.get("if-none-match") == self.etag:
            return Response(status_code=304, headers=headers)
        return Response(self.content, media_type=self.media_type, headers=headers)


def swagger_ui_dir() -> Traversable:
    """The Swagger UI 5 distribution inside the ``swagger-ui-bundle-v2`` wheel."""
    vendor = files("swagger_ui_bundle") / "vendor"
    versions = sorted(p.name for p in vendor.iterdir() if p.name.startswith("swagger-ui-"))
    if not versions:
        raise RuntimeError("swagger_ui_bundle ships no swagger-ui-* directory")
    return vendor / versions[-1]


def client_dir() -> Traversable:
    return files("gateway") / "js_client"


class BrowserRoutes:
    def __init__(self, services: GatewayServices) -> None:
        self.services = services
        swagger = swagger_ui_dir()
        self.assets = {name: StaticFile.read(swagger / name, kind) for name, kind in SWAGGER_ASSETS.items()}
        client = client_dir()
        self.client = {name: StaticFile.read(client / name, kind) for name, kind in CLIENT_FILES.items()}
        self.asyncapi = asyncapi_bytes()

    def routes(self) -> list[BaseRoute]:
        metrics = self.services.metrics
        return [
            route("/docs", self.docs, "GET", metrics),
            route("/docs/init.js", self.docs_init, "GET", metrics),
            route("/docs/assets/{name}", self.docs_asset, "GET", metrics),
            route("/asyncapi.json", self.asyncapi_json, "GET", metrics),
            route("/client/{name}", self.client_file, "GET", metrics),
        ]

    async def docs(self, request: Request) -> Response:
        return HTMLResponse(DOCS_HTML)

    async def docs_init(self, request: Request) -> Response:
        return Response(DOCS_INIT_JS, media_type="text/javascript; charset=utf-8")

    async def docs_asset(self, request: Request) -> Response:
        asset = self.assets.get(request.path_params["name"])
        if asset is None:
            raise NotFound("no such asset")
        # The assets change only with the installed package: cache them for a day.
        return asset.response(request, "public, max-age=86400")

    async def asyncapi_json(self, request: Request) -> Response:
        return Response(self.asyncapi, media_type="application/json")

    async def client_file(self, request: Request) -> Response:
        file = self.client.get(request.path_params["name"])
        if file is None:
            raise NotFound("no such client file")
        # A stable path whose content changes with upgrades: revalidate (ETag) every time.
        return file.response(request, "no-cache")

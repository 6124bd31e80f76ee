"""CORS, as vLLM's API server answers it by default (`--allowed-origins '*'`, any method,
any header, no credentials): a request that names an `Origin` gets
`Access-Control-Allow-Origin: *` on its response, and a browser's preflight (`OPTIONS`
with `Access-Control-Request-Method`, on any route's path) is answered 200 with the methods, the
headers it asked for and a max age of 600 s, before any API key is checked (a preflight
carries none). So a web page on another origin can call the API, as it can call vLLM.
The control routes are the exception (gateway.access): their responses never allow an
origin, and the edge refuses their preflights (gateway.middleware).

Does not know: the routes behind it, the engine, or authentication beyond being exempt.
"""

from __future__ import annotations

from aiohttp import web

from inference_lab.common.auth import Access
from inference_lab.gateway.access import route_access

ALLOW_METHODS = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
MAX_AGE = "600"


def is_preflight(request: web.BaseRequest) -> bool:
    return request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers


async def _allow_origin(request: web.BaseRequest, response: web.StreamResponse) -> None:
    if "Origin" in request.headers and "Access-Control-Allow-Origin" not in response.headers \
            and route_access(request.path) is not Access.CONTROL:
        response.headers["Access-Control-Allow-Origin"] = "*"


async def _preflight(request: web.Request) -> web.Response:
    if not is_preflight(request):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
    headers = {"Access-Control-Allow-Methods": ALLOW_METHODS, "Access-Control-Max-Age": MAX_AGE,
               "Vary": "Origin"}
    requested = request.headers.get("Access-Control-Request-Headers")
    if requested:
        headers["Access-Control-Allow-Headers"] = requested
    return web.Response(text="OK", headers=headers)


def add_routes(app: web.Application) -> None:
    """Register after every other route: each route's path answers OPTIONS too (an unknown
    path stays a 404). Again after adding routes later (gateway.fleet): only the new
    paths are added."""
    if _allow_origin not in app.on_response_prepare:
        app.on_response_prepare.append(_allow_origin)
    for resource in list(app.router.resources()):
        if not any(route.method == "OPTIONS" for route in resource):
            resource.add_route("OPTIONS", _preflight)

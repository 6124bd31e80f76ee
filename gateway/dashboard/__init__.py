"""The live dashboard on the gateway's API port: `GET /dashboard` (the page), `GET /`
(a redirect to it) and `GET /dashboard/feed` (its numbers as JSON: gateway.dashboard.feed).

Knows: the page's files (package data beside this module: the page, its script and
style, and the vendored uPlot with its licence), put together once into one document
with nothing fetched from elsewhere; the Content-Security-Policy that holds it to that
(scripts by hash, requests to its own origin alone, no framing); the feed's routes.
Every route is open, as `/metrics` is: the page and the feed show model names, queue
depths and latencies, never a prompt. The page's knobs call the existing control routes
(`/control/capacity`, `/control/replicas`, `/control/faults/replica`, `/sleep`,
`/wake_up`) with the control token the user types, which the page keeps in memory; the
control routes answer it because it is their own origin (gateway.access
`same_origin_page`), and refuse every other page as before.

Does not know: the control routes' rules (gateway.access, gateway.middleware), where
the numbers come from (gateway.dashboard.feed), the fleet (it is told the ports: PORTS).
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources
from typing import Callable

from aiohttp import web

from inference_lab.gateway.dashboard.feed import Feed
from inference_lab.gateway.state import GatewayState

PATH = "/dashboard"
FEED_PATH = "/dashboard/feed"
# {replica index: (port, that port's app state)}: set by the fleet on its base port's app
PORTS: web.AppKey[Callable[[], dict]] = web.AppKey("dashboard_ports", object)
_FEED: web.AppKey[Feed] = web.AppKey("dashboard_feed", Feed)

_STATIC = resources.files(__package__) / "static"
_SCRIPTS = ("uPlot.iife.min.js", "dashboard.js")
_STYLES = ("uPlot.min.css", "dashboard.css")


def _page() -> tuple[bytes, str]:
    """The page with its scripts and styles inlined, and its Content-Security-Policy."""
    html = (_STATIC / "index.html").read_text()
    scripts = [(_STATIC / name).read_text() for name in _SCRIPTS]
    styles = "\n".join((_STATIC / name).read_text() for name in _STYLES)
    hashes = " ".join(
        "'sha256-%s'" % base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()
        for s in scripts)
    html = html.replace("<!--styles-->", f"<style>\n{styles}\n</style>").replace(
        "<!--scripts-->", "".join(f"<script>{s}</script>" for s in scripts))
    policy = ("default-src 'none'; " f"script-src {hashes}; style-src 'unsafe-inline'; "
              "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
              "form-action 'none'; frame-ancestors 'none'")
    return html.encode(), policy


_built: tuple[bytes, str] | None = None


async def page(request: web.Request) -> web.Response:
    global _built
    if _built is None:
        _built = _page()
    body, policy = _built
    return web.Response(body=body, content_type="text/html", charset="utf-8", headers={
        "Content-Security-Policy": policy, "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})


async def feed(request: web.Request) -> web.Response:
    return web.Response(body=await request.app[_FEED].body(), content_type="application/json",
                        headers={"Cache-Control": "no-store"})


async def root(request: web.Request) -> web.Response:
    raise web.HTTPFound(PATH)


def add_routes(app: web.Application, state: GatewayState) -> None:
    """The dashboard's routes on `app`; its feed covers the ports PORTS names (set later
    by the fleet; until then, or without a fleet, this app's own)."""

    def ports() -> dict:
        told = app.get(PORTS)
        return told() if told is not None else {state.replica: (None, state)}

    app[_FEED] = Feed(state, ports, state.data_parallel)
    app.router.add_get("/", root)
    app.router.add_get(PATH, page)
    app.router.add_get(FEED_PATH, feed)


__all__ = ["FEED_PATH", "PATH", "PORTS", "add_routes"]

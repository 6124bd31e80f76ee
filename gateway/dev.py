"""vLLM's dev-mode routes (VLLM_SERVER_DEV_MODE=1, or --dev-mode): POST /pause, POST
/resume, GET /is_paused, POST /reset_prefix_cache, and GET /server_info (its answer:
gateway.server_info).

Knows: the routes as vLLM's dev mode serves them: /pause's query (`mode` abort, wait or
keep, default abort; the older `wait_for_inflight_requests=true`, which means wait;
`clear_cache`, default true) and its answer {"status": "paused"}, given once the pause
took hold (with wait, once the running requests have finished); /resume's {"status":
"resumed"}; {"is_paused": bool}; /reset_prefix_cache's empty 200 (`reset_external=true`
also forgets the KV offload tiers' idle chunks, as vLLM's connector reset_cache). They act on
this port's replica of every model (a replica's port, `--replicas`) or on every replica
(a gateway with no replica of its own). Without dev mode they are not registered: a 404,
as in vLLM. What a pause does to the requests is the engine's (the Pause call:
engine.service.dev, engine.fleet.runtime).

Does not know: who may call them (gateway.access: /pause, /resume and
/reset_prefix_cache are control routes, the control token and no browser, as /control/*
is; /is_paused is open, as /is_sleeping is), gRPC details (gateway.engine_client).
"""

from __future__ import annotations

from aiohttp import web

from inference_lab.gateway import server_info
from inference_lab.gateway.protocols.base import invalid, json_encode
from inference_lab.gateway.state import STATE
from inference_lab.v1 import engine_pb2 as pb

MODES = {"abort": pb.PAUSE_MODE_ABORT, "wait": pb.PAUSE_MODE_WAIT, "keep": pb.PAUSE_MODE_KEEP}
# The words FastAPI (vLLM's framework) reads as a boolean query parameter.
_TRUE = frozenset({"true", "1", "yes", "on", "t", "y"})
_FALSE = frozenset({"false", "0", "no", "off", "f", "n"})


def query_bool(query, name: str, default: bool) -> bool:
    """Query parameter `name` as a boolean (absent: `default`); a 400 naming it otherwise."""
    text = query.get(name)
    if text is None:
        return default
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    shown = text if len(text) <= 40 else text[:40] + "..."
    raise invalid(f"{name} must be a boolean (true or false), got {shown!r} - at `?{name}`")


def _json(obj: object) -> web.Response:
    return web.Response(body=json_encode(obj), content_type="application/json")


async def pause(request: web.Request) -> web.Response:
    """POST /pause?mode=abort|wait|keep[&clear_cache=false]: generation pauses."""
    state = request.app[STATE]
    query = request.query
    text = query.get("mode")
    if text is None:
        text = "wait" if query_bool(query, "wait_for_inflight_requests", False) else "abort"
    mode = MODES.get(text)
    if mode is None:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise invalid(f"mode must be 'abort', 'wait' or 'keep', got {shown!r} - at `?mode`")
    clear_cache = query_bool(query, "clear_cache", True)
    await state.client.pause(None, state.replica, mode, clear_cache=clear_cache)
    return _json({"status": "paused"})


async def resume(request: web.Request) -> web.Response:
    """POST /resume: generation goes on; what a keep pause froze runs on."""
    state = request.app[STATE]
    await state.client.pause(None, state.replica, resume=True)
    return _json({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    """GET /is_paused: {"is_paused": true} while a replica this port fronts is paused."""
    state = request.app[STATE]
    rows = await state.client.get_capacity(replica=state.replica)
    return _json({"is_paused": any(r.paused for r in rows)})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """POST /reset_prefix_cache[?reset_external=true]: every cached block no running
    request uses is forgotten (and published as a KV event); with reset_external, the
    offload tiers' chunks no transfer uses too."""
    state = request.app[STATE]
    if query_bool(request.query, "reset_running_requests", False):
        raise invalid("reset_running_requests is not modelled: the blocks running requests "
                      "use stay cached - at `?reset_running_requests`")
    external = query_bool(request.query, "reset_external", False)
    await state.client.reset_prefix_cache(None, state.replica, external)
    return web.Response(status=200)


def add_routes(app: web.Application) -> None:
    # vLLM's /server_info (gateway.server_info), where no engine profile serves its own
    if "/server_info" not in {r.canonical for r in app.router.resources()}:
        app.router.add_get("/server_info", server_info.show)
    app.router.add_post("/pause", pause)
    app.router.add_post("/resume", resume)
    app.router.add_get("/is_paused", is_paused)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)

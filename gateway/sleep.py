"""vLLM's sleep mode routes: POST /sleep, POST /wake_up, GET /is_sleeping.

Knows: the routes as vLLM's dev mode serves them (`level` 1 or 2 in the query, default 1;
`mode` only "abort", vLLM's default; `tags` repeated on /wake_up, "weights" and/or
"kv_cache"; an empty 200 for /sleep and /wake_up, {"is_sleeping": bool}), that they act
on this port's replica of every model (a replica's port, `--replicas`) or on every
replica (a gateway with no replica of its own). What a sleep frees and what a wake costs
are the engine's (the Sleep call: engine.service.sleep, engine.fleet.sleep).

Does not know: who may call them (gateway.access: /sleep and /wake_up are control routes,
the control token and no browser, as /control/* is; /is_sleeping is open), generation (a
sleeping replica's refusals come from the engine, as a 503 `engine_sleeping`), gRPC
details (gateway.engine_client).
"""

from __future__ import annotations

from aiohttp import web

from inference_lab.gateway.protocols.base import invalid, json_encode
from inference_lab.gateway.state import STATE

TAGS = ("weights", "kv_cache")


async def sleep(request: web.Request) -> web.Response:
    """POST /sleep?level=1|2: this port's replica (every replica on the main port) sleeps."""
    state = request.app[STATE]
    text = request.query.get("level", "1")
    if text not in ("1", "2"):
        raise invalid(f"level must be 1 or 2, got {text!r} - at `level`")
    mode = request.query.get("mode", "abort")
    if mode != "abort":
        raise invalid(f"mode {mode!r} is not modelled: a sleep aborts the requests in flight "
                      "(vLLM's default, mode=abort) - at `mode`")
    await state.client.sleep(None, state.replica, level=int(text))
    return web.Response(status=200)


async def wake_up(request: web.Request) -> web.Response:
    """POST /wake_up[?tags=weights&tags=kv_cache]: restore what the sleep freed."""
    state = request.app[STATE]
    tags = request.query.getall("tags", [])
    for tag in tags:
        if tag not in TAGS:
            raise invalid(f"unknown tag {tag!r}: expected 'weights' or 'kv_cache' - at `tags`")
    await state.client.sleep(None, state.replica, wake=True, tags=tags)
    return web.Response(status=200)


async def is_sleeping(request: web.Request) -> web.Response:
    """GET /is_sleeping: {"is_sleeping": true} while a replica this port fronts sleeps."""
    state = request.app[STATE]
    rows = await state.client.get_capacity(replica=state.replica)
    return web.Response(body=json_encode({"is_sleeping": any(r.sleep_level for r in rows)}),
                        content_type="application/json")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/sleep", sleep)
    app.router.add_post("/wake_up", wake_up)
    app.router.add_get("/is_sleeping", is_sleeping)

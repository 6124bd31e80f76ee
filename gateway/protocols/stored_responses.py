"""The Responses API's stored responses: `GET /v1/responses/{id}` answers a finished
response this gateway holds (`responses.STORE`: not one sent with `store: false`, nor one
forgotten since), `DELETE /v1/responses/{id}` forgets it; an unknown id is a 404
`response_not_found` in OpenAI's envelope.

Does not know: the engine, or how responses are made (`gateway.protocols.responses`).
"""

from __future__ import annotations

from aiohttp import web

from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.protocols.base import json_encode
from inference_lab.gateway.protocols.responses import STORE


def _not_found(rid: str) -> GatewayError:
    return GatewayError(ErrorKind.RESPONSE_NOT_FOUND, f"Response with id '{rid}' not found.")


async def retrieve(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    response = STORE.response(rid)
    if response is None:
        raise _not_found(rid)
    return web.Response(body=response, content_type="application/json")


async def delete(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    if not STORE.delete(rid):
        raise _not_found(rid)
    return web.Response(body=json_encode({"id": rid, "object": "response", "deleted": True}),
                        content_type="application/json")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_delete("/v1/responses/{response_id}", delete)

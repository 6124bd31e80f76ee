"""vLLM's LoRA routes: POST /v1/load_lora_adapter and /v1/unload_lora_adapter.

Knows the two request bodies (`lora_name`, `lora_path`, and the lab's optional
`base_model_name` for an engine serving several models) and vLLM's plain-text success
answers. Does not know adapters themselves: the engine registers them (its
LoadLoraAdapter / UnloadLoraAdapter RPCs, with the gateway's control token), and the
gateway's model list is refreshed so that the adapter is servable at once. Errors are
the usual envelope: 400 (bad body, a name in use, beyond the limit, LoRA not enabled),
404 (unknown adapter or base model).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from inference_lab.gateway.protocols.base import decode


class LoadLoraAdapter(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: str
    lora_path: str
    base_model_name: str = ""


class UnloadLoraAdapter(msgspec.Struct, forbid_unknown_fields=True):
    lora_name: str
    lora_int_id: int | None = None  # accepted as vLLM does, not needed


_load = msgspec.json.Decoder(LoadLoraAdapter)
_unload = msgspec.json.Decoder(UnloadLoraAdapter)


def add_routes(app: web.Application, client: Callable[[], object],
               read_body: Callable[[web.Request], Awaitable[bytes]]) -> None:
    async def load(request: web.Request) -> web.Response:
        body = decode(_load, await read_body(request))
        message = await client().load_lora_adapter(body.lora_name, body.lora_path,
                                                   body.base_model_name)
        return web.Response(text=message)

    async def unload(request: web.Request) -> web.Response:
        body = decode(_unload, await read_body(request))
        message = await client().unload_lora_adapter(body.lora_name)
        return web.Response(text=message)

    app.router.add_post("/v1/load_lora_adapter", load)
    app.router.add_post("/v1/unload_lora_adapter", unload)

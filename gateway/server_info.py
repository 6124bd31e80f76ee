"""vLLM's dev-mode `GET /server_info` (VLLM_SERVER_DEV_MODE=1, or --dev-mode): the server's
configuration as vLLM's `vllm_config`, the part the lab models.

Knows: the answer's shape, `{"vllm_config": ...}`: with `?config_format=json` an object of
vLLM's config sections the lab has (`model_config`, `cache_config` with
`kv_offloading_size` and `kv_offloading_backend`, `parallel_config`,
`kv_transfer_config`), by default (`text`) one line of `key=value` pairs of the same; the
`kv_transfer_config` vLLM would run with: the OffloadingConnector's (or LMCache's) that
`--kv-offloading-size` derives (engine.sim.offload.config), NixlConnector's for a P/D role
(`--kv-roles`), and vLLM's MultiConnector over both when a replica has both. The
`cache_config` fields the lab's `/get_server_info` adds when offloading is on, and which
models a port's replica serves (both routes answer for its first).

Does not know: vLLM's environment (`vllm_env`) and the host's (`system_env`), which a
simulated server does not have (left out); who may call it (gateway.access); the route
table (gateway.dev registers it in dev mode).
"""

from __future__ import annotations

import json

from aiohttp import web

from inference_lab.gateway.protocols.base import invalid, json_encode
from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.state import STATE, GatewayState
from inference_lab.v1 import engine_pb2 as pb

FORMATS = ("text", "json")
# vLLM's CacheConfig default for --kv-offloading-backend (its size's default is None: off)
DEFAULT_BACKEND = "native"


async def served_models(state: GatewayState) -> list[pb.ModelInfo]:
    """The models this port's replica serves, base models first (the engine's order)."""
    models = await state.client.list_models()
    if state.replica is not None:
        rows = await state.client.get_capacity(replica=state.replica)
        served = {row.model for row in rows}
        models = [m for m in models if m.name in served]
    if not models:
        raise GatewayError(ErrorKind.REPLICA_UNAVAILABLE, "no model has this replica")
    return models


def offload_fields(model: pb.ModelInfo) -> dict:
    """vLLM's cache_config fields of KV offloading: the size in GiB (None: off) and the
    backend."""
    if not model.HasField("kv_offload"):
        return {"kv_offloading_size": None, "kv_offloading_backend": DEFAULT_BACKEND}
    return {"kv_offloading_size": model.kv_offload.size_gib,
            "kv_offloading_backend": model.kv_offload.backend}


def nixl_config(row: pb.ModelCapacity | None) -> dict | None:
    """A P/D replica's connector as vLLM's kv_transfer_config names it (None: no role)."""
    if row is None or not row.kv_role:
        return None
    return {"kv_connector": "NixlConnector", "kv_role": row.kv_role,
            "engine_id": row.kv_engine_id}


def kv_transfer_config(model: pb.ModelInfo, row: pb.ModelCapacity | None) -> dict | None:
    """The kv_transfer_config vLLM would run this replica with (None: no connector)."""
    nixl = nixl_config(row)
    offload = (json.loads(model.kv_offload.kv_transfer_config_json)
               if model.HasField("kv_offload") else None)
    if nixl is None or offload is None:
        return nixl or offload
    # both: vLLM's MultiConnector, which runs each connector of its extra config's list
    return {"kv_connector": "MultiConnector", "kv_role": nixl["kv_role"],
            "engine_id": nixl["engine_id"],
            "kv_connector_extra_config": {"connectors": [nixl, offload]}}


def vllm_config(model: pb.ModelInfo, row: pb.ModelCapacity | None, rank: int) -> dict:
    """The sections of vLLM's VllmConfig the lab models, as its JSON dump names them."""
    return {
        "model_config": {"model": model.name, "served_model_name": model.name,
                         "max_model_len": model.max_model_len},
        "cache_config": {"block_size": model.block_size, "num_gpu_blocks": model.kv_blocks,
                         **offload_fields(model)},
        "parallel_config": {"tensor_parallel_size": model.tp, "data_parallel_rank": rank},
        "kv_transfer_config": kv_transfer_config(model, row),
    }


def as_text(config: dict) -> str:
    """One line of `key=value` pairs, the sections' fields in order."""
    pairs = []
    for section, fields in config.items():
        if isinstance(fields, dict) and section != "kv_transfer_config":
            pairs += [f"{key}={value!r}" for key, value in fields.items()]
        else:
            pairs.append(f"{section}={json.dumps(fields)}")
    return ", ".join(pairs)


async def show(request: web.Request) -> web.Response:
    """GET /server_info[?config_format=text|json]: this port's replica's configuration
    (the first model it serves)."""
    fmt = request.query.get("config_format", "text")
    if fmt not in FORMATS:
        shown = fmt if len(fmt) <= 40 else fmt[:40] + "..."
        raise invalid(f"config_format must be 'text' or 'json', got {shown!r} - at "
                      "`?config_format`")
    state = request.app[STATE]
    model = (await served_models(state))[0]
    rows = await state.client.get_capacity(model=model.name, replica=state.replica or 0)
    rank = (state.replica or 0) if state.data_parallel else 0
    config = vllm_config(model, rows[0] if rows else None, rank)
    body = {"vllm_config": config if fmt == "json" else as_text(config)}
    return web.Response(body=json_encode(body), content_type="application/json")

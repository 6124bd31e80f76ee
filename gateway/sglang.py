"""SGLang's HTTP routes, for a gateway whose engines run the sglang profile
(`serve --engine sglang`): what SGLang's own clients, routers and probes read, in its
shapes (sgl-project/sglang, python/sglang/srt/entrypoints/http_server.py and
v1_loads.py; docs/engines.md).

Knows: `GET /get_server_info` (its ServerArgs fields the lab models, `scheduler_info`,
`internal_states` per rank, `version`), `GET /get_load` (a list per data-parallel rank:
dp_rank, num_reqs, num_waiting_reqs, num_tokens), `GET /v1/loads` (timestamp, version and
`loads`: one GetLoadsReqOutput per rank), `GET /health_generate` (200 while the engine
serves, 503 otherwise), `GET /get_model_info` and `GET|POST /flush_cache` (the prefix
cache emptied, or a 400 while requests run or wait, as SGLang refuses). The numbers come
from the engine: its capacity rows and its sglang:* gauges (engine.metrics.sglang).

Does not know: generation, the engine's internals, vLLM's shapes of the same paths
(gateway.routing, which leaves these paths to this module under the sglang profile).
"""

from __future__ import annotations

import time

from aiohttp import web

from inference_lab.common.prometheus_text import model_sums
from inference_lab.gateway.errors import ErrorKind, GatewayError, engine_unavailable
from inference_lab.gateway.protocols.base import json_encode
from inference_lab.gateway.state import STATE, GatewayState

VERSION = "0.5.12"  # the SGLang release whose shapes these are (its /get_server_info `version`)
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are "
           "running or waiting requests, the operation will not be performed.)\n")
GAUGES = ("sglang:num_used_tokens", "sglang:token_usage", "sglang:gen_throughput",
          "sglang:cache_hit_rate", "sglang:max_total_num_tokens")
PATHS = ("/get_server_info", "/get_load")  # also served by gateway.routing in vLLM's shapes


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=json_encode(obj), status=status, content_type="application/json")


async def _model(state: GatewayState):
    models = [m for m in await state.client.list_models() if not m.parent]
    if not models:
        raise GatewayError(ErrorKind.REPLICA_UNAVAILABLE, "no model is served")
    return models[0]


async def _ranks(state: GatewayState) -> list[dict]:
    """Per replica (SGLang's data-parallel rank) of the first model: its counts and gauges."""
    model = await _model(state)
    rows = await state.client.get_capacity(model=model.name, replica=state.replica)
    out = []
    for row in rows:
        text = (await state.client.metrics_text([model.name], [row.replica])).decode()
        gauges = model_sums(text, GAUGES, model.name)
        out.append({"row": row, "model": model, **{k.split(":")[1]: v for k, v in gauges.items()}})
    return out


async def server_info(request: web.Request) -> web.Response:
    """GET /get_server_info: the ServerArgs fields the lab models, scheduler_info,
    internal_states (one per rank) and version."""
    state = request.app[STATE]
    ranks = await _ranks(state)
    model, row = ranks[0]["model"], ranks[0]["row"]
    return _json({
        "model_path": model.name, "tokenizer_path": model.name, "served_model_name": model.name,
        "tp_size": model.tp, "dp_size": len(ranks), "page_size": model.block_size,
        "context_length": model.max_model_len, "max_running_requests": row.max_num_seqs,
        "max_queued_requests": row.max_waiting or None, "schedule_policy": "fcfs",
        "schedule_conservativeness": 1.0, "disable_radix_cache": False,
        "radix_eviction_policy": "lru", "enable_mixed_chunk": False,
        "scheduler_info": {"max_total_num_tokens": int(ranks[0].get("max_total_num_tokens", 0)),
                           "max_req_input_len": model.max_request_tokens},
        "internal_states": [{
            "dp_rank": r["row"].replica, "last_gen_throughput": r.get("gen_throughput", 0.0),
            "memory_usage": {"token_capacity": int(r.get("max_total_num_tokens", 0))},
            "avg_spec_accept_length": None,
            "waiting_queue_size": r["row"].waiting, "running_batch_size": r["row"].running,
        } for r in ranks],
        "version": VERSION,
    })


async def get_load(request: web.Request) -> web.Response:
    """GET /get_load: per rank, requests (running + waiting), waiting, tokens in use."""
    ranks = await _ranks(request.app[STATE])
    now = time.time()
    return _json([{"dp_rank": r["row"].replica, "num_reqs": r["row"].running + r["row"].waiting,
                   "num_waiting_reqs": r["row"].waiting,
                   "num_tokens": int(r.get("num_used_tokens", 0)), "ts_tic": now}
                  for r in ranks])


async def loads(request: web.Request) -> web.Response:
    """GET /v1/loads: the core fields of each rank's GetLoadsReqOutput."""
    ranks = await _ranks(request.app[STATE])
    now = time.time()
    return _json({"timestamp": now, "version": VERSION, "loads": [{
        "dp_rank": r["row"].replica, "timestamp": now,
        "num_running_reqs": r["row"].running, "num_waiting_reqs": r["row"].waiting,
        "num_used_tokens": int(r.get("num_used_tokens", 0)),
        "max_total_num_tokens": int(r.get("max_total_num_tokens", 0)),
        "token_usage": r.get("token_usage", 0.0), "gen_throughput": r.get("gen_throughput", 0.0),
        "cache_hit_rate": r.get("cache_hit_rate", 0.0),
        "utilization": (r["row"].running / r["row"].max_num_seqs
                        if r["row"].max_num_seqs else 0.0),
        "max_running_requests": r["row"].max_num_seqs} for r in ranks]})


async def health_generate(request: web.Request) -> web.Response:
    """GET /health_generate: 200 while the engine serves (a busy engine's progress answers
    SGLang's probe at once), 503 otherwise."""
    state = request.app[STATE]
    if not await state.client.serving():
        raise engine_unavailable("the engine is not serving")
    return web.Response(status=200)


async def model_info(request: web.Request) -> web.Response:
    """GET /get_model_info."""
    model = await _model(request.app[STATE])
    return _json({"model_path": model.name, "tokenizer_path": model.name,
                  "is_generation": not model.HasField("pooling"),
                  "preferred_sampling_params": None})


async def flush_cache(request: web.Request) -> web.Response:
    """GET|POST /flush_cache: the prefix cache emptied; refused (400) while any request
    runs or waits, as SGLang does."""
    state = request.app[STATE]
    rows = await state.client.get_capacity(replica=state.replica)
    if any(row.running or row.waiting for row in rows):
        return web.Response(status=400, text=FLUSHED)
    await state.client.reset_prefix_cache(None, state.replica)
    return web.Response(status=200, text=FLUSHED)


# (method, path, handler): SGLang's paths, the newer names beside the deprecated ones
ROUTES = (("GET", "/get_server_info", server_info), ("GET", "/server_info", server_info),
          ("GET", "/get_load", get_load), ("GET", "/v1/loads", loads),
          ("GET", "/health_generate", health_generate), ("GET", "/get_model_info", model_info),
          ("GET", "/model_info", model_info), ("GET", "/flush_cache", flush_cache),
          ("POST", "/flush_cache", flush_cache))


def add_routes(app: web.Application) -> None:
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)

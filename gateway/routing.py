"""What a router reads of a replica besides generation and /metrics, in the shapes vLLM and
vllm-router's workers answer: load, the render API, server info, KV-event sources.

Knows: `GET /load` (vLLM's, `{"server_load": N}`) and `GET /get_load` (what vllm-router's
power_of_two polls, `{"load": N}`), N being this replica's requests waiting and running in
the engine now (summed over the models it serves); `POST /v1/chat/completions/render` and
`POST /v1/completions/render` (vLLM's render API, and its derender routes:
gateway.protocols.derender; a request's prompt as the token IDs the
engine receives, after the chat template, in vLLM's `GenerateRequest` shape, one for chat,
a list for completions); `GET /get_server_info` (what vllm-router's kv_aware discovery
reads: the model, this replica's instance id, the KV block size) and `GET
/kv_event_sources` (this replica's KV-event publisher, keyed by the data-parallel rank its
batches carry, with the wire declarations vllm-router checks). Bodies are read and checked
as the generation routes read them (gateway.protocols.openai.schemas): the same 400s.

Does not know: generation (gateway.generation), the edge middleware, the engine's
internals: every answer comes from the engine's live state through the EngineClient.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from aiohttp import web

from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.middleware import read_json_body
from inference_lab.gateway.protocols import anthropic, derender
from inference_lab.gateway.protocols.base import json_encode, random_id
from inference_lab.gateway.protocols.openai.schemas import (
    ChatCompletionRequest, chat_prompt, completion_prompts, decode_request, prompt_ids,
)
from inference_lab.gateway.server_info import nixl_config, offload_fields, served_models
from inference_lab.gateway.state import STATE, GatewayState

# vllm-router accepts a source only with these declarations (its events_enabled check):
# vLLM's publisher kind, the payload encoding and the wire schema's version.
WIRE = {"publisher": "zmq", "encoding": "msgpack", "schema_version": 1}
HOST = socket.gethostname()


def _json(obj: object) -> web.Response:
    return web.Response(body=json_encode(obj), content_type="application/json")


async def _load(state: GatewayState) -> int:
    """Requests this port's replica holds now (every replica's, for a lone gateway)."""
    rows = await state.client.get_capacity(replica=state.replica)
    return sum(row.waiting + row.running for row in rows)


async def load(request: web.Request) -> web.Response:
    """vLLM's GET /load. (vLLM counts its API server's requests in flight, and only with
    --enable-server-load-tracking; here the engine's count, always.)"""
    return _json({"server_load": await _load(request.app[STATE])})


async def get_load(request: web.Request) -> web.Response:
    """GET /get_load, as vllm-router's power_of_two reads it: `{"load": N}`."""
    return _json({"load": await _load(request.app[STATE])})


def _instance_id(request: web.Request) -> str:
    """This listener's identity, the same on every call and distinct per port and host."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    port = sockname[1] if sockname else request.url.port
    return f"inference-lab@{HOST}:{port}"


async def server_info(request: web.Request) -> web.Response:
    """GET /get_server_info: the fields vllm-router's KV index discovery reads (its
    ServerInfo; the block size as `kv_block_size` only: it also takes `block_size` as an
    alias, and both at once would be a duplicate field to it)."""
    state = request.app[STATE]
    model = (await served_models(state))[0]
    rows = await state.client.get_capacity(model=model.name, replica=state.replica or 0)
    row = rows[0] if rows else None
    return _json({"model_id": model.name, "model_path": model.name,
                  "instance_id": _instance_id(request), "kv_block_size": model.block_size,
                  "max_model_len": model.max_model_len,
                  "data_parallel_rank": (state.replica or 0) if state.data_parallel else 0,
                  # P/D disaggregation: the replica's role as vLLM's kv_transfer_config names
                  # it, and the engine id its handoffs carry (docs/pd.md); null without a
                  # connector (no --kv-roles), as vLLM's without --kv-transfer-config
                  "kv_transfer_config": nixl_config(row),
                  # KV offloading on: its cache_config fields (docs/kv-offload.md)
                  **(offload_fields(model) if model.HasField("kv_offload") else {})})


async def kv_event_sources(request: web.Request) -> web.Response:
    """GET /kv_event_sources: this replica's publisher (every rank's, for the ranks of one
    data-parallel server behind this port), keyed by the data-parallel rank its batches
    carry (`{}` when KV events are off): its endpoints as bound, the topic of the
    model /get_server_info names, and vLLM's KVEventsConfig keys."""
    state = request.app[STATE]
    model = (await served_models(state))[0]
    # the ranks of one data-parallel server behind this port: every rank's publisher
    ranks = state.data_parallel and state.replica is None
    sources = await state.client.kv_event_sources(replica=None if ranks else state.replica or 0)
    return _json({str(s.data_parallel_rank): {
        "endpoint": s.endpoint, "replay_endpoint": s.replay_endpoint or None,
        "topic": s.topic.replace("{model}", model.name), "hwm": s.hwm,
        "buffer_steps": s.buffer_steps, "enable_kv_cache_events": True, **WIRE}
        for s in sources})


# ---- vLLM's render API ------------------------------------------------------------------


def _sampling_params(req, max_tokens: int) -> dict:
    """vLLM's SamplingParams as its render API returns them: the request's, else vLLM's
    defaults."""
    stop = req.stop if isinstance(req.stop, list) else [req.stop] if req.stop else []

    def given(value, default):
        return default if value is None else value

    return {"n": req.n or 1, "presence_penalty": given(req.presence_penalty, 0.0),
            "frequency_penalty": given(req.frequency_penalty, 0.0),
            "repetition_penalty": given(req.repetition_penalty, 1.0),
            "temperature": given(req.temperature, 1.0), "top_p": given(req.top_p, 1.0),
            "top_k": given(req.top_k, 0), "min_p": given(req.min_p, 0.0), "seed": req.seed,
            "stop": stop, "stop_token_ids": [], "ignore_eos": False, "max_tokens": max_tokens,
            "min_tokens": 0, "logprobs": None, "prompt_logprobs": None,
            "skip_special_tokens": True, "spaces_between_special_tokens": True,
            "include_stop_str_in_output": False}


def _generate_request(prefix: str, req, ids: Sequence[int], max_model_len: int) -> dict:
    """One rendered prompt in vLLM's GenerateRequest shape. Without a cap, max_tokens is
    what the context leaves (vLLM's get_max_tokens)."""
    cap = req.max_completion_tokens or req.max_tokens
    if len(ids) > max_model_len:
        raise GatewayError(ErrorKind.INVALID_REQUEST,
                           f"This model's maximum context length is {max_model_len} tokens. "
                           f"However, your request has {len(ids)} input tokens.")
    stream = bool(req.stream)
    return {"request_id": f"{prefix}-{random_id()}", "token_ids": list(ids), "features": None,
            "sampling_params": _sampling_params(req, cap or max(max_model_len - len(ids), 1)),
            "model": req.model, "stream": stream,
            "stream_options": ({"include_usage": req.include_usage,
                                "continuous_usage_stats": req.continuous_usage}
                               if stream and req.stream_options is not None else None),
            "cache_salt": None, "priority": req.priority, "kv_transfer_params": None}


async def _render(request: web.Request, chat: bool):
    state = request.app[STATE]
    req = decode_request(await read_json_body(request, state.max_body_bytes), chat)
    info = await state.client.resolve_model(req.model)  # 404 for a model not served
    tok = state.tokenizer
    if isinstance(req, ChatCompletionRequest):
        prompts = [chat_prompt(tok, req.messages, req.tools)]
    else:
        given = completion_prompts(req.prompt)
        prompts = [prompt_ids(tok, p, f"$.prompt[{i}]" if len(given) > 1 else "$.prompt")
                   for i, p in enumerate(given)]
    prefix = "chatcmpl" if chat else "cmpl"
    return [_generate_request(prefix, req, ids, info.max_model_len) for ids in prompts]


async def render_chat(request: web.Request) -> web.Response:
    """POST /v1/chat/completions/render: the conversation after the chat template."""
    return _json((await _render(request, chat=True))[0])


async def render_completion(request: web.Request) -> web.Response:
    """POST /v1/completions/render: one GenerateRequest per prompt."""
    return _json(await _render(request, chat=False))


async def render_messages(request: web.Request) -> web.Response:
    """POST /v1/messages/render: an Anthropic Messages request's conversation after the
    chat template, as the GenerateRequest the engine would take (errors in Anthropic's
    envelope, as on every /v1/messages route)."""
    state = request.app[STATE]
    req = anthropic.parse_request(await read_json_body(request, state.max_body_bytes))
    info = await state.client.resolve_model(req.model)
    ids = list(anthropic.messages_prompt(state.tokenizer, req))
    if len(ids) > info.max_model_len:
        raise GatewayError(ErrorKind.INVALID_REQUEST,
                           f"This model's maximum context length is {info.max_model_len} "
                           f"tokens. However, your request has {len(ids)} input tokens.")
    sampling = {"n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "repetition_penalty": 1.0,
                "temperature": 1.0 if req.temperature is None else req.temperature,
                "top_p": 1.0 if req.top_p is None else req.top_p,
                "top_k": 0 if req.top_k is None else req.top_k, "min_p": 0.0, "seed": None,
                "stop": list(req.stop_sequences or ()), "stop_token_ids": [],
                "ignore_eos": False, "max_tokens": req.max_tokens, "min_tokens": 0,
                "logprobs": None, "prompt_logprobs": None, "skip_special_tokens": True,
                "spaces_between_special_tokens": True, "include_stop_str_in_output": False}
    return _json({"request_id": f"msg-{random_id()}", "token_ids": ids, "features": None,
                  "sampling_params": sampling, "model": req.model, "stream": req.stream,
                  "stream_options": None, "cache_salt": None, "priority": 0,
                  "kv_transfer_params": None})


async def derender_chat(request: web.Request) -> web.Response:
    """POST /v1/chat/completions/derender: an engine response as a ChatCompletionResponse."""
    state = request.app[STATE]
    req = derender.parse_chat(await read_json_body(request, state.max_body_bytes))
    await state.client.resolve_model(req.model)  # 404 for a model not served
    return _json(derender.chat_response(req, state.tokenizer))


async def derender_completion(request: web.Request) -> web.Response:
    """POST /v1/completions/derender: one engine response per prompt as a
    CompletionResponse."""
    state = request.app[STATE]
    req = derender.parse_completion(await read_json_body(request, state.max_body_bytes))
    await state.client.resolve_model(req.model)
    return _json(derender.completion_response(req, state.tokenizer))


def add_routes(app: web.Application, skip: tuple[str, ...] = ()) -> None:
    """The routes, less the paths in `skip` (another engine's shapes serve them)."""
    app.router.add_get("/load", load)
    for path, handler in (("/get_load", get_load), ("/get_server_info", server_info)):
        if path not in skip:
            app.router.add_get(path, handler)
    app.router.add_get("/kv_event_sources", kv_event_sources)
    app.router.add_post("/v1/chat/completions/render", render_chat)
    app.router.add_post("/v1/completions/render", render_completion)
    app.router.add_post("/v1/messages/render", render_messages)
    app.router.add_post("/v1/chat/completions/derender", derender_chat)
    app.router.add_post("/v1/completions/derender", derender_completion)

"""The gateway's aiohttp application: `create_app`, which puts its parts together.

Knows: the HTTP surface (the generation routes of `gateway.protocols.ROUTES`: OpenAI chat
completions, completions and Responses, Anthropic Messages; /v1/models, /health, /metrics,
/control/capacity, vLLM's pooling routes, and the routes of vLLM's API, token counting, stored responses, LoRA
adapters, faults and CORS preflights), and which part answers each: the edge middleware
every request passes (gateway.middleware), the generation handler (gateway.generation), sleep mode (gateway.sleep), vLLM's dev-mode
routes with `dev_mode` (gateway.dev),
the control routes (gateway.control), the live dashboard (gateway.dashboard), what routers
read (gateway.routing: load, render, server info, KV-event sources), the app's start and stop (gateway.lifecycle), and
the answers the connection-level edge may write itself (gateway.edge FAST_POSTS,
FAST_GETS).

Does not know: gRPC details (gateway.engine_client), request schemas, response bytes and
the engine path they share (gateway.protocols), the error table (gateway.errors), or
scheduling: the engine is the single source of truth for depth and capacity.
"""

from __future__ import annotations

from typing import Callable

from aiohttp import web

from inference_lab.common.tokenizer import Tokenizer, load_tokenizer
from inference_lab.gateway import (control, cors, dashboard, dev, generation, lifecycle, middleware,
                                   routing, sglang)
from inference_lab.gateway import sleep as sleep_mode
from inference_lab.gateway import lora as lora_routes
from inference_lab.gateway.edge import ARRIVALS, FAST_GETS, FAST_POSTS
from inference_lab.gateway.engine_client import EngineClient
from inference_lab.gateway.errors import SATURATED_529, Saturation
from inference_lab.gateway.faults import FaultSpec
from inference_lab.gateway.faults import control as fault_control
from inference_lab.gateway.faults import replica as fault_replica
from inference_lab.gateway.faults.injection import FaultState
from inference_lab.gateway.faults.saving import FaultSaver
from inference_lab.gateway.protocols import ROUTES
from inference_lab.gateway.protocols import count_tokens, stored_responses
from inference_lab.gateway.protocols import vllm as vllm_api
from inference_lab.gateway.state import STATE, GatewayState

__all__ = ["STATE", "GatewayState", "create_app"]


def create_app(
    engine_target: str,
    *,
    max_body_bytes: int = 1 << 20,
    api_key: str | None = None,
    control_token: str | None = None,
    disconnect_poll_s: float = 0.5,
    enable_directives: bool = False,
    static_faults: dict[str, FaultSpec] | None = None,
    faults: FaultState | None = None,
    save_faults: FaultSaver | Callable[[dict], None] | None = None,
    tokenizer: Tokenizer | None = None,
    replica: int | None = None,
    engine: EngineClient | None = None,
    session_lane: str | None = None,
    saturation: Saturation | None = None,
    served_by: bool = True,
    data_parallel: bool = False,
    dev_mode: bool = False,
    dashboard_page: bool = True,
    engine_profile: str = "vllm",
) -> web.Application:
    """The gateway application for the engine at `engine_target` ("host:port").

    Run it with handler cancellation on (`run_gateway` does; so does aiohttp's TestServer)
    so a client disconnect cancels its engine request at once; otherwise a watchdog does
    within `disconnect_poll_s`. `api_key`, when set, is required as a Bearer token on /v1/*;
    `control_token` on /control/* (and is sent to the engine with SetCapacity). Both are
    compared in constant time; /health and /metrics stay open for probes and scrapers.
    `enable_directives` honours `x-inference-lab-fault` headers (else they are a 400);
    `static_faults` maps a model to the fault every streaming request of it gets.
    `faults` is the initial state of injected errors and retry hints (live through
    /control/faults; `save_faults` saves it after every change: a FaultSaver, shared by
    every app of the state, or a callable it wraps in one, which gets the state's snapshot
    in a worker thread).
    `tokenizer` turns prompts into token IDs (default: the built-in byte-level one).
    `replica` makes it the app of one replica's port (gateway.fleet): requests run on that
    replica, /health/ready and /v1/models answer 200 only while it is ready, /metrics adds
    its engine series; `engine` is then the fleet's one shared EngineClient.
    `session_lane` ("auto" or "off") is the EngineClient's: whether its Session may take the
    engine's same-host lane. `saturation` is how a saturated model's refusal is answered
    (default: 529, no Retry-After); `served_by` names the replica and model on every
    generation response (headers x-inference-lab-replica, x-inference-lab-model).
    `data_parallel`: the replicas are data-parallel ranks of one server (their server
    info says their rank), not independent servers (each says rank 0).
    `dev_mode` serves vLLM's dev-mode routes (/pause, /resume, /is_paused,
    /reset_prefix_cache: gateway.dev); without it they are 404s, as in vLLM.
    `dashboard_page`: the live dashboard (`/dashboard`, its feed, `/` redirecting to it:
    gateway.dashboard) on the app of the base port (replica 0, or no replica).
    `engine_profile`: the engine the engines imitate ("vllm" or "sglang": SGLang's routes,
    gateway.sglang).
    """
    state = GatewayState(
        engine_target=engine_target,
        max_body_bytes=max_body_bytes,
        api_key=api_key,
        disconnect_poll_s=disconnect_poll_s,
        control_token=control_token,
        session_lane=session_lane,
        enable_directives=enable_directives,
        static_faults=dict(static_faults or {}),
        tokenizer=tokenizer or load_tokenizer(None),
        replica=replica,
        shared_engine=engine,
        saturation=saturation or SATURATED_529,
        served_by=served_by,
        data_parallel=data_parallel,
    )
    app = web.Application(client_max_size=max_body_bytes,
                          middlewares=[middleware.edge_middleware])
    app[STATE] = state

    async def served_models() -> list[str]:
        return [m.name for m in await state.client.list_models()]

    def read_body(request: web.Request):
        return middleware.read_json_body(request, state.max_body_bytes)

    if save_faults is not None and not isinstance(save_faults, FaultSaver):
        save_faults = FaultSaver(save_faults)
    controls = app[fault_control.FAULTS] = fault_control.FaultControl(
        faults or FaultState(), max_body_bytes, served_models, save_faults)
    if save_faults is not None:
        app.on_cleanup.append(lambda _: save_faults.flush())
    app.cleanup_ctx.append(lifecycle.engine_ctx)
    app.on_response_prepare.append(middleware.echo_request_id)
    for path, dialect in ROUTES.items():
        app.router.add_post(path, generation.generation_handler(dialect, state, controls))
    # a saturated model's 529 on a kept-alive connection skips aiohttp's request objects
    app[FAST_POSTS] = {path.encode(): generation.fast_refusal(path, dialect, state, controls)
                       for path, dialect in ROUTES.items()}
    # each generation request is in the engine client's backlog until sent or answered
    app[ARRIVALS] = (frozenset(ROUTES),
                     lambda: state.engine.backlog if state.engine is not None else None)
    app.router.add_get("/v1/models", control.list_models)
    vllm_api.add_routes(app, lambda: state.client, lambda: state.tokenizer, read_body)
    count_tokens.add_routes(app, lambda: state.client, lambda: state.tokenizer, read_body)
    stored_responses.add_routes(app)
    if engine_profile == "sglang":  # SGLang's routes in its shapes (gateway.sglang)
        sglang.add_routes(app)
    # what a router reads: load, render, server info, KV-event sources
    routing.add_routes(app, skip=sglang.PATHS if engine_profile == "sglang" else ())
    lora_routes.add_routes(app, lambda: state.client, read_body)
    app.router.add_get("/health", control.health)
    app.router.add_get("/ping", control.health)  # (vLLM's, for SageMaker-style probes: /health's answer)
    app.router.add_post("/ping", control.health)
    app.router.add_get("/health/ready", control.health_ready)
    app.router.add_get("/metrics", control.metrics)
    if replica is not None:  # a scraper's every-50-ms GET skips aiohttp's request objects
        app[FAST_GETS] = {b"/metrics": control.fast_metrics(state)}
    app.router.add_get("/control/capacity", control.get_capacity)
    app.router.add_post("/control/capacity", control.set_capacity)
    sleep_mode.add_routes(app)
    if dev_mode:
        dev.add_routes(app)
    if dashboard_page and not replica:
        dashboard.add_routes(app, state)
    fault_control.add_routes(app)
    fault_replica.add_routes(app, lambda: state.client)
    cors.add_routes(app)  # last: every route's path answers a preflight
    return app

"""The gateway's aiohttp application: routes, the error/metrics edge, lifecycles.

Knows: the HTTP surface (the generation routes of `gateway.protocols.ROUTES`: OpenAI chat
completions, completions and Responses, Anthropic Messages; /v1/models, /health, /metrics,
/control/capacity), the edge every request passes (the API key as a Bearer token or
`x-api-key`, errors in the envelope of the route's dialect, metrics by route and status),
that a client who leaves has its engine request cancelled (aiohttp handler cancellation,
plus a watchdog on closed transports for runners that do not enable it), and the
gateway's own series (gateway.metrics).

Does not know: gRPC details (gateway.engine_client), request schemas, response bytes and
the engine path they share (gateway.protocols), the error table (gateway.errors), or
scheduling: the engine is the single source of truth for depth and capacity.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Annotated, AsyncIterator, Awaitable, Callable

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from inference_lab.common.auth import bearer_ok
from inference_lab.common.tokenizer import Tokenizer, load_tokenizer
from inference_lab.gateway import cors
from inference_lab.gateway.aiohttp_gate import http_date, response_head
from inference_lab.gateway import lora as lora_routes
from inference_lab.gateway.engine_client import ClientGone, EngineClient, RequestStream
from inference_lab.gateway.metrics import GatewayMetrics
from inference_lab.gateway.errors import envelope as openai_envelope
from inference_lab.gateway.errors import (
    ErrorKind,
    GatewayError,
    engine_unavailable,
    error_response,
    from_http_exception,
    saturated_body,
    saturated_response,
)
from inference_lab.gateway.edge import ARRIVALS, FAST_GETS, FAST_POSTS, arrival_stamp, read_body
from inference_lab.gateway.faults import HEADER as FAULT_HEADER
from inference_lab.gateway.faults import DirectiveError, FaultSpec, directive_for
from inference_lab.gateway.faults import control as fault_control
from inference_lab.gateway.faults import replica as fault_replica
from inference_lab.gateway.faults import stream as fault_stream
from inference_lab.gateway.protocols import ROUTES, Dialect
from inference_lab.gateway.protocols.base import (
    NESTED_TOO_DEEPLY, Batch, Generation, invalid, json_encode, random_id,
)
from inference_lab.gateway.protocols.batch import batch_refusal, generate_batch
from inference_lab.gateway.protocols.generate import generate
from inference_lab.gateway.protocols.openai import Completion
from inference_lab.gateway.protocols import count_tokens, stored_responses
from inference_lab.gateway.protocols import vllm as vllm_api
from inference_lab.gateway.faults.injection import FaultState
from inference_lab.v1 import engine_pb2 as pb

log = logging.getLogger("inference_lab.gateway.app")

CLIENT_CLOSED_STATUS = 499  # recorded in metrics when the client left before the response


@dataclass(slots=True)
class GatewayState:
    engine_target: str
    max_body_bytes: int
    api_key: str | None
    disconnect_poll_s: float
    control_token: str | None = None
    session_lane: str | None = None  # EngineClient's: "auto", "off" (None: its default)
    enable_directives: bool = False  # honour x-inference-lab-fault headers
    static_faults: dict[str, FaultSpec] = field(default_factory=dict)  # model -> [fault] mode
    tokenizer: Tokenizer = field(default_factory=lambda: load_tokenizer(None))
    # The replica this app fronts (gateway.fleet: one app per replica port); None = the
    # engine's default replica, with no readiness checks (a lone gateway, as before replicas).
    replica: int | None = None
    shared_engine: EngineClient | None = None  # owned by the caller (gateway.fleet), not the app
    inflight: dict[RequestStream, web.BaseRequest] = field(default_factory=dict)
    metrics: GatewayMetrics = field(init=False)
    engine: EngineClient | None = None

    def __post_init__(self) -> None:
        self.metrics = GatewayMetrics(self.inflight)

    @property
    def client(self) -> EngineClient:
        if self.engine is None:
            raise engine_unavailable("the gateway is not started")
        return self.engine


STATE: web.AppKey[GatewayState] = web.AppKey("gateway_state", GatewayState)


# ---- the edge: errors, metrics, auth -----------------------------------------------------


def _route_label(request: web.BaseRequest) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def _under(request: web.BaseRequest, prefix: str) -> bool:
    """The path, or the route it matched, is under `prefix`."""
    return request.path.startswith(prefix) or _route_label(request).startswith(prefix)


def _api_key_ok(request: web.BaseRequest, api_key: str) -> bool:
    """`Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY` (Anthropic's)."""
    x_api_key = request.headers.get("x-api-key")
    if x_api_key is not None and bearer_ok("Bearer " + x_api_key, api_key):
        return True
    return bearer_ok(request.headers.get("Authorization"), api_key)


def _envelope_for(request: web.BaseRequest):
    """The error body renderer of the route's API dialect (OpenAI's by default)."""
    dialect = ROUTES.get(_route_label(request))
    if dialect is None and request.path.startswith("/v1/messages"):
        dialect = ROUTES["/v1/messages"]  # e.g. an unknown sub-route: Anthropic's clients
    return dialect.error_body if dialect is not None else openai_envelope


def _error_response(err: GatewayError, request: web.BaseRequest) -> web.Response:
    """`err` in the envelope of the request's route (looked up only when there is one)."""
    return error_response(err, request, _envelope_for(request))


@web.middleware
async def edge_middleware(request: web.Request, handler) -> web.StreamResponse:
    state = request.app[STATE]
    started = time.perf_counter()
    status = 500
    try:
        if state.api_key is not None and _under(request, "/v1/") and not cors.is_preflight(request):
            if not _api_key_ok(request, state.api_key):
                raise GatewayError(ErrorKind.UNAUTHORIZED, "Invalid or missing API key.")
        elif state.control_token is not None and _under(request, "/control/"):
            if not bearer_ok(request.headers.get("Authorization"), state.control_token):
                raise GatewayError(ErrorKind.CONTROL_UNAUTHORIZED,
                                   "Invalid or missing control token.")
        try:
            resp = await handler(request)
        except GatewayError as err:
            resp = _error_response(err, request)
        except web.HTTPException as exc:
            if exc.status < 400:  # redirects pass through
                status = exc.status
                raise
            resp = _error_response(from_http_exception(exc), request)
        except ClientGone:
            log.debug("%s %s: client went away; engine request cancelled",
                      request.method, request.path)
            resp = web.Response(status=CLIENT_CLOSED_STATUS)
        except asyncio.CancelledError:
            status = CLIENT_CLOSED_STATUS
            raise
        except Exception:
            log.exception("unhandled error in %s %s", request.method, request.path)
            resp = _error_response(GatewayError(ErrorKind.INTERNAL, "Internal server error."),
                                   request)
        status = resp.status
        return resp
    except GatewayError as err:  # refused before the handler (auth)
        resp = _error_response(err, request)
        status = resp.status
        return resp
    finally:
        engine = state.engine
        if engine is not None:  # (a generation request not sent: answered here)
            engine.backlog.clear(request.protocol)
        state.metrics.observe(_route_label(request), status, time.perf_counter() - started)


# Bodies read as JSON besides application/*+json: unlabelled ones, and curl's default for
# `-d` (so `curl -d '{...}'` works without `-H content-type:`). Anything else is a 415.
_UNLABELLED = ("octet-stream", "x-www-form-urlencoded")


def _may_be_json(request: web.BaseRequest) -> bool:
    """application/json or application/*+json, or no Content-Type, or an unlabelled one
    (parameters ignored). Text, multipart, XML and garbage are refused."""
    return _json_media(request.headers.get("Content-Type"))


def _json_media(header: str | None) -> bool:
    """`_may_be_json` of a Content-Type header's value."""
    if header is None or header == "application/json":
        return True
    maintype, _, subtype = header.partition(";")[0].strip().lower().partition("/")
    return maintype == "application" and "/" not in subtype and (
        subtype == "json" or subtype.endswith("+json") or subtype in _UNLABELLED)


async def _read_body(request: web.Request, limit: int) -> bytes:
    if not _may_be_json(request):
        raise GatewayError(ErrorKind.UNSUPPORTED_MEDIA_TYPE,
                           f"Unsupported Content-Type {request.headers['Content-Type']!r}: "
                           "send a JSON body with Content-Type: application/json.")
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    try:
        return await read_body(request)
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(limit) from None


def _too_large(limit: int) -> GatewayError:
    return GatewayError(ErrorKind.BODY_TOO_LARGE,
                        f"Request body too large: the limit is {limit} bytes.")


# ---- generation ----------------------------------------------------------------------


def _generation_handler(dialect: Dialect, state: GatewayState,
                        faults: fault_control.FaultControl):
    """The route handler of one API dialect in the app of `state` and `faults`."""
    render = dialect.error_body

    async def handler(request: web.Request, faulted: bool = False) -> web.StreamResponse:
        if not faulted and faults.state.active:  # injected errors, retry hints (529s too)
            return await fault_control.with_faults(request, faulted_handler, faults)
        body = await _read_body(request, state.max_body_bytes)
        arrived = arrival_stamp(request)  # the request is read: the engine books it here
        gen = dialect.parse(body, state.tokenizer)  # a bad body gets its 400 before a 529
        fault = _fault_for(request, state, gen)
        pump = None
        client = state.client
        if fault is not None:
            if fault.after_tokens is None:  # scripted: the engine is not asked
                client.backlog.clear(request.protocol)
                await client.resolve_model(gen.model)
                return await fault_stream.serve_scripted(request, gen.reply, fault,
                                                         gen.prompt_tokens)
            pump = fault_stream.pump_until_fault(fault)  # fires inside the real stream
        elif not faulted:
            # The check `generate` would make in EngineClient.open, answered without raising
            # the 529 through the handler and the edge (the same response, byte for byte;
            # with faults set it is raised as before, for the hints to go on it). It
            # refuses only a model in the client's cache: `generate`'s resolve_model (a 404
            # first for an unknown one) would have passed without waiting.
            refused = _refusal(client, gen, state.replica, arrived)
            if refused is not None:
                return saturated_response(refused, request, render)
        if isinstance(gen, Batch):  # several prompts: one engine request each
            return await generate_batch(request, gen, client, state.inflight,
                                        replica=state.replica, arrived=arrived)
        return await generate(request, gen, client, state.inflight, pump,
                              replica=state.replica, arrived=arrived)

    def faulted_handler(request: web.Request) -> Awaitable[web.StreamResponse]:
        return handler(request, True)

    handler.__name__ = dialect.name.replace(".", "_")
    return handler


# The 529 as aiohttp writes `saturated_response` on a kept-alive HTTP/1.1 connection (its
# reason phrase for 529, headers in its order, then `_echo_request_id`'s), for the edge.
_REFUSAL_HEAD = response_head(529, b"application/json")
_FAULT_HEADER = FAULT_HEADER.lower().encode()


def _fast_refusal(path: str, dialect: Dialect, state: GatewayState,
                  faults: fault_control.FaultControl):
    """The generation route `path`'s 529 as its handler answers it (the same bytes and
    counts), for the edge to write without aiohttp's request machinery (gateway.edge
    FAST_POSTS): from the request's headers and body, parsed by the route's dialect as the
    handler parses them. None (aiohttp's handler then answers, from the same bytes)
    unless the engine's client refuses the request: a bad body (its 400), one that is not
    refused, and whatever the handler would treat otherwise (an API key to check, faults,
    a fault header, a Content-Type or size it refuses) are the handler's."""
    render = dialect.error_body
    parse = dialect.parse

    def where() -> str:
        return f"POST {path}"

    def answer(headers: dict[bytes, bytes], body: bytes, stamp: float | None) -> tuple | None:
        started = time.perf_counter()
        client = state.engine
        if (client is None or not client.may_refuse(stamp) or state.api_key is not None
                or faults.state.active or state.static_faults or _FAULT_HEADER in headers
                or len(body) > state.max_body_bytes):
            return None
        media = headers.get(b"content-type")
        if media is not None and not _json_media(media.decode("ascii")):
            return None
        try:
            gen = parse(body, state.tokenizer)
        except Exception:  # (a 400, or worse: the handler's to answer)
            return None
        message = _refusal(client, gen, state.replica, stamp)
        if message is None:
            return None
        out = saturated_body(message, render, where)
        head = _REFUSAL_HEAD % (len(out), http_date().encode(),
                                headers.get(b"x-request-id") or random_id().encode())
        state.metrics.observe(path, 529, time.perf_counter() - started)
        return head, out

    return answer


def _refusal(client: EngineClient, gen: Generation | Batch, replica: int | None,
             arrived: float | None) -> str | None:
    """The engine's saturation message when `open` would refuse the request (every prompt
    of a batch), which arrived at `arrived`, at once, else None."""
    if isinstance(gen, Batch):
        return batch_refusal(client, gen, replica, arrived)
    return client.refusal(gen.model, gen.prompt_tokens, gen.max_tokens, gen.n, replica, arrived)


def _fault_for(request: web.Request, state: GatewayState,
               gen: Generation | Batch) -> FaultSpec | None:
    """The fault directive (header or the model's static mode) a request gets; faults speak
    OpenAI chat and completions text streams, one prompt and one choice (a forced tool
    call gets none)."""
    header = request.headers.get(FAULT_HEADER)
    if header is None and not state.static_faults:
        return None  # (the common case, decided without building the reply)
    if not isinstance(gen.reply, Completion) or gen.n != 1:
        if header is not None:
            raise GatewayError(ErrorKind.INVALID_FAULT_DIRECTIVE,
                               f"Invalid fault directive: {FAULT_HEADER} applies to text "
                               "replies of /v1/chat/completions and /v1/completions with one "
                               "prompt and n = 1 only (not to a forced tool call)")
        return None
    try:
        return directive_for(header, gen.stream, gen.model, state.enable_directives,
                             state.static_faults)
    except DirectiveError as exc:
        raise GatewayError(ErrorKind.INVALID_FAULT_DIRECTIVE,
                           f"Invalid fault directive: {exc}") from None


async def _replica_rows(state: GatewayState) -> list[pb.ModelCapacity]:
    """This port's replica of every model that has it (GetCapacity)."""
    return await state.client.get_capacity(replica=state.replica)


def _not_ready(rows: list[pb.ModelCapacity]) -> str | None:
    """Why this replica is not ready, or None when every model's copy of it is."""
    for row in rows:
        if row.draining:
            return f"replica {row.replica} of {row.model} is draining"
        if row.starting:
            return f"replica {row.replica} of {row.model} is starting: ready in {row.ready_in_s:.1f} s"
    return None if rows else "no model has this replica"


async def _require_ready(state: GatewayState) -> set[str] | None:
    """Raise 503 unless this port's replica is ready; the models it serves (None = all)."""
    if state.replica is None:
        return None
    rows = await _replica_rows(state)
    reason = _not_ready(rows)
    if reason is not None:
        raise GatewayError(ErrorKind.REPLICA_UNAVAILABLE, reason)
    return {row.model for row in rows}


async def list_models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    served = await _require_ready(state)
    models = [m for m in await state.client.list_models()
              if served is None or m.name in served or m.parent in served]  # adapters too
    data = [vllm_api.model_card(m) for m in models]
    return web.Response(body=json_encode({"object": "list", "data": data}),
                        content_type="application/json")


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    try:
        await state.client.list_models(refresh=True)
        serving = await state.client.serving()
    except GatewayError as err:
        if err.kind is not ErrorKind.ENGINE_UNAVAILABLE:
            err = engine_unavailable(err.message)
        raise err
    if not serving:
        raise engine_unavailable("the engine is not serving (shutting down, or stalled)")
    await _require_not_stalled(state)
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def _require_not_stalled(state: GatewayState) -> None:
    """On a replica's port: 503 while a stall fault freezes that replica alone (a stall of
    the whole engine turns its gRPC health NOT_SERVING instead)."""
    if state.replica is None:
        return
    try:
        stalled = await state.client.stalled_for(state.replica)
    except GatewayError as err:
        if err.kind is ErrorKind.REPLICA_NOT_FOUND:  # closing: no model has it any more
            raise engine_unavailable(err.message) from None
        raise
    if stalled > 0:
        raise engine_unavailable(f"replica {state.replica} is stalled (a fault: "
                                 f"{stalled:.1f} s left)")


async def health_ready(request: web.Request) -> web.Response:
    """Readiness (a Kubernetes readinessProbe, an endpoint picker): 200 once this port's
    replica has passed its start-up delay and is not draining; 503 otherwise."""
    state = request.app[STATE]
    if not await state.client.serving():
        raise engine_unavailable("the engine is shutting down")
    await _require_ready(state)
    await _require_not_stalled(state)
    return web.Response(body=b'{"status":"ready"}', content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    """vLLM's series where vLLM serves them: the engine's exposition (every vllm:* series
    of the models this gateway fronts, and the engine's inference_lab_*; on a replica's
    port, that replica's alone, labelled engine = its index), then the gateway's own.
    Without an engine, the gateway's own alone (engine_metrics_up 0)."""
    state = request.app[STATE]
    try:
        if state.replica is None:
            engine = await state.client.metrics_text()
        else:  # from the gateway's copy (gateway.metrics_feed): no engine call
            engine = await state.client.replica_metrics(state.replica)
            state.metrics.copy_waits = state.client.copy_waits(state.replica)
    except GatewayError:
        engine = b""
    state.metrics.engine_up = 1 if engine else 0
    body = engine + state.metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


_METRICS_HEAD = response_head(200, CONTENT_TYPE_LATEST.encode())


def _fast_metrics(state: GatewayState) -> Callable[[bytes | None], tuple | None]:
    """A replica port's /metrics as `metrics` answers it (the same bytes, headers and
    counts), for the edge to write without aiohttp's request machinery (gateway.edge
    FAST_GETS); None when the copy is not here yet (then `metrics` waits for it)."""

    def answer(request_id: bytes | None) -> tuple | None:
        started = time.perf_counter()
        client = state.engine
        engine = None if client is None else client.replica_metrics_now(state.replica)
        if not engine:
            return None
        state.metrics.copy_waits = client.copy_waits(state.replica)
        state.metrics.engine_up = 1
        own = state.metrics.exposition()
        head = _METRICS_HEAD % (len(engine) + len(own), http_date().encode(),
                                request_id or random_id().encode())
        state.metrics.observe("/metrics", 200, time.perf_counter() - started)
        return head, engine, own  # written as they are (no copy of the ~150 KB)

    return answer


# ---- capacity control (proxies GetCapacity / SetCapacity) -----------------------------------


# What SetCapacity's int64 fields can carry; the engine checks the ranges (one home).
_Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class CapacityUpdate(msgspec.Struct, forbid_unknown_fields=True):
    model: str | None = None
    max_num_seqs: _Int64 | None = None
    max_waiting: _Int64 | None = None


_capacity_decoder = msgspec.json.Decoder(CapacityUpdate)


def _capacity_body(models: list[pb.ModelCapacity]) -> web.Response:
    rows = [
        {"model": m.model, "max_waiting": m.max_waiting, "max_num_seqs": m.max_num_seqs,
         "waiting": m.waiting, "running": m.running}
        for m in models
    ]
    return web.Response(body=json_encode(rows), content_type="application/json")


async def get_capacity(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return _capacity_body(await state.client.get_capacity(request.query.get("model") or None,
                                                          replica=state.replica))


async def set_capacity(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await _read_body(request, state.max_body_bytes)
    try:
        update = _capacity_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise invalid(f"Invalid capacity update: {exc}") from None
    except msgspec.DecodeError as exc:
        raise invalid(f"Invalid JSON body: {exc}") from None
    except RecursionError:
        raise invalid(NESTED_TOO_DEEPLY) from None
    models = await state.client.set_capacity(update.model, update.max_num_seqs, update.max_waiting,
                                              replica=state.replica)
    return _capacity_body(models)


# ---- lifecycle -----------------------------------------------------------------------------


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    state.engine = state.shared_engine or EngineClient(state.engine_target,
                                                       control_token=state.control_token,
                                                       session_lane=state.session_lane)
    state.engine.connect_soon()
    watchdog = asyncio.get_running_loop().create_task(_disconnect_watchdog(state))
    yield
    watchdog.cancel()
    await asyncio.gather(watchdog, return_exceptions=True)
    engine, state.engine = state.engine, None
    if state.shared_engine is None:
        await engine.close()


async def _echo_request_id(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """Every response carries `x-request-id`: the client's own when it sent one."""
    if "x-request-id" not in response.headers:
        response.headers["x-request-id"] = request.headers.get("x-request-id") or random_id()


async def _disconnect_watchdog(state: GatewayState) -> None:
    """Cancels engine requests whose HTTP client has gone. With handler_cancellation (as
    `run_gateway` and aiohttp's TestServer run) the handler's own `finally` does it at
    once; this covers runners without it, within `disconnect_poll_s`."""
    while True:
        await asyncio.sleep(state.disconnect_poll_s)
        engine = state.engine
        if engine is None:
            continue
        for stream, request in list(state.inflight.items()):
            transport = request.transport
            if transport is None or transport.is_closing():
                engine.cancel(stream, ClientGone())


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
    save_faults: Callable[[FaultState], None] | None = None,
    tokenizer: Tokenizer | None = None,
    replica: int | None = None,
    engine: EngineClient | None = None,
    session_lane: str | None = None,
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
    /control/faults; `save_faults` is called after every change).
    `tokenizer` turns prompts into token IDs (default: the built-in byte-level one).
    `replica` makes it the app of one replica's port (gateway.fleet): requests run on that
    replica, /health/ready and /v1/models answer 200 only while it is ready, /metrics adds
    its engine series; `engine` is then the fleet's one shared EngineClient.
    `session_lane` ("auto" or "off") is the EngineClient's: whether its Session may take the
    engine's same-host lane.
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
    )
    app = web.Application(client_max_size=max_body_bytes, middlewares=[edge_middleware])
    app[STATE] = state

    async def served_models() -> list[str]:
        return [m.name for m in await state.client.list_models()]

    app[fault_control.FAULTS] = fault_control.FaultControl(
        faults or FaultState(), max_body_bytes, served_models, save_faults)
    app.cleanup_ctx.append(_engine_ctx)
    app.on_response_prepare.append(_echo_request_id)
    for path, dialect in ROUTES.items():
        app.router.add_post(path, _generation_handler(dialect, state, app[fault_control.FAULTS]))
    # a saturated model's 529 on a kept-alive connection skips aiohttp's request objects
    app[FAST_POSTS] = {path.encode(): _fast_refusal(path, dialect, state,
                                                    app[fault_control.FAULTS])
                       for path, dialect in ROUTES.items()}
    # each generation request is in the engine client's backlog until sent or answered
    app[ARRIVALS] = (frozenset(ROUTES),
                     lambda: state.engine.backlog if state.engine is not None else None)
    app.router.add_get("/v1/models", list_models)
    vllm_api.add_routes(app, lambda: state.client, lambda: state.tokenizer,
                        lambda request: _read_body(request, state.max_body_bytes))
    count_tokens.add_routes(app, lambda: state.client, lambda: state.tokenizer,
                            lambda request: _read_body(request, state.max_body_bytes))
    stored_responses.add_routes(app)
    lora_routes.add_routes(app, lambda: state.client,
                           lambda request: _read_body(request, state.max_body_bytes))
    app.router.add_get("/health", health)
    app.router.add_get("/ping", health)  # (vLLM's, for SageMaker-style probes: /health's answer)
    app.router.add_post("/ping", health)
    app.router.add_get("/health/ready", health_ready)
    app.router.add_get("/metrics", metrics)
    if replica is not None:  # a scraper's every-50-ms GET skips aiohttp's request objects
        app[FAST_GETS] = {b"/metrics": _fast_metrics(state)}
    app.router.add_get("/control/capacity", get_capacity)
    app.router.add_post("/control/capacity", set_capacity)
    fault_control.add_routes(app)
    fault_replica.add_routes(app, lambda: state.client)
    cors.add_routes(app)  # last: every route's path answers a preflight
    return app

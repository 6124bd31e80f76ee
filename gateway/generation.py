"""The generation routes' handler, and its 529 as the edge writes it.

Knows: the one handler of every generation and pooling route (one per API dialect of
gateway.protocols.ROUTES): the body read and parsed by the route's dialect and checked
against the model it names (a bad body, or a model of the wrong kind, is its 400 before
any 529), the request's arrival stamp (gateway.edge), the replica it runs on (its port's,
or on the base port the one vLLM's X-data-parallel-rank header names), which the response
names with the model (unless told not to), fault directives
(gateway.faults: scripted replies, or a fault inside the real stream), the request's one
admission decision (gateway.admit) and its refusal answered without raising
(`saturated_response`: the same 529, or the app's saturation status, byte for byte), the
request's hold on the backlog released once it is sent (gateway.backlog `Hold`), and the
engine path of one prompt or several (gateway.protocols.generate, .batch). And
`fast_refusal`: the same decision and refusal from a read's headers and body, for the edge
to write on a kept-alive connection without aiohttp's request objects (gateway.edge
FAST_POSTS); its None hands the read to the handler, whose decision it then is.

Does not know: routes other than generation (gateway.control), the edge middleware
(gateway.middleware), gRPC (gateway.engine_client).
"""

from __future__ import annotations

import time
from typing import Awaitable

from aiohttp import web

from inference_lab.gateway import admit
from inference_lab.gateway.aiohttp_gate import http_date, response_head
from inference_lab.gateway.edge import arrival_stamp
from inference_lab.gateway.engine_client import EngineClient
from inference_lab.gateway.errors import ErrorKind, GatewayError, saturated_body, saturated_response
from inference_lab.gateway.faults import HEADER as FAULT_HEADER
from inference_lab.gateway.faults import DirectiveError, FaultSpec, directive_for
from inference_lab.gateway.faults import control as fault_control
from inference_lab.gateway.faults import stream as fault_stream
from inference_lab.gateway.middleware import (
    HOLD, MODEL_HEADER, REPLICA_HEADER, SERVED_BY, json_media, read_json_body,
)
from inference_lab.gateway.protocols import Dialect
from inference_lab.gateway.protocols.base import Batch, random_id
from inference_lab.gateway.protocols.batch import generate_batch
from inference_lab.gateway.protocols.generate import generate
from inference_lab.gateway.protocols.openai.render import Completion
from inference_lab.gateway.state import GatewayState


# vLLM's header naming the data-parallel rank a request runs on (vllm-router's DP-aware
# mode sends it): here the replica, on the base port, which fronts the engine as vLLM's
# API server fronts its ranks.
RANK_HEADER = "X-data-parallel-rank"


def generation_handler(dialect: Dialect, state: GatewayState,
                       faults: fault_control.FaultControl):
    """The route handler of one API dialect in the app of `state` and `faults`."""
    render = dialect.error_body

    async def handler(request: web.Request, faulted: bool = False) -> web.StreamResponse:
        if not faulted and faults.state.active:  # injected errors, retry hints (529s too)
            return await fault_control.with_faults(request, faulted_handler, faults)
        body = await read_json_body(request, state.max_body_bytes)
        arrived = arrival_stamp(request)  # the request is read: the engine books it here
        gen = dialect.parse(body, state.tokenizer)  # a bad body gets its 400 before a 529
        if not gen.model:  # (a route where the model is optional: the first one served)
            gen.model = await _default_model(state.client)
        replica = _replica_for(request, state)
        if state.served_by:  # named on the response, whatever it is (middleware)
            request[SERVED_BY] = (str(replica or 0),
                                  gen.model if _header_safe(gen.model) else None)
        client = state.client
        # the model's kind (a pooling model on a generation route, or the reverse: vLLM's
        # 400) and what else depends on the model, before a 529 too; an unknown model is
        # its 404 (resolved here once: the engine path does not ask again)
        dialect.check(gen, client.known_model(gen.model) or await client.resolve_model(gen.model))
        if replica is None:  # data-parallel ranks behind this port: the balancer's choice
            replica = client.pick_rank(gen.model)
            if replica is not None and state.served_by:
                request[SERVED_BY] = (str(replica), request[SERVED_BY][1])
        fault = _fault_for(request, state, gen)
        hold = request[HOLD]
        if fault is not None and fault.after_tokens is None:  # scripted: the engine is not asked
            hold.release()
            return await fault_stream.serve_scripted(request, gen.reply, fault,
                                                     gen.prompt_tokens)
        # The one admission decision (gateway.admit), as the edge's fast path takes it.
        refused = admit.refused(client, gen, replica, arrived)
        if refused is not None:
            if faulted:  # raised, for the fault's retry hints to go on it
                raise GatewayError(ErrorKind.QUEUE_SATURATED, refused)
            # the 529 the middleware would make of that error, byte for byte
            return saturated_response(refused, request, render, state.saturation)
        if isinstance(gen, Batch):  # several prompts: one engine request each
            return await generate_batch(request, gen, client, state.inflight, hold.release,
                                        replica=replica, arrived=arrived)
        pump = fault_stream.pump_until_fault(fault) if fault is not None else None
        return await generate(request, gen, client, state.inflight, hold.release, pump,
                              replica=replica, arrived=arrived)

    def faulted_handler(request: web.Request) -> Awaitable[web.StreamResponse]:
        return handler(request, True)

    handler.__name__ = dialect.name.replace(".", "_")
    return handler


def _refusal_head(state: GatewayState) -> bytes:
    """The refusal's head as aiohttp writes `saturated_response` on a kept-alive HTTP/1.1
    connection (the status and aiohttp's reason phrase for it, Retry-After when set, its
    headers in its order, then `echo_request_id`'s), for the edge; %-holes for the
    length, the date, the request id and, when named, the model (bytes, %-escaped)."""
    saturation = state.saturation
    first = (b"" if saturation.retry_after is None
             else b"Retry-After: %d\r\n" % saturation.retry_after)
    last = (b"" if not state.served_by
            else REPLICA_HEADER.encode() + b": " + str(state.replica or 0).encode()
            + b"\r\n" + MODEL_HEADER.encode() + b": %s\r\n")
    return response_head(saturation.status, b"application/json", first, last)


_FAULT_HEADER = FAULT_HEADER.lower().encode()
_RANK_HEADER = RANK_HEADER.lower().encode()


def fast_refusal(path: str, dialect: Dialect, state: GatewayState,
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
    head = _refusal_head(state)
    check = dialect.check

    def where() -> str:
        return f"POST {path}"

    def answer(headers: dict[bytes, bytes], body: bytes, stamp: float | None) -> tuple | None:
        started = time.perf_counter()
        client = state.engine
        if (client is None or not client.may_refuse(stamp) or state.api_key is not None
                or faults.state.active or state.static_faults or _FAULT_HEADER in headers
                or _RANK_HEADER in headers or len(body) > state.max_body_bytes):
            return None
        media = headers.get(b"content-type")
        if media is not None and not json_media(media.decode("ascii")):
            return None
        try:
            gen = parse(body, state.tokenizer)
            model = client.known_model(gen.model)
            if model is None:
                return None  # (the handler asks the engine for it)
            check(gen, model)
        except Exception:  # (a 400, or worse: the handler's to answer)
            return None
        message = admit.refused(client, gen, state.replica, stamp)  # (the handler's decision)
        if message is None:
            return None
        out = saturated_body(message, render, where, state.saturation)
        holes = (len(out), http_date().encode(),
                 headers.get(b"x-request-id") or random_id().encode())
        if state.served_by:
            if not _header_safe(gen.model):
                return None  # (the handler's: it leaves the name out)
            holes += (gen.model.encode(),)
        state.metrics.observe(path, state.saturation.status, time.perf_counter() - started)
        return head % holes, out

    return answer


async def _default_model(client: EngineClient) -> str:
    """The model a request that names none runs on, as vLLM's: the first one served."""
    models = await client.list_models()
    if not models:
        raise GatewayError(ErrorKind.MODEL_NOT_FOUND, "No model is served.")
    return models[0].name


def _header_safe(model: str) -> bool:
    """A model name the client sent may go into a header as it is: printable ASCII (a
    name with a line break or other control character is left off the response)."""
    return model.isascii() and model.isprintable()


def _replica_for(request: web.Request, state: GatewayState) -> int | None:
    """The replica a request runs on: its port's, or on the base port (replica 0's, or a
    lone gateway's) the one X-data-parallel-rank names. Elsewhere the header may only
    name the port's own replica (a 400 otherwise, as is a header that is no index)."""
    header = request.headers.get(RANK_HEADER)
    if header is None:
        return state.replica
    try:
        rank = int(header)
    except ValueError:
        rank = -1
    if not 0 <= rank < 2**32:
        raise GatewayError(ErrorKind.INVALID_REQUEST,
                           f"Invalid {RANK_HEADER}: {header!r} is not a replica index")
    if state.replica and rank != state.replica:
        raise GatewayError(ErrorKind.INVALID_REQUEST,
                           f"{RANK_HEADER}: {rank}: this port serves replica {state.replica} "
                           "only; the base port serves every replica")
    return rank


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

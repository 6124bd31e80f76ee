"""vLLM's own gRPC engine service (`vllm.grpc.engine.VllmEngine`), served on the engine's
gRPC port beside inference_lab.v1.Engine.

Knows vLLM's messages (inference_lab.vllm_grpc, copied from vLLM's vllm_engine.proto) and
how vLLM's grpc_server answers them: Generate is one request through the engine's own
funnel (EngineService.admit_call, as Submit: one admission, the same pacer, the same
metrics), streamed as vLLM's delta chunks and one Complete, or one Complete alone when
`stream` is false; Abort cancels by request id (the stream ends with a Complete whose
finish reason is "abort"); HealthCheck, GetModelInfo and GetServerInfo answer from the
fleet. Refusals take the engine's one table (engine.service.refusals: a saturated model is
RESOURCE_EXHAUSTED with its ErrorInfo); bad input is INVALID_ARGUMENT, as vLLM answers a
ValueError. What the lab cannot model is UNIMPLEMENTED: Embed (as vLLM's own server at that
commit) and n > 1 (this proto has no output index to tell sequences apart: refused as
INVALID_ARGUMENT).

The lab makes no tokens of its own: every generated token has the ID of `OUTPUT_TOKEN`
under the built-in byte tokenizer, and a text prompt counts that tokenizer's tokens.

Does not know timing, scheduling or the access rules (engine.service.access checks them
before any handler).
"""

from __future__ import annotations

import time
import uuid

import grpc

from inference_lab.common.tokenizer import ByteTokenizer, ids_to_bytes
from inference_lab.engine.fleet.runtime import ModelRuntime
from inference_lab.engine.service.messages import finished_pb
from inference_lab.engine.service.refusals import UnknownModel, abort
from inference_lab.engine.service.rpc import EngineService, SubmitSink
from inference_lab.engine.sim.request import Request, Status
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.vllm_grpc import vllm_engine_pb2 as vpb
from inference_lab.vllm_grpc import vllm_engine_pb2_grpc

SERVICE_NAME = vpb.DESCRIPTOR.services_by_name["VllmEngine"].full_name
SERVER_TYPE = "vllm-grpc"  # what vLLM's GetServerInfo says
# The data-parallel rank a request asks for: vLLM's `X-data-parallel-rank` header, as gRPC
# metadata (lower case); it names the replica index (one engine core per rank).
RANK_METADATA = "x-data-parallel-rank"
# Which served model a request is for, on an engine serving several (vLLM's server has one).
MODEL_METADATA = "model"
OUTPUT_TOKEN = " tok"  # four bytes: one token of the built-in tokenizer
_TOKENIZER = ByteTokenizer()
OUTPUT_TOKEN_ID = _TOKENIZER.encode(OUTPUT_TOKEN)[0]

FINISH_REASONS = {Status.FINISHED_LENGTH: "length", Status.FINISHED_CANCELLED: "abort",
                  Status.FINISHED_ABORTED: "abort"}


class BadRequest(ValueError):
    """What vLLM's server answers INVALID_ARGUMENT (a ValueError there)."""


def finish_reason(req: Request) -> str:
    """vLLM's finish reason: "stop" for a reply that ended itself, "length" at its cap,
    "abort" for a cancelled or aborted one."""
    reason = FINISH_REASONS[req.status]
    return "stop" if reason == "length" and req.eos else reason


def submit_request(request: vpb.GenerateRequest, model: str, replica: int) -> pb.SubmitRequest:
    """vLLM's GenerateRequest as the engine's own (one conversion, this direction)."""
    kind = request.WhichOneof("input")
    if kind == "tokenized":
        ids = list(request.tokenized.input_ids)
    elif kind == "text":
        ids = list(_TOKENIZER.encode(request.text))
    else:
        raise BadRequest("the request has no prompt: set `tokenized` or `text`")
    if not ids:
        raise BadRequest("the prompt is empty")
    params = request.sampling_params
    if params.n > 1:
        raise BadRequest(f"n = {params.n}: this VllmEngine proto carries no output index, "
                         "so only n = 1 is served")
    submit = pb.SubmitRequest(model=model, prompt_tokens=len(ids),
                              prompt_token_ids=ids_to_bytes(ids), replica=replica,
                              request_id=request.request_id)
    if params.HasField("max_tokens"):
        submit.max_tokens = params.max_tokens
    else:  # the engine chooses the length, and the reply ends itself (vLLM: EOS)
        submit.stop_at_end = True
    return submit


class VllmEngineService(vllm_engine_pb2_grpc.VllmEngineServicer):
    """vLLM's RPCs over the engine's service (EngineService): its funnel, fleet and
    metrics; the requests in flight by vLLM request id, for Abort."""

    def __init__(self, engine: EngineService) -> None:
        self.engine = engine
        self.started = time.time()
        self.last_receive = 0.0  # wall time of the latest Generate
        # request id -> (replica, request, sink) while it streams
        self.live: dict[str, tuple[ModelRuntime, Request, SubmitSink]] = {}

    def _metadata(self, context: grpc.aio.ServicerContext) -> tuple[str, int | None]:
        """(model, replica index or None) from the call's metadata."""
        model, rank = "", None
        for key, value in context.invocation_metadata() or ():
            if key == MODEL_METADATA:
                model = value
            elif key == RANK_METADATA:
                try:
                    rank = int(value)
                except ValueError:
                    raise BadRequest(f"{RANK_METADATA} must be an integer, got {value!r}") from None
                if rank < 0:
                    raise BadRequest(f"{RANK_METADATA} must be >= 0, got {rank}")
        return model, rank

    def _replica(self, model: str, rank: int | None) -> int:
        """The rank asked for, else the lowest replica index this process holds."""
        if rank is not None:
            return rank
        name = self.engine.base_model(model)
        held = self.engine.fleet.replicas.get(name or "", {})
        return min(held) if held else 0

    async def Generate(self, request: vpb.GenerateRequest, context: grpc.aio.ServicerContext):
        self.last_receive = time.time()
        request_id = request.request_id or uuid.uuid4().hex
        try:
            if request_id in self.live:
                raise BadRequest(f"request id {request_id!r} is already running")
            model, rank = self._metadata(context)
            submit = submit_request(request, model, self._replica(model, rank))
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        sink = SubmitSink()
        rt, req = await self.engine.admit_call(submit, sink, context)
        self.live[request_id] = (rt, req, sink)
        sent = 0
        try:
            while True:
                event, last = await sink.queue.get()
                if event.HasField("tokens"):
                    new = event.tokens.new_tokens
                    sent += new
                    if request.stream and new:
                        yield vpb.GenerateResponse(chunk=vpb.GenerateStreamChunk(
                            token_ids=[OUTPUT_TOKEN_ID] * new, prompt_tokens=req.prompt_len,
                            completion_tokens=new, cached_tokens=req.cached_tokens))
                elif event.HasField("finished"):
                    done = event.finished
                    # streamed: the Complete carries no tokens (the chunks had them), as
                    # vLLM's DELTA output; otherwise every one
                    count = 0 if request.stream else done.completion_tokens
                    yield vpb.GenerateResponse(complete=vpb.GenerateComplete(
                        output_ids=[OUTPUT_TOKEN_ID] * count, finish_reason=finish_reason(req),
                        prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens,
                        cached_tokens=done.cached_tokens))
                if last:
                    return
        finally:
            self.live.pop(request_id, None)
            rt.pacer.cancel(req)  # a no-op once finished; frees the request on disconnect

    async def Abort(self, request: vpb.AbortRequest, context) -> vpb.AbortResponse:
        """Each named request in flight is cancelled; its stream ends with a Complete
        ("abort") and the tokens it had. Unknown or finished ids are ignored, as vLLM does."""
        for request_id in request.request_ids:
            entry = self.live.get(request_id)
            if entry is None:
                continue
            rt, req, sink = entry
            if rt.pacer.cancel(req):  # (False: finishing in the step in flight)
                sink.queue.put_nowait((pb.SubmitEvent(finished=finished_pb(req)), True))
        return vpb.AbortResponse()

    async def Embed(self, request: vpb.EmbedRequest, context) -> vpb.EmbedResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                            "Embed is not modelled by inference-lab (vLLM's own gRPC server "
                            "answers UNIMPLEMENTED too); use the HTTP /v1/embeddings route")

    async def HealthCheck(self, request, context) -> vpb.HealthCheckResponse:
        """Healthy while the engine accepts work and a replica can admit it."""
        if not self.engine.accepting:
            return vpb.HealthCheckResponse(healthy=False, message="Engine is shutting down")
        ready = [rt for rt in self.engine.fleet.runtimes() if not rt.sleep_level]
        if not ready:
            return vpb.HealthCheckResponse(healthy=False, message="No replica is ready")
        return vpb.HealthCheckResponse(healthy=True, message="Health")  # vLLM's word

    async def GetModelInfo(self, request, context) -> vpb.GetModelInfoResponse:
        try:
            model, _ = self._metadata(context)
        except BadRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        name = self.engine.base_model(model) or (model or None)
        if name is None and self.engine.fleet.deployments:  # several: the first (as listed)
            name = next(iter(self.engine.fleet.deployments))
        if name not in self.engine.fleet.deployments:
            await abort(context, UnknownModel(name or "", self.engine.fleet.deployments))
        deployment = self.engine.fleet.deployments[name]
        held = self.engine.fleet.replicas.get(name, {})
        core = next(iter(held.values())).runtime.core if held else None
        return vpb.GetModelInfoResponse(
            model_path=name, is_generation=deployment.model.pooling is None,
            max_context_length=core.max_model_len if core is not None
            else deployment.model.max_seq_len,
            vocab_size=deployment.model.vocab_size, supports_vision=False)

    async def GetServerInfo(self, request, context) -> vpb.GetServerInfoResponse:
        runtimes = self.engine.fleet.runtimes()
        return vpb.GetServerInfoResponse(
            active_requests=sum(rt.core.num_waiting + rt.core.num_running for rt in runtimes),
            is_paused=any(rt.paused for rt in runtimes),
            last_receive_timestamp=self.last_receive, uptime_seconds=time.time() - self.started,
            server_type=SERVER_TYPE)

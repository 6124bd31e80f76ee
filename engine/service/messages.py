"""Core objects as messages: one conversion per kind, used by every call that sends it.

Knows the protobuf messages (inference_lab.v1) of a request's finish (`Finished`) and of a
replica's announced queue state (`QueueState`). Does not know calls or transports: Submit,
the Session (over gRPC or the lane) and the capacity calls send what these return.
Refusals have their own table (engine.service.refusals).
"""

from __future__ import annotations

from inference_lab.engine.fleet.runtime import ModelRuntime
from inference_lab.engine.sim.request import Request, Status
from inference_lab.v1 import engine_pb2 as pb

FINISH_REASON_PB = {
    Status.FINISHED_LENGTH: pb.FINISH_REASON_LENGTH,
    Status.FINISHED_CANCELLED: pb.FINISH_REASON_CANCELLED,
    Status.FINISHED_ABORTED: pb.FINISH_REASON_ABORTED,
}


def finished_pb(req: Request) -> pb.Finished:
    def since_arrival(t: float) -> float:
        return t - req.arrival if t >= 0 else 0.0

    return pb.Finished(
        reason=FINISH_REASON_PB[req.status], prompt_tokens=req.prompt_len,
        completion_tokens=0 if req.pooling else req.num_output, queue_time_s=since_arrival(req.first_scheduled),
        ttft_s=since_arrival(req.first_token), e2e_s=since_arrival(req.finish_time),
        preemptions=req.preemptions, cached_tokens=req.cached_tokens, index=req.index,
        external_tokens=req.external_tokens if req.first_scheduled >= 0 else 0,
        kv_transfer_params=kv_params_pb(req.handoff.params) if req.handoff is not None else None)


def kv_params_pb(params: dict) -> pb.KvTransferParams:
    return pb.KvTransferParams(**params)


def offload_caps(params: pb.KvTransferParams) -> tuple[int, int, tuple[str, ...] | None]:
    """A request's KV offloading caps (max_load_tokens, max_offload_tokens, kv_load_tiers'
    media) as the core's KvTransfer takes them: -1 where absent (no cap), 0 turns loading
    / storing off; tiers None where not given (every tier), () loads from none."""
    return (params.max_load_tokens if params.HasField("max_load_tokens") else -1,
            params.max_offload_tokens if params.HasField("max_offload_tokens") else -1,
            tuple(params.kv_load_tiers) if params.kv_load_tiers_given else None)


def queue_state_pb(rt: ModelRuntime, span: bool = True) -> pb.QueueState:
    """The state a replica announced (ModelRuntime.queue_state); with `span` (a client on
    this machine's clock) the span of instants it may refuse on the engine's word."""
    saturated, waiting, max_waiting, message, since, until = rt.queue_state
    state = pb.QueueState(model=rt.core.name, saturated=saturated, waiting=waiting,
                          max_waiting=max_waiting, replica=rt.replica, message=message)
    if saturated and span and until:
        state.since_monotonic_s = since
        state.until_monotonic_s = until
    return state

"""The engine's refusals: one table from each refusal to its gRPC status code and reason.

Knows the exceptions a call can be refused with (the core's, the fleet's and the service's
own), their gRPC status codes, machine-readable reasons (google.rpc.ErrorInfo.reason under
Submit and unary calls, Rejected.reason inside a Session) and metadata, and how a refused
call carries them. Does not know which call refuses what, nor HTTP: the gateway's error
table maps these codes to HTTP once.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from inference_lab.engine.fleet.replicas import ReplicaNotFound, ReplicaUnavailable
from inference_lab.engine.sim.core import CapacityError, HandoffsFull, QueueSaturated, SubmitError
from inference_lab.v1 import engine_pb2 as pb

DOMAIN = "inference-lab"


class UnknownModel(LookupError):
    """A model this engine does not serve."""

    def __init__(self, model: str, served: Iterable[str]) -> None:
        super().__init__(f"model {model!r} is not served here (models: {', '.join(served)})")


class ShuttingDown(Exception):
    """The engine is draining for shutdown: no new work."""

    def __init__(self) -> None:
        super().__init__("engine is shutting down")


class Unauthenticated(Exception):
    """A control call without the control token."""


# The one table from an engine refusal to its gRPC status code and machine-readable
# reason (ErrorInfo.reason under Submit and unary calls, Rejected.reason in a Session).
REFUSALS: dict[type[Exception], tuple[grpc.StatusCode, str]] = {
    QueueSaturated: (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_SATURATED"),
    # P/D: the replica's handoffs hold their cap of its KV cache (engine.sim.kv_transfer);
    # UNAVAILABLE, not RESOURCE_EXHAUSTED: the queue is not full, this replica cannot hold
    # another handoff until one is pulled (the gateway answers a 503 kv_transfer_full)
    HandoffsFull: (grpc.StatusCode.UNAVAILABLE, "KV_TRANSFER_FULL"),
    SubmitError: (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
    CapacityError: (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CAPACITY"),
    UnknownModel: (grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND"),
    ReplicaNotFound: (grpc.StatusCode.NOT_FOUND, "REPLICA_NOT_FOUND"),
    # its reason says why: REPLICA_NOT_READY, REPLICA_DRAINING or NO_REPLICA (engine.fleet)
    ReplicaUnavailable: (grpc.StatusCode.UNAVAILABLE, "REPLICA_UNAVAILABLE"),
    ShuttingDown: (grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN"),
    Unauthenticated: (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"),
}
REFUSED = tuple(REFUSALS)


def refusal(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """(gRPC code, reason) of a refusal, from REFUSALS (a refusal naming its own reason,
    like ReplicaUnavailable, keeps it)."""
    code, reason = REFUSALS[type(exc)]
    return code, getattr(exc, "reason", reason)


def refusal_metadata(exc: Exception) -> dict[str, str]:
    if isinstance(exc, QueueSaturated):
        return {"model": exc.model, "waiting": str(exc.waiting), "max_waiting": str(exc.max_waiting)}
    return {}


def refusal_status(exc: Exception) -> grpc.Status:
    """The status of a refused call: its code, message and google.rpc.ErrorInfo{reason,
    domain, metadata} in the details."""
    code, reason = refusal(exc)
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=refusal_metadata(exc))
    status = status_pb2.Status(code=code.value[0], message=str(exc))
    status.details.add().Pack(info)
    return rpc_status.to_status(status)


async def abort(context: grpc.aio.ServicerContext, exc: Exception):
    status = refusal_status(exc)
    await context.abort(status.code, status.details, status.trailing_metadata)


def rejected_pb(exc: Exception) -> pb.Rejected:
    """The same refusal inside a Session."""
    code, reason = refusal(exc)
    return pb.Rejected(code=code.value[0], reason=reason, message=str(exc),
                       metadata=refusal_metadata(exc))

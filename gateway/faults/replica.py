"""Replica-level faults over HTTP: `GET/POST /control/faults/replica`, proxied to the
engine's InjectFault / GetFaultState RPCs.

Knows: the request body (`fault`: crash | stall | slow | clear, `seconds`, `factor`,
`replica`), checked with precise 400s; the answer's shape. `replica` i targets replica i
of every model (what gateway port + i fronts); without it, every replica: the whole
engine. A replica no model has is a 404 (`replica_not_found`, the engine's NOT_FOUND).

Does not know: what the engine does with them (engine.service.replica_faults).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from aiohttp import web

from inference_lab.common.fault_names import MAX_FAULT_SECONDS, MAX_SLOW_FACTOR, REPLICA_FAULTS
from inference_lab.gateway.edge import read_body
from inference_lab.gateway.protocols.base import decode as decode_json
from inference_lab.gateway.protocols.base import invalid, json_encode, query_index
from inference_lab.v1 import engine_pb2 as pb

KINDS = {"crash": pb.ENGINE_FAULT_CRASH, "stall": pb.ENGINE_FAULT_STALL,
         "slow": pb.ENGINE_FAULT_SLOW, "clear": pb.ENGINE_FAULT_CLEAR}


class ReplicaFault(msgspec.Struct, forbid_unknown_fields=True):
    fault: Literal[REPLICA_FAULTS]  # type: ignore[valid-type]
    seconds: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_FAULT_SECONDS)] = 0.0
    factor: Annotated[float, msgspec.Meta(gt=0.0, le=MAX_SLOW_FACTOR)] | None = None
    replica: Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)] | None = None  # None: all


_decoder = msgspec.json.Decoder(ReplicaFault)


def decode(body: bytes) -> ReplicaFault:
    fault = decode_json(_decoder, body, "replica fault",
                        'Expected {"fault": "crash" | "stall" | "slow" | "clear", '
                        '"seconds": S, "factor": k, "replica"?: i}')
    if fault.fault == "stall" and fault.seconds <= 0:
        raise invalid("A stall needs seconds > 0 - at `$.seconds`")
    if fault.fault == "slow" and fault.factor is None:
        raise invalid("A slowdown needs a factor (step times x factor) - at `$.factor`")
    if fault.fault != "slow" and fault.factor is not None:
        raise invalid("factor applies to fault \"slow\" only - at `$.factor`")
    return fault


def _body(state: pb.EngineFaultState) -> web.Response:
    return web.Response(body=json_encode({
        "replica": state.replica if state.HasField("replica") else None,
        "stalled_for_s": round(state.stalled_for_s, 3),
        "slow_factor": state.slow_factor, "slow_for_s": round(state.slow_for_s, 3)}),
        content_type="application/json")


def add_routes(app: web.Application, client) -> None:
    """`client()` is the gateway's EngineClient."""

    async def get_replica(request: web.Request) -> web.Response:
        return _body(await client().fault_state(query_index(request.query, "replica")))

    async def post_replica(request: web.Request) -> web.Response:
        fault = decode(await read_body(request))
        return _body(await client().inject_fault(KINDS[fault.fault], fault.seconds,
                                                 fault.factor or 0.0, fault.replica))

    app.router.add_get("/control/faults/replica", get_replica)
    app.router.add_post("/control/faults/replica", post_replica)

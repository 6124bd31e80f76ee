"""The routes beside generation: models, health, readiness, metrics, capacity control.

Knows: /v1/models (on a replica's port, the models that replica serves), /health and
vLLM's /ping (the engine answers and serves; a replica's port: not stalled; which
replicas sleep, in sleep mode), /health/ready (a replica past its start-up delay, not
draining and not asleep), /metrics (the engine's exposition,
a replica's from the gateway's copy, then the gateway's own series; `fast_metrics` is the
same answer for the edge to write on a kept-alive connection, gateway.edge FAST_GETS), and
/control/capacity (GetCapacity and SetCapacity, the engine checking the ranges).

Does not know: generation (gateway.generation), the edge middleware (gateway.middleware),
gRPC (gateway.engine_client).
"""

from __future__ import annotations

import time
from typing import Annotated, Callable

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from inference_lab.common.control_rows import capacity_row
from inference_lab.gateway.aiohttp_gate import http_date, response_head
from inference_lab.gateway.errors import ErrorKind, GatewayError, engine_unavailable
from inference_lab.gateway.middleware import read_json_body
from inference_lab.gateway.protocols import vllm as vllm_api
from inference_lab.gateway.protocols.base import (NESTED_TOO_DEEPLY, NOT_UTF8, invalid,
                                                  json_encode, query_text, random_id)
from inference_lab.gateway.state import STATE, GatewayState
from inference_lab.v1 import engine_pb2 as pb


async def _replica_rows(state: GatewayState) -> list[pb.ModelCapacity]:
    """This port's replica of every model that has it (GetCapacity)."""
    return await state.client.get_capacity(replica=state.replica)


def _not_ready(rows: list[pb.ModelCapacity]) -> str | None:
    """Why this replica is not ready, or None when every model's copy of it is."""
    for row in rows:
        if row.draining:
            return f"replica {row.replica} of {row.model} is draining"
        if row.sleep_level:
            return f"replica {row.replica} of {row.model} is sleeping (level {row.sleep_level})"
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
    # sleep mode: alive (200, as vLLM's /health), and saying which replicas sleep
    asleep = [{"model": r.model, "replica": r.replica, "level": r.sleep_level}
              for r in await state.client.get_capacity(replica=state.replica) if r.sleep_level]
    if asleep:
        return web.Response(body=json_encode({"status": "sleeping", "sleeping": asleep}),
                            content_type="application/json")
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


def fast_metrics(state: GatewayState) -> Callable[[bytes | None], tuple | None]:
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
        return head, engine, own  # written as they are (no copy of the engine's text)

    return answer


# ---- capacity control (proxies GetCapacity / SetCapacity) -----------------------------------


# What SetCapacity's int64 fields can carry; the engine checks the ranges (one home).
_Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class CapacityUpdate(msgspec.Struct, forbid_unknown_fields=True):
    model: str | None = None
    max_num_seqs: _Int64 | None = None
    max_waiting: _Int64 | None = None
    rank: Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)] | None = None  # data-parallel only


_capacity_decoder = msgspec.json.Decoder(CapacityUpdate)


def _capacity_body(models: list[pb.ModelCapacity], ranks: bool = False) -> web.Response:
    """The rows of /control/capacity; data-parallel ranks behind one port name their rank."""
    rows = [capacity_row(m.model, m.max_waiting, m.max_num_seqs, m.waiting, m.running,
                         m.replica if ranks else None)
            for m in models]
    return web.Response(body=json_encode(rows), content_type="application/json")


def _ranks_here(state: GatewayState) -> bool:
    """Data-parallel ranks behind this one port (each row names its rank)."""
    return state.data_parallel and state.replica is None


def _rank(state: GatewayState, rank: int | None) -> int | None:
    """The replica a capacity call names: this port's, or the rank asked for where the
    ranks share this port (a 400 elsewhere)."""
    if rank is None:
        return state.replica
    if not _ranks_here(state):
        raise invalid("rank: only data-parallel ranks behind one port (serve "
                      "--data-parallel-size D) take a rank; a replica has its own port")
    return rank


async def get_capacity(request: web.Request) -> web.Response:
    state = request.app[STATE]
    text = query_text(request.query, "rank")
    rank = None
    if text is not None:
        if not text.isdigit() or int(text) >= 2**32:
            raise invalid(f"rank: expected a rank (an integer >= 0), got {text[:40]!r}")
        rank = int(text)
    return _capacity_body(await state.client.get_capacity(query_text(request.query, "model"),
                                                          replica=_rank(state, rank)),
                          _ranks_here(state))


async def set_capacity(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await read_json_body(request, state.max_body_bytes)
    try:
        update = _capacity_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise invalid(f"Invalid capacity update: {exc}") from None
    except msgspec.DecodeError as exc:
        raise invalid(f"Invalid JSON body: {exc}") from None
    except UnicodeDecodeError:  # (older msgspec raises it for a string that is not UTF-8)
        raise invalid(NOT_UTF8) from None
    except RecursionError:
        raise invalid(NESTED_TOO_DEEPLY) from None
    models = await state.client.set_capacity(update.model, update.max_num_seqs, update.max_waiting,
                                              replica=_rank(state, update.rank))
    return _capacity_body(models, _ranks_here(state))

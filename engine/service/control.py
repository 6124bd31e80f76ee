"""The control RPCs: capacity, replicas, replica faults, the models served and their LoRA
adapters, the KV-event publishers.

Knows the request and response messages of those calls and how each acts on the fleet
(engine.fleet), the replica faults (engine.service.replica_faults) and the replicas'
cores. Does not know admission, Sessions or metrics RPCs (engine.service.rpc), nor the
secrets the calls need: the server's interceptor checks them before any handler runs
(engine.service.access).

`ControlRpcs` is mixed into the servicer (engine.service.rpc.EngineService), which
provides `fleet`, `metrics` and `accepting`; the mixin keeps the state of its own calls.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable

import grpc

from inference_lab.common.fault_names import MAX_FAULT_SECONDS, MAX_SLOW_FACTOR
from inference_lab.engine.fleet.replicas import ReplicaNotFound
from inference_lab.engine.fleet.rules import status
from inference_lab.engine.fleet.runtime import ModelRuntime
from inference_lab.engine.service.lora_modules import read_rank
from inference_lab.engine.service.messages import queue_state_pb
from inference_lab.engine.service.refusals import REFUSED, ShuttingDown, UnknownModel, abort
from inference_lab.engine.service.dev import MODE_PB
from inference_lab.engine.service.replica_faults import ReplicaFaults
from inference_lab.engine.sim.capacity import require_change
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.kv import total_blocks
from inference_lab.engine.sim.lora import MAX_ADAPTERS, LoraError, check_adapter_name, shown
from inference_lab.v1 import engine_pb2 as pb

log = logging.getLogger(__name__)


class ControlRpcs:
    """GetCapacity, SetCapacity, SetReplicas, InjectFault, GetFaultState, ListModels,
    LoadLoraAdapter, UnloadLoraAdapter and GetKvEventSources over the servicer's fleet."""

    def __init__(self) -> None:
        # LoRA name -> (base model, path, rank); every replica of the base loads it
        self.adapters: dict[str, tuple[str, str, int]] = {}
        self.on_capacity_change: Callable[[], None] | None = None  # after every SetCapacity
        self.replica_faults: ReplicaFaults | None = None  # set by the server once started
        self.kv_events = None  # the server's ReplicaPublishers, when KV events are on

    # ---- capacity and models ------------------------------------------------------------
    def _capacity(self, replicas) -> list[pb.ModelCapacity]:
        now = self.fleet.now()
        rows = []
        for r in replicas:
            core, st = r.runtime.core, status(r, now)
            rows.append(pb.ModelCapacity(
                model=core.name, max_waiting=core.max_waiting, max_num_seqs=core.max_num_seqs,
                waiting=core.num_waiting, running=core.num_running, replica=r.index,
                starting=st.starting, draining=st.draining, ready_in_s=st.ready_in_s,
                sleep_level=r.runtime.sleep_level, wake_s=r.runtime.wake_s,
                kv_role=r.runtime.kv_role, kv_engine_id=r.runtime.engine_id,
                paused=MODE_PB[r.runtime.paused]))
        return rows

    def _select(self, model: str, replica: int | None) -> list:
        """The replicas a capacity call acts on (UnknownModel, ReplicaNotFound for none)."""
        if model and model not in self.fleet.deployments:
            raise UnknownModel(model, self.fleet.deployments)
        return self.fleet.select(model, replica)

    async def _replicas_of(self, request, context) -> list:
        """The replicas a request's `model` (every model when empty) and optional `replica`
        select; an unknown one aborts the call with its refusal."""
        replica = request.replica if request.HasField("replica") else None
        try:
            return self._select(request.model, replica)
        except REFUSED as exc:
            await abort(context, exc)

    async def GetCapacity(self, request: pb.GetCapacityRequest, context):
        return pb.CapacityResponse(models=self._capacity(await self._replicas_of(request, context)))

    async def SetCapacity(self, request: pb.SetCapacityRequest, context):
        try:
            return self._set_capacity(request, context)
        except REFUSED as exc:
            await abort(context, exc)

    def _set_capacity(self, request: pb.SetCapacityRequest, context) -> pb.SetCapacityResponse:
        seqs = request.max_num_seqs if request.HasField("max_num_seqs") else None
        waiting = request.max_waiting if request.HasField("max_waiting") else None
        require_change(seqs, waiting)  # before the model: a request with nothing is invalid
        model = request.model if request.HasField("model") else ""
        replica = request.replica if request.HasField("replica") else None
        replicas = self._select(model, replica)
        runtimes = [r.runtime for r in replicas]
        for rt in runtimes:  # validate everything before changing anything
            rt.core.check_capacity(seqs, waiting)
        for rt in runtimes:
            rt.core.set_capacity(seqs, waiting)
            rt.pacer.poke()
            rt.check_queue()
            log.info("capacity of %s replica %d: max_num_seqs=%d max_waiting=%d",
                     rt.core.name, rt.replica, rt.core.max_num_seqs, rt.core.max_waiting)
        if self.on_capacity_change is not None:
            self.on_capacity_change()
        if self.metrics is not None:
            self.metrics.touch()  # the capacity gauges moved
        return pb.SetCapacityResponse(models=self._capacity(replicas),
                                      queue_states=[queue_state_pb(rt) for rt in runtimes])

    async def SetReplicas(self, request: pb.SetReplicasRequest, context):
        try:
            if not self.accepting:
                raise ShuttingDown()
            if request.model and request.model not in self.fleet.deployments:
                raise UnknownModel(request.model, self.fleet.deployments)
        except REFUSED as exc:
            await abort(context, exc)
        try:
            self.fleet.check_count(request.replicas, request.model)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.CapacityResponse(models=self._capacity(self.fleet.scale(request.model,
                                                                          request.replicas)))

    # ---- replica-level faults (engine.service.replica_faults) ----------------------------
    def _fault_state(self, replica: int | None = None) -> pb.EngineFaultState:
        st = self.replica_faults.status(replica)
        return pb.EngineFaultState(stalled_for_s=st.stalled_for_s, slow_factor=st.slow_factor,
                                   slow_for_s=st.slow_for_s, replica=replica)

    async def _fault_target(self, request, context) -> int | None:
        """The replica a fault call names (None: the whole engine); NOT_FOUND when no
        model has it."""
        if self.replica_faults is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine is not started")
        if not request.HasField("replica"):
            return None
        try:
            self.fleet.select("", request.replica)
        except ReplicaNotFound as exc:
            await abort(context, exc)
        return request.replica

    async def InjectFault(self, request: pb.InjectFaultRequest, context):
        replica = await self._fault_target(request, context)
        faults, kind, seconds = self.replica_faults, request.kind, request.seconds
        if not math.isfinite(seconds) or not 0 <= seconds <= MAX_FAULT_SECONDS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"seconds must be in [0, {MAX_FAULT_SECONDS:g}], got {seconds!r}")
        if kind == pb.ENGINE_FAULT_CRASH:
            await faults.crash(replica)
        elif kind == pb.ENGINE_FAULT_STALL:
            if seconds <= 0:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    "a stall needs seconds > 0")
            faults.stall(seconds, replica)
        elif kind == pb.ENGINE_FAULT_SLOW:
            factor = request.factor
            if not (math.isfinite(factor) and 0 < factor <= MAX_SLOW_FACTOR):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"a slowdown needs factor in (0, {MAX_SLOW_FACTOR:g}], "
                                    f"got {factor!r}")
            faults.slow(factor, seconds, replica)
        elif kind == pb.ENGINE_FAULT_CLEAR:
            faults.clear(replica)
        else:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "kind must be ENGINE_FAULT_CRASH, _STALL, _SLOW or _CLEAR")
        return self._fault_state(replica)

    async def GetFaultState(self, request: pb.GetFaultStateRequest, context):
        return self._fault_state(await self._fault_target(request, context))

    async def GetKvEventSources(self, request: pb.GetKvEventSourcesRequest, context):
        publishers = self.kv_events.publishers() if self.kv_events is not None else []
        if request.HasField("replica"):
            publishers = [(i, p) for i, p in publishers if i == request.replica]
        return pb.KvEventSources(sources=[
            pb.KvEventSource(replica=i, data_parallel_rank=p.rank, endpoint=p.endpoint,
                             replay_endpoint=p.replay_endpoint or "", topic=p.config.topic,
                             hwm=p.config.hwm, buffer_steps=p.config.buffer_steps)
            for i, p in publishers])

    def _max_request_tokens(self, deployment) -> int:
        """The largest request the model takes: every replica of a model has the same rules,
        so any replica's core answers (a model with none left: a core built to ask)."""
        replicas = self.fleet.replicas.get(deployment.name)
        core = next(iter(replicas.values())).runtime.core if replicas else EngineCore(deployment)
        return core.max_request_tokens

    async def ListModels(self, request, context):
        def info(d, name: str, parent: str = "", rank: int = 0) -> pb.ModelInfo:
            model = pb.ModelInfo(name=name, hardware=d.hardware.name, tp=d.tp,
                                 max_model_len=d.scheduler.max_model_len or d.model.max_seq_len,
                                 kv_blocks=total_blocks(d), block_size=d.scheduler.block_size,
                                 parent=parent, lora_rank=rank,
                                 max_request_tokens=self._max_request_tokens(d),
                                 max_num_batched_tokens=d.scheduler.max_num_batched_tokens,
                                 enable_chunked_prefill=d.scheduler.enable_chunked_prefill,
                                 gpu_memory_utilization=d.scheduler.gpu_memory_utilization)
            pooling = d.model.pooling
            if pooling is not None:
                model.pooling.CopyFrom(pb.PoolingInfo(
                    task=pooling.task, dimensions=pooling.dimensions, normalize=pooling.normalize,
                    matryoshka=pooling.matryoshka,
                    matryoshka_dimensions=pooling.matryoshka_dimensions,
                    pooling_type=pooling.pooling_type))
            offload = d.offload
            if offload is not None:
                model.kv_offload.CopyFrom(pb.KvOffloadInfo(
                    size_gib=offload.size_gib, backend=offload.backend,
                    kv_transfer_config_json=json.dumps(offload.kv_transfer_config())))
            return model

        deployments = self.fleet.deployments
        models = [info(d, d.name) for d in deployments.values()]
        models += [info(deployments[base], name, base, rank)
                   for name, (base, _, rank) in self.adapters.items()]
        return pb.ListModelsResponse(models=models)

    # ---- LoRA adapters -------------------------------------------------------------------
    def load_adapter(self, name: str, path: str, base: str, rank: int) -> str:
        """Register an adapter on every replica of its base (LoraError / KeyError for the
        caller to map); replicas added later load it too (`adapt`). Every replica's
        registry is asked first (name, rank, room under its limit), so a refused adapter
        is registered nowhere."""
        deployments = self.fleet.deployments
        base = base or (next(iter(deployments)) if len(deployments) == 1 else "")
        if base not in deployments:
            raise KeyError(base)
        replicas = self.fleet.select(base, None)
        if any(r.runtime.core.loras is None for r in replicas):
            raise LoraError(f"LoRA is not enabled for {base} (start the engine with "
                            "--enable-lora or --lora-modules)")
        check_adapter_name(name)
        if name in deployments or name in self.adapters:
            raise LoraError(f"The lora adapter '{name}' has already been loaded.")
        held = sum(1 for b, _, _ in self.adapters.values() if b == base)
        if held >= MAX_ADAPTERS:  # (counted here too: a model scaled to 0 has no registry)
            raise LoraError(f"{base} has {held} LoRA adapters loaded, the most it may hold "
                            f"({MAX_ADAPTERS}); unload one first")
        for r in replicas:
            r.runtime.core.loras.check(name, rank)
        self.adapters[name] = (base, path, rank)
        for r in replicas:
            self.adapt(r.runtime)
        log.info("LoRA adapter %s (rank %d, %s) loaded for %s", name, rank, path, base)
        return f"Success: LoRA adapter '{name}' added successfully."

    def adapt(self, rt: ModelRuntime) -> None:
        """Give a replica every adapter of its model it lacks."""
        for name, (base, path, rank) in self.adapters.items():
            if base == rt.core.name and name not in rt.adapters and rt.core.loras is not None:
                rt.adapters[name] = rt.core.loras.load(name, path, rank)

    async def LoadLoraAdapter(self, request: pb.LoadLoraAdapterRequest, context):
        try:
            check_adapter_name(request.lora_name)
            rank = read_rank(request.lora_path)
            message = self.load_adapter(request.lora_name, request.lora_path,
                                        request.base_model_name, rank)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(
                UnknownModel(request.base_model_name, self.fleet.deployments)))
        except LoraError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.LoraAdapterResponse(message=message)

    async def UnloadLoraAdapter(self, request: pb.UnloadLoraAdapterRequest, context):
        entry = self.adapters.pop(request.lora_name, None)
        if entry is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"The lora adapter '{shown(request.lora_name)}' cannot be found.")
        for r in self.fleet.select(entry[0], None):
            if r.runtime.adapters.pop(request.lora_name, None) is not None:
                r.runtime.core.loras.unload(request.lora_name)
        log.info("LoRA adapter %s unloaded", request.lora_name)
        return pb.LoraAdapterResponse(
            message=f"Success: LoRA adapter '{request.lora_name}' removed successfully.")

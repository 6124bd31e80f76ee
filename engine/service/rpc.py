"""The engine's gRPC service: the admission funnel, progress delivery and capacity control.

Knows the protobuf messages (inference_lab.v1) and gRPC status codes: this is the one
place where core objects turn into messages and errors into statuses. Does not know
timing (engine.pacer) or scheduling (engine.core).

Admission is one synchronous step on the event loop: EngineCore.submit checks the
waiting depth against max_waiting and queues the request with no await in between, so
no burst can over-admit; a refusal leaves before any message is written.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

import grpc
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from inference_lab.common.auth import bearer_ok
from inference_lab.engine.sim.core import CapacityError, EngineCore, QueueSaturated, SubmitError
from inference_lab.engine.service.kv_events import ZmqEventPublisher
from inference_lab.engine.service.lora_modules import read_rank
from inference_lab.engine.sim.lora import LoraAdapter, LoraError
from inference_lab.engine.service.replica_faults import ReplicaFaults
from inference_lab.engine.service.metrics import EngineMetrics, ModelMetrics
from inference_lab.engine.drivers.pacer import Pacer, Stream
from inference_lab.engine.sim.request import Request, Status
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc

log = logging.getLogger(__name__)

DOMAIN = "inference-lab"
MAX_FAULT_SECONDS = 86_400.0
MAX_SLOW_FACTOR = 1000.0
# A Session write that waits longer than this (wall s) means its reader (the gateway) is
# late: reported to the pacers as lateness (engine.drivers.cadence).
WRITE_LATE = 0.0005
_U64 = 2**64 - 1
FINISH_REASON_PB = {
    Status.FINISHED_LENGTH: pb.FINISH_REASON_LENGTH,
    Status.FINISHED_CANCELLED: pb.FINISH_REASON_CANCELLED,
    Status.FINISHED_ABORTED: pb.FINISH_REASON_ABORTED,
}


def queue_state(core: EngineCore) -> tuple[bool, int, int]:
    """(saturated, waiting, max_waiting) as a Session announces it: the numbers only
    matter (and are only set) while saturated, so the state changes rarely."""
    waiting, max_waiting = core.num_waiting, core.max_waiting
    if max_waiting and waiting >= max_waiting:
        return True, waiting, max_waiting
    return False, 0, 0


class ModelRuntime:
    """One served model: its core, the pacer driving it, its metrics, and the admission
    state last announced to Sessions (with a version that counts its changes)."""

    def __init__(self, core: EngineCore, metrics: ModelMetrics, update_rate: float = 0.0,
                 time_scale: float = 1.0, kv_events: ZmqEventPublisher | None = None,
                 coalesce_when_late: bool = True) -> None:
        self.core = core
        self.metrics = metrics
        self.kv_events = kv_events
        self.queue_state = queue_state(core)
        self.queue_version = 0
        self.on_queue_change: Callable[[], None] | None = None
        on_step = metrics.on_step if kv_events is None else self._on_step
        self.pacer = Pacer(core, on_step=on_step, on_lag=metrics.on_lag,
                           on_finished=metrics.on_finished, on_change=self.check_queue,
                           on_cadence=metrics.on_cadence, update_rate=update_rate,
                           coalesce_when_late=coalesce_when_late, time_scale=time_scale)

    def _on_step(self, result) -> None:
        """A retired step: metrics, then the cache's events of the step as one batch."""
        self.metrics.on_step(result)
        core = self.core
        self.kv_events.publish(core.name, core.prefix_cache.take_events(), core.block_size)

    def check_queue(self) -> None:
        """Called wherever the queue or its bound may have moved (admissions, steps,
        cancels, capacity changes); announces a changed state to every Session."""
        state = queue_state(self.core)
        if state != self.queue_state:
            self.queue_state = state
            self.queue_version += 1
            if self.on_queue_change is not None:
                self.on_queue_change()

    def queue_state_pb(self) -> pb.QueueState:
        saturated, waiting, max_waiting = self.queue_state
        return pb.QueueState(model=self.core.name, saturated=saturated, waiting=waiting,
                             max_waiting=max_waiting)


# ---- core objects -> messages ------------------------------------------------------------
def finished_pb(req: Request) -> pb.Finished:
    def since_arrival(t: float) -> float:
        return t - req.arrival if t >= 0 else 0.0

    return pb.Finished(
        reason=FINISH_REASON_PB[req.status], prompt_tokens=req.prompt_len,
        completion_tokens=req.num_output, queue_time_s=since_arrival(req.first_scheduled),
        ttft_s=since_arrival(req.first_token), e2e_s=since_arrival(req.finish_time),
        preemptions=req.preemptions, cached_tokens=req.cached_tokens, index=req.index)


def saturated_metadata(exc: QueueSaturated) -> dict[str, str]:
    return {"model": exc.model, "waiting": str(exc.waiting), "max_waiting": str(exc.max_waiting)}


def saturated_status(exc: QueueSaturated) -> grpc.Status:
    """RESOURCE_EXHAUSTED with google.rpc.ErrorInfo{reason: QUEUE_SATURATED} in details."""
    info = error_details_pb2.ErrorInfo(reason="QUEUE_SATURATED", domain=DOMAIN,
                                       metadata=saturated_metadata(exc))
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=str(exc))
    status.details.add().Pack(info)
    return rpc_status.to_status(status)


def rejected_pb(code: grpc.StatusCode, reason: str, message: str,
                metadata: dict[str, str] | None = None) -> pb.Rejected:
    return pb.Rejected(code=code.value[0], reason=reason, message=message, metadata=metadata or {})


# ---- sinks: where the pacer's deliveries go --------------------------------------------------
class SubmitSink:
    """One Submit call: a queue of (SubmitEvent, last) drained by the handler; `last` is
    True on the Finished of the request's last sequence to finish."""

    __slots__ = ("queue", "last", "finals")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[pb.SubmitEvent, bool]] = asyncio.Queue()
        self.last: dict[int, int] = {}  # sequence index -> tokens sent
        self.finals = 0  # Finished events queued

    def on_tokens(self, stream: Stream, total: int) -> None:
        index = stream.index
        new = total - self.last.get(index, 0)
        self.last[index] = total
        self.queue.put_nowait((pb.SubmitEvent(
            tokens=pb.Tokens(new_tokens=new, total_tokens=total, index=index)), False))

    def on_finished(self, stream: Stream, req: Request) -> None:
        self.finals += 1
        last = req.all_finished and self.finals == len(req.members)
        self.queue.put_nowait((pb.SubmitEvent(finished=finished_pb(req)), last))

    def flush(self) -> None:
        pass


class SessionSink:
    """One Session: events, packed token progress and changed queue states gathered into
    one ProgressBatch per flush (at most one per pacer wake-up, plus admissions as they
    happen)."""

    def __init__(self, runtimes: list[ModelRuntime]) -> None:
        self.runtimes = runtimes
        self.seen: dict[str, int] = {}  # model -> queue_version announced on this Session
        self.events: list[pb.Progress] = []
        self.totals: dict[int, int] = {}  # tag -> tokens so far, latest wins
        self.open: dict[int, tuple[ModelRuntime, Request]] = {}
        self.ready = asyncio.Event()
        self.closing = False  # the engine is stopping: end the call once flushed
        self.ended = asyncio.Event()

    def on_tokens(self, stream: Stream, total: int) -> None:
        # Sequence i of a request with n > 1 reports under tag + i.
        self.totals[stream.tag + stream.index] = total  # while the writer is blocked, updates merge

    def on_finished(self, stream: Stream, req: Request) -> None:
        if req.all_finished:
            self.open.pop(stream.tag, None)
        self.events.append(pb.Progress(tag=stream.tag + stream.index, finished=finished_pb(req)))

    def flush(self) -> None:
        self.ready.set()

    def take(self) -> pb.ProgressBatch | None:
        seen = self.seen
        states = None
        for rt in self.runtimes:
            if seen.get(rt.core.name) != rt.queue_version:
                seen[rt.core.name] = rt.queue_version
                (states := states or []).append(rt.queue_state_pb())
        if not (self.events or self.totals or states):
            return None
        totals = self.totals
        batch = pb.ProgressBatch(events=self.events, token_tags=totals.keys(),
                                 token_totals=totals.values(), queue_states=states)
        self.events, self.totals = [], {}
        return batch


class EngineService(engine_pb2_grpc.EngineServicer):
    def __init__(self, runtimes: list[ModelRuntime], control_token: str | None = None,
                 metrics: EngineMetrics | None = None) -> None:
        self.runtimes = {rt.core.name: rt for rt in runtimes}
        self.adapters: dict[str, tuple[ModelRuntime, LoraAdapter]] = {}  # LoRA name -> base
        self.metrics = metrics
        self.sessions: set[SessionSink] = set()
        for rt in runtimes:
            rt.on_queue_change = self._queue_changed
        self.accepting = True
        self.on_capacity_change: Callable[[], None] | None = None  # after every SetCapacity
        self.replica_faults: ReplicaFaults | None = None  # set by the server once started
        # SetCapacity requires metadata `authorization: Bearer <token>` when set.
        self._control_token = control_token.encode() if control_token else None

    def _runtime(self, model: str) -> ModelRuntime | None:
        """The base model `model` names: itself, or the base of the LoRA adapter so named."""
        if not model and len(self.runtimes) == 1:
            return next(iter(self.runtimes.values()))
        rt = self.runtimes.get(model)
        if rt is None and model in self.adapters:
            return self.adapters[model][0]
        return rt

    def _queue_changed(self) -> None:
        for sink in self.sessions:
            sink.flush()  # the writer takes the new state with whatever else is due

    def _unknown_model(self, model: str) -> str:
        return f"model {model!r} is not served here (models: {', '.join(self.runtimes)})"

    def _admit(self, rt: ModelRuntime, request: pb.SubmitRequest, sink, tag) -> Request:
        """The funnel: check and reserve synchronously. Raises QueueSaturated or
        SubmitError; counts refusals."""
        entry = self.adapters.get(request.model) if self.adapters else None
        try:
            req = rt.pacer.submit(request.prompt_tokens, request.max_tokens, sink, tag,
                                  priority=request.priority, token_ids=request.prompt_token_ids,
                                  n=request.n or 1, lora=entry[1] if entry else None)
            req.eos = request.stop_at_end  # ends as "stop" (metrics), not "length"
        except QueueSaturated:
            rt.metrics.on_rejected("QUEUE_SATURATED")
            raise
        except SubmitError:
            rt.metrics.on_rejected("INVALID_REQUEST")
            raise
        rt.check_queue()
        return req

    async def close_sessions(self, timeout: float = 1.0) -> None:
        """End every Session call cleanly (after what is buffered has been sent)."""
        sinks = list(self.sessions)
        for sink in sinks:
            sink.closing = True
            sink.flush()
        if sinks:
            await asyncio.wait([asyncio.ensure_future(s.ended.wait()) for s in sinks],
                               timeout=timeout)

    # ---- Submit: one request per call ---------------------------------------------------
    async def Submit(self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext):
        if not self.accepting:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "engine is shutting down")
        rt = self._runtime(request.model)
        if rt is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, self._unknown_model(request.model))
        sink = SubmitSink()
        try:
            req = self._admit(rt, request, sink, None)
        except QueueSaturated as exc:
            status = saturated_status(exc)
            log.debug("refused %s: %s", request.request_id or "request", exc)  # counted in metrics
            await context.abort(status.code, status.details, status.trailing_metadata)
        except SubmitError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            await context.write(pb.SubmitEvent(
                admitted=pb.Admitted(engine_request_id=req.id, waiting=rt.core.num_waiting)))
            while True:
                event, last = await sink.queue.get()
                await context.write(event)
                if last:
                    return
        finally:
            rt.pacer.cancel(req)  # a no-op once finished; frees the request on disconnect

    # ---- Session: many requests over one stream -----------------------------------------
    async def Session(self, request_iterator, context: grpc.aio.ServicerContext):
        runtimes = list(self.runtimes.values())
        sink = SessionSink(runtimes)
        loop = asyncio.get_running_loop()
        sink.flush()  # the first batch announces every model's queue state
        self.sessions.add(sink)
        reader = asyncio.create_task(self._read_session(request_iterator, sink))
        try:
            while True:
                await sink.ready.wait()
                sink.ready.clear()
                batch = sink.take()
                if batch is not None:
                    started = loop.time()
                    await context.write(batch)
                    waited = loop.time() - started  # > 0: the gateway reads late (flow control)
                    if waited > WRITE_LATE:
                        for rt in runtimes:
                            rt.pacer.relay_late(waited)
                if sink.closing:
                    return  # the engine is stopping: end the call with OK
                if reader.done() and (reader.exception() is not None or
                                      not sink.open and not sink.events and not sink.totals):
                    reader.result()  # a reader failure (a malformed action) ends the call now
                    return
        finally:
            self.sessions.discard(sink)
            sink.ended.set()
            reader.cancel()
            for rt, req in list(sink.open.values()):
                rt.pacer.cancel(req)
            sink.open.clear()

    async def _read_session(self, request_iterator, sink: SessionSink) -> None:
        try:
            async for message in request_iterator:
                for action in message.actions:
                    kind = action.WhichOneof("action")
                    if kind == "open":
                        self._session_open(action.open, sink)
                    elif kind == "cancel":
                        self._session_cancel(action.cancel.tag, sink)
                    elif kind == "refused":
                        self._session_refused(action.refused)
                sink.flush()
        finally:
            sink.flush()  # let the writer notice the end of input

    def _session_open(self, action: pb.Open, sink: SessionSink) -> None:
        tag, request = action.tag, action.request
        if not self.accepting:
            rejected = rejected_pb(grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN", "engine is shutting down")
        elif (rt := self._runtime(request.model)) is None:
            rejected = rejected_pb(grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND",
                                   self._unknown_model(request.model))
        elif tag in sink.open:
            rejected = rejected_pb(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST",
                                   f"tag {tag} is already open in this session")
        elif tag + max(request.n, 1) - 1 > _U64:
            rejected = rejected_pb(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST",
                                   f"tags {tag} .. {tag} + n - 1 (n = {request.n}) exceed 2^64 - 1")
        else:
            try:
                req = self._admit(rt, request, sink, tag)
            except QueueSaturated as exc:
                rejected = rejected_pb(grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_SATURATED",
                                       str(exc), saturated_metadata(exc))
            except SubmitError as exc:
                rejected = rejected_pb(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", str(exc))
            else:
                sink.open[tag] = (rt, req)
                sink.events.append(pb.Progress(tag=tag, admitted=pb.Admitted(
                    engine_request_id=req.id, waiting=rt.core.num_waiting)))
                return
        sink.events.append(pb.Progress(tag=tag, rejected=rejected))

    def _session_cancel(self, tag: int, sink: SessionSink) -> None:
        entry = sink.open.get(tag)
        if entry is None:
            return  # unknown or already finished
        rt, req = entry
        if not rt.pacer.cancel(req):
            return  # finishing in the step in flight: its one Finished is on the way
        del sink.open[tag]
        sink.events.append(pb.Progress(tag=tag, finished=finished_pb(req)))
        sink.seen.pop(rt.core.name, None)  # the client forgot the queue state: say it again

    def _session_refused(self, refused: pb.Refused) -> None:
        rt = self.runtimes.get(refused.model)
        if rt is not None and refused.count:
            rt.metrics.on_rejected("QUEUE_SATURATED", refused.count)

    # ---- capacity and models ------------------------------------------------------------
    def _capacity(self, runtimes) -> pb.CapacityResponse:
        return pb.CapacityResponse(models=[
            pb.ModelCapacity(model=rt.core.name, max_waiting=rt.core.max_waiting,
                             max_num_seqs=rt.core.max_num_seqs, waiting=rt.core.num_waiting,
                             running=rt.core.num_running)
            for rt in runtimes])

    def _select(self, model: str) -> list[ModelRuntime] | None:
        if not model:
            return list(self.runtimes.values())
        rt = self.runtimes.get(model)
        return [rt] if rt else None

    async def GetCapacity(self, request: pb.GetCapacityRequest, context):
        runtimes = self._select(request.model)
        if runtimes is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, self._unknown_model(request.model))
        return self._capacity(runtimes)

    def _control_allowed(self, context) -> bool:
        """Constant-time check of `authorization: Bearer <control token>`, when one is set."""
        if self._control_token is None:
            return True
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                return bearer_ok(value, self._control_token)
        return False

    async def SetCapacity(self, request: pb.SetCapacityRequest, context):
        if not self._control_allowed(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "SetCapacity needs metadata `authorization: Bearer <control token>`")
        seqs = request.max_num_seqs if request.HasField("max_num_seqs") else None
        waiting = request.max_waiting if request.HasField("max_waiting") else None
        if seqs is None and waiting is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "set at least one of max_num_seqs and max_waiting")
        model = request.model if request.HasField("model") else ""
        runtimes = self._select(model)
        if runtimes is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, self._unknown_model(model))
        try:
            for rt in runtimes:  # validate everything before changing anything
                rt.core.check_capacity(seqs, waiting)
        except CapacityError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        for rt in runtimes:
            rt.core.set_capacity(seqs, waiting)
            rt.pacer.poke()
            rt.check_queue()
            log.info("capacity of %s: max_num_seqs=%d max_waiting=%d",
                     rt.core.name, rt.core.max_num_seqs, rt.core.max_waiting)
        if self.on_capacity_change is not None:
            self.on_capacity_change()
        return self._capacity(runtimes)

    # ---- replica-level faults (engine.service.replica_faults) ----------------------------
    def _fault_state(self) -> pb.EngineFaultState:
        st = self.replica_faults.status()
        return pb.EngineFaultState(stalled_for_s=st.stalled_for_s, slow_factor=st.slow_factor,
                                   slow_for_s=st.slow_for_s)

    async def InjectFault(self, request: pb.InjectFaultRequest, context):
        if not self._control_allowed(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "InjectFault needs metadata `authorization: Bearer <control token>`")
        faults, kind, seconds = self.replica_faults, request.kind, request.seconds
        if faults is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine is not started")
        if not math.isfinite(seconds) or not 0 <= seconds <= MAX_FAULT_SECONDS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"seconds must be in [0, {MAX_FAULT_SECONDS:g}], got {seconds!r}")
        if kind == pb.ENGINE_FAULT_CRASH:
            faults.crash()
        elif kind == pb.ENGINE_FAULT_STALL:
            if seconds <= 0:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    "a stall needs seconds > 0")
            faults.stall(seconds)
        elif kind == pb.ENGINE_FAULT_SLOW:
            factor = request.factor
            if not (math.isfinite(factor) and 0 < factor <= MAX_SLOW_FACTOR):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"a slowdown needs factor in (0, {MAX_SLOW_FACTOR:g}], "
                                    f"got {factor!r}")
            faults.slow(factor, seconds)
        elif kind == pb.ENGINE_FAULT_CLEAR:
            faults.clear()
        else:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "kind must be ENGINE_FAULT_CRASH, _STALL, _SLOW or _CLEAR")
        return self._fault_state()

    async def GetFaultState(self, request: pb.GetFaultStateRequest, context):
        if self.replica_faults is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine is not started")
        return self._fault_state()

    async def GetMetrics(self, request: pb.GetMetricsRequest, context):
        """Rendered off the event loop: the pacer keeps its wake-ups meanwhile."""
        if self.metrics is None:
            return pb.MetricsText()
        text = await asyncio.get_running_loop().run_in_executor(
            None, self.metrics.render, list(request.models), list(request.engines))
        return pb.MetricsText(text=text)

    async def ListModels(self, request, context):
        def info(rt: ModelRuntime, name: str, parent: str = "", rank: int = 0) -> pb.ModelInfo:
            return pb.ModelInfo(name=name, hardware=rt.core.deployment.hardware.name,
                                tp=rt.core.deployment.tp, max_model_len=rt.core.max_model_len,
                                kv_blocks=rt.core.total_blocks, block_size=rt.core.block_size,
                                parent=parent, lora_rank=rank)

        models = [info(rt, rt.core.name) for rt in self.runtimes.values()]
        models += [info(rt, name, rt.core.name, adapter.rank)
                   for name, (rt, adapter) in self.adapters.items()]
        return pb.ListModelsResponse(models=models)

    # ---- LoRA adapters -------------------------------------------------------------------
    def load_adapter(self, name: str, path: str, base: str, rank: int) -> str:
        """Register an adapter (LoraError / KeyError for the caller to map)."""
        rt = self._runtime(base) if base or len(self.runtimes) == 1 else None
        if rt is None or (base and base not in self.runtimes):
            raise KeyError(base)
        loras = rt.core.loras
        if loras is None:
            raise LoraError(f"LoRA is not enabled for {rt.core.name} (start the engine with "
                            "--enable-lora or --lora-modules)")
        if name in self.runtimes or name in self.adapters:
            raise LoraError(f"The lora adapter '{name}' has already been loaded.")
        self.adapters[name] = (rt, loras.load(name, path, rank))
        log.info("LoRA adapter %s (rank %d, %s) loaded for %s", name, rank, path, rt.core.name)
        return f"Success: LoRA adapter '{name}' added successfully."

    async def LoadLoraAdapter(self, request: pb.LoadLoraAdapterRequest, context):
        if not self._control_allowed(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "LoadLoraAdapter needs metadata `authorization: Bearer <control token>`")
        try:
            rank = read_rank(request.lora_path)
            message = self.load_adapter(request.lora_name, request.lora_path,
                                        request.base_model_name, rank)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                self._unknown_model(request.base_model_name))
        except LoraError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.LoraAdapterResponse(message=message)

    async def UnloadLoraAdapter(self, request: pb.UnloadLoraAdapterRequest, context):
        if not self._control_allowed(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "UnloadLoraAdapter needs metadata `authorization: Bearer <control token>`")
        entry = self.adapters.pop(request.lora_name, None)
        if entry is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"The lora adapter '{request.lora_name}' cannot be found.")
        rt, adapter = entry
        rt.core.loras.unload(adapter.name)
        log.info("LoRA adapter %s unloaded", adapter.name)
        return pb.LoraAdapterResponse(
            message=f"Success: LoRA adapter '{request.lora_name}' removed successfully.")

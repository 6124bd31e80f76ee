"""The engine's gRPC service: the admission funnel, progress delivery and capacity control.

Knows the protobuf messages (inference_lab.v1) and gRPC status codes: this is the one
place where core objects turn into messages and errors into statuses. Does not know
timing (engine.pacer) or scheduling (engine.core).

Admission is decided by the pacer in the order of the arrivals' instants (engine.drivers
.pacer `arrive`): each is checked against max_waiting and queued in one synchronous step
of EngineCore.submit, at its modelled instant, once no earlier arrival can still come (the
Sessions' holds: engine.service.holds); so no burst can over- or under-admit, and a
refusal leaves before any message is written.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from inference_lab.common.auth import bearer_ok
from inference_lab.common.clock import same_clock
from inference_lab.engine.fleet.replicas import Fleet, ReplicaNotFound, ReplicaUnavailable
from inference_lab.engine.sim.kv import total_blocks
from inference_lab.engine.sim.capacity import require_change
from inference_lab.engine.sim.core import CapacityError, EngineCore, QueueSaturated, SubmitError
from inference_lab.engine.service.kv_events import ZmqEventPublisher
from inference_lab.engine.service.lora_modules import read_rank
from inference_lab.engine.sim.lora import LoraAdapter, LoraError
from inference_lab.engine.service.replica_faults import ReplicaFaults
from inference_lab.engine.service.metrics import EngineMetrics, ModelMetrics
from inference_lab.engine.service.metrics_feed import Watchers, watch, watch_interval
from inference_lab.engine.drivers.pacer import Arrival, Pacer, Stream
from inference_lab.engine.service.holds import Holds
from inference_lab.engine.sim.request import Request, Status
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc

log = logging.getLogger(__name__)

DOMAIN = "inference-lab"
MAX_FAULT_SECONDS = 86_400.0
MAX_SLOW_FACTOR = 1000.0
# A Session write that waits longer than this (wall s) means its reader (the gateway) is
# late (flow control); shorter waits count as none in the mean write wait.
WRITE_LATE = 0.0005
WAIT_WEIGHT = 1 / 8  # the mean write wait's weight of each new write
_U64 = 2**64 - 1
FINISH_REASON_PB = {
    Status.FINISHED_LENGTH: pb.FINISH_REASON_LENGTH,
    Status.FINISHED_CANCELLED: pb.FINISH_REASON_CANCELLED,
    Status.FINISHED_ABORTED: pb.FINISH_REASON_ABORTED,
}


class UnknownModel(LookupError):
    """A model this engine does not serve."""


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


_NOT_SATURATED = (False, 0, 0, "", 0.0, 0.0)


def queue_state(core: EngineCore, pacer: Pacer | None = None,
                since: float = 0.0) -> tuple[bool, int, int, str, float, float]:
    """(saturated, waiting, max_waiting, message, since, until) as a Session announces it:
    the numbers only matter (and are only set) while saturated. since / until (wall:
    time.monotonic()) are the span of arrival instants over which the queue is provably
    full: from `since` (the instant this stretch began; 0 = now) to the first instant its
    fullness can change (Pacer.full_until, which holds the core to it)."""
    full = core.saturation()
    if full is None:
        if pacer is not None:
            pacer.not_full()
        return _NOT_SATURATED
    if pacer is None:
        return True, full.waiting, full.max_waiting, str(full), 0.0, 0.0
    until = pacer.full_until()
    return (True, full.waiting, full.max_waiting, str(full),
            since or pacer.wall_of(pacer.position()), pacer.wall_of(until))


class ModelRuntime:
    """One replica of one served model: its core, the pacer driving it, its metrics, and
    the admission state last announced to Sessions (with a version that counts its
    changes). The fleet (engine.fleet) orders its lifecycle: start, drained, stop."""

    def __init__(self, core: EngineCore, metrics: ModelMetrics, update_rate: float = 0.0,
                 time_scale: float = 1.0, kv_events: ZmqEventPublisher | None = None,
                 coalesce_when_late: bool = True, replica: int = 0,
                 hold: Holds | None = None) -> None:
        self.core = core
        self.metrics = metrics
        self.kv_events = kv_events
        self.replica = replica
        self.key = (core.name, replica)
        self.queue_state = _NOT_SATURATED
        self.queue_version = 0
        self.on_queue_change: Callable[[], None] | None = None
        self._idle: asyncio.Event | None = None  # set once a drained replica holds nothing
        self._stopped = False
        self.adapters: dict[str, object] = {}  # LoRA name -> this core's LoraAdapter
        self.on_stopped: Callable[[], None] | None = None  # its series leave the metrics
        on_step = metrics.on_step if kv_events is None else self._on_step
        self.pacer = Pacer(core, on_step=on_step, on_lag=metrics.on_lag,
                           on_finished=metrics.on_finished, on_change=self.check_queue,
                           on_cadence=metrics.on_cadence, on_late=metrics.on_late, hold=hold,
                           update_rate=update_rate,
                           coalesce_when_late=coalesce_when_late, time_scale=time_scale)

    def _on_step(self, result) -> None:
        """A retired step: metrics, then the cache's events of the step as one batch."""
        self.metrics.on_step(result)
        core = self.core
        self.kv_events.publish(core.name, core.prefix_cache.take_events(), core.block_size)

    def check_queue(self) -> None:
        """Called wherever the queue or its bound may have moved (admissions, steps,
        cancels, capacity changes); announces a changed state to every Session."""
        state = queue_state(self.core, self.pacer, self.queue_state[4])
        if state != self.queue_state:
            self.queue_state = state
            self.queue_version += 1
            if self.on_queue_change is not None:
                self.on_queue_change()
        if self._idle is not None and not self.pacer.open_streams():
            self._idle.set()

    def queue_state_pb(self, span: bool = True) -> pb.QueueState:
        """The state announced; with `span` (a client on this machine's clock) the span
        of instants it may refuse on the engine's word."""
        saturated, waiting, max_waiting, message, since, until = self.queue_state
        state = pb.QueueState(model=self.core.name, saturated=saturated, waiting=waiting,
                              max_waiting=max_waiting, replica=self.replica, message=message)
        if saturated and span and until:
            state.since_monotonic_s = since
            state.until_monotonic_s = until
        return state

    # ---- lifecycle (engine.fleet.Fleet) --------------------------------------------------
    def start(self) -> None:
        self.pacer.start()

    def open_streams(self) -> int:
        return self.pacer.open_streams()

    async def drained(self) -> None:
        """Resolves once no request is left (the fleet admits nothing more to it)."""
        while self.pacer.open_streams():
            self._idle = asyncio.Event()
            await self._idle.wait()

    async def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            await self.pacer.stop()
            if self.on_stopped is not None:
                self.on_stopped()



# ---- core objects -> messages ------------------------------------------------------------
def finished_pb(req: Request) -> pb.Finished:
    def since_arrival(t: float) -> float:
        return t - req.arrival if t >= 0 else 0.0

    return pb.Finished(
        reason=FINISH_REASON_PB[req.status], prompt_tokens=req.prompt_len,
        completion_tokens=req.num_output, queue_time_s=since_arrival(req.first_scheduled),
        ttft_s=since_arrival(req.first_token), e2e_s=since_arrival(req.finish_time),
        preemptions=req.preemptions, cached_tokens=req.cached_tokens, index=req.index)


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

    def __init__(self, service: "EngineService") -> None:
        self.service = service
        self.seen: dict[tuple[str, int], int] = {}  # (model, replica) -> queue_version announced
        self.seen_changes = -1  # service.queue_changes as of the last look at every replica
        self.events: list[pb.Progress] = []
        self.totals: dict[int, int] = {}  # tag -> tokens so far, latest wins
        self.open: dict[int, tuple[ModelRuntime, Request]] = {}
        self.pending: dict[int, Arrival | None] = {}  # tag -> an arrival not judged yet
        self.hold: float | None = None  # its client's hold (engine.service.holds)
        self.ready = asyncio.Event()
        self.closing = False  # the engine is stopping: end the call once flushed
        self.ended = asyncio.Event()
        self.same_clock = False  # the client reads this machine's clock: its stamps count
        self.finished_on: set[int] = set()  # replicas (engine labels) of the Finished queued:
        # the batch carries the metrics version, and their copies are pushed right behind
        self.lane = False  # over the Session lane: the batch carries those copies itself
        # How late its reader (the gateway) is: as it reports (SessionActions.relay_lag_s),
        # and the mean time a write waited for it (gRPC flow control).
        self.reported_lag = 0.0
        self.write_wait = 0.0
        self.input_ended = False  # the client sent its last message (or its input broke)
        self.failure: Exception | None = None  # why its input broke (a malformed message)

    def end_input(self, failure: Exception | None = None) -> None:
        """The client's messages ended (cleanly, or with `failure`): the writer decides."""
        self.input_ended = True
        if failure is not None and self.failure is None:
            self.failure = failure
        self.ready.set()

    def relay_lag(self) -> float:
        return max(self.reported_lag, self.write_wait)

    def on_tokens(self, stream: Stream, total: int) -> None:
        # Sequence i of a request with n > 1 reports under tag + i.
        self.totals[stream.tag + stream.index] = total  # while the writer is blocked, updates merge

    def on_finished(self, stream: Stream, req: Request) -> None:
        entry = self.open.pop(stream.tag, None) if req.all_finished else self.open.get(stream.tag)
        if entry is not None:
            self.finished_on.add(entry[0].metrics.engine)
        self.events.append(pb.Progress(tag=stream.tag + stream.index, finished=finished_pb(req)))

    def flush(self) -> None:
        self.ready.set()

    def take(self) -> pb.ProgressBatch | None:
        states = None
        changes = self.service.queue_changes
        if changes != self.seen_changes:  # some replica's queue state moved
            self.seen_changes = changes
            seen = self.seen
            for rt in self.service.fleet.runtimes():
                if seen.get(rt.key) != rt.queue_version:
                    seen[rt.key] = rt.queue_version
                    (states := states or []).append(rt.queue_state_pb(self.same_clock))
        if not (self.events or self.totals or states):
            return None
        totals = self.totals
        batch = pb.ProgressBatch(events=self.events, token_tags=totals.keys(),
                                 token_totals=totals.values(), queue_states=states,
                                 sent_monotonic_s=time.monotonic() if self.same_clock else None)
        self.events, self.totals = [], {}
        if self.finished_on:  # (their metrics were counted when they finished, before this)
            service = self.service
            if service.metrics is not None:
                batch.metrics_seq = service.metrics.versions.n
                # The copies: on the lane in this batch (its batches overtake the watch's
                # gRPC stream), else right behind it on every watch.
                if self.lane:
                    service.watchers.finished_on(
                        self.finished_on, batch.metrics,
                        share=any(not sink.lane for sink in service.sessions))
                else:
                    service.watchers.finished_on(self.finished_on, pb.MetricsPush())
            self.finished_on = set()
        return batch


class EngineService(engine_pb2_grpc.EngineServicer):
    """The RPCs over a fleet of ModelRuntimes (one per model and replica index)."""

    def __init__(self, fleet: Fleet, metrics: EngineMetrics | None = None,
                 control_token: str | None = None, holds: Holds | None = None) -> None:
        self.fleet = fleet
        self.holds = holds if holds is not None else Holds()  # what the pacers may decide
        self.holds.on_moved = self._holds_moved
        # LoRA name -> (base model, path, rank); every replica of the base loads it
        self.adapters: dict[str, tuple[str, str, int]] = {}
        self.metrics = metrics
        self.watchers = Watchers(metrics)  # the open WatchMetrics calls
        self.sessions: set[SessionSink] = set()
        self.queue_changes = 0  # counts queue-state changes of any replica, and fleet changes
        for rt in fleet.runtimes():
            rt.on_queue_change = self._queue_changed
        self.accepting = True
        self.relay_lag = 0.0  # the latest Session reader's lateness told to the pacers
        self.on_capacity_change: Callable[[], None] | None = None  # after every SetCapacity
        self.replica_faults: ReplicaFaults | None = None  # set by the server once started
        self.lane = None  # engine.service.lane.SessionLane once listening (None: off)
        # SetCapacity and SetReplicas require metadata `authorization: Bearer <token>` when set.
        self._control_token = control_token.encode() if control_token else None

    def fleet_changed(self) -> None:
        """The replica set changed: new replicas report to Sessions too."""
        for rt in self.fleet.runtimes():
            rt.on_queue_change = self._queue_changed
        self._queue_changed()
        if self.metrics is not None:
            self.metrics.touch()  # replicas' series came or went

    def _model(self, model: str) -> str | None:
        """The base model `model` names: itself, or the base of the LoRA adapter so named."""
        models = self.fleet.deployments
        if not model and len(models) == 1:
            return next(iter(models))
        if model not in models and model in self.adapters:
            return self.adapters[model][0]
        return model if model in models else None

    def _runtime(self, model: str, replica: int = 0) -> ModelRuntime:
        """The replica that admits this request now; raises one of REFUSED."""
        name = self._model(model)
        if name is None:
            raise UnknownModel(self._unknown_model(model))
        return self.fleet.lookup(name, replica).runtime  # ReplicaNotFound, ReplicaUnavailable

    def _holds_moved(self) -> None:
        """The senders' hold moved on: the pacers may decide further."""
        for rt in self.fleet.runtimes():
            rt.pacer.poke()

    def _relay_changed(self) -> None:
        """A Session reader's lateness moved: the pacers' cadence acts on the worst."""
        lag = max((sink.relay_lag() for sink in self.sessions), default=0.0)
        if lag != self.relay_lag:
            self.relay_lag = lag
            for rt in self.fleet.runtimes():
                rt.pacer.relay_lateness(lag)
                rt.metrics.on_relay(lag)

    def _queue_changed(self) -> None:
        self.queue_changes += 1
        for sink in self.sessions:
            sink.flush()  # the writer takes the new state with whatever else is due

    def _unknown_model(self, model: str) -> str:
        return f"model {model!r} is not served here (models: {', '.join(self.fleet.deployments)})"

    def _admit(self, request: pb.SubmitRequest, sink, tag, same_clock: bool,
               then: Callable[[ModelRuntime, Request | None, Exception | None], None],
               decide: bool = True) -> tuple[ModelRuntime, Arrival]:
        """The funnel: the request goes to its replica's pacer, which judges it at its
        instant (at once, or once the senders' hold lets it): `then(rt, req, None)` with
        the queued request, `then(rt, None, exc)` with one of REFUSED (counted when it is a
        served replica's queue or rules), or `then(rt, None, None)` when the replica
        stopped first. Raises one of REFUSED for what is refused before any queue (an
        unknown model or replica, shutdown). The arrival is booked at the request's stamp
        when its sender reads this machine's clock (`same_clock`), else now. Not called
        back once the arrival is withdrawn: an admitted one is cancelled at once. With
        `decide` False nothing is judged until the replica's pacer is told to `decide`
        (a Session message's arrivals are all handed over first)."""
        if not self.accepting:
            raise ShuttingDown()
        rt = self._runtime(request.model, request.replica)
        lora = rt.adapters.get(request.model) if rt.adapters else None
        max_tokens = request.max_tokens if request.HasField("max_tokens") else None
        arrived = (request.arrival_monotonic_s
                   if same_clock and request.HasField("arrival_monotonic_s") else None)

        def decided(arrival: Arrival, req: Request | None, exc: Exception | None) -> None:
            if req is None:
                if exc is not None:
                    rt.metrics.on_rejected(REFUSALS[type(exc)][1])
            else:
                if request.stop_at_end:
                    req.eos = True  # ends as "stop" (metrics), not "length"
                rt.check_queue()
                if self.metrics is not None:
                    self.metrics.touch()  # its waiting gauge moved (no update point saw it)
                if arrival.withdrawn:  # its sender let go before it was judged
                    rt.pacer.cancel(req)
                    return
            if not arrival.withdrawn:
                then(rt, req, exc)

        return rt, rt.pacer.arrive(request.prompt_tokens, max_tokens, sink, tag,
                                   decided=decided, priority=request.priority,
                                   token_ids=request.prompt_token_ids, n=request.n or 1,
                                   lora=lora, arrived=arrived, decide=decide)

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
        sink = SubmitSink()
        decision: asyncio.Future = asyncio.get_running_loop().create_future()

        def then(rt: ModelRuntime, req: Request | None, exc: Exception | None) -> None:
            if not decision.done():
                decision.set_result((rt, req, exc))

        arrival = None
        try:
            try:
                _, arrival = self._admit(request, sink, None,
                                         request.HasField("arrival_monotonic_s")
                                         and same_clock(context.invocation_metadata()), then)
                rt, req, exc = await decision
            except REFUSED as exc:
                rt, req = None, None
                refused = exc
            else:
                refused = exc if req is None else None
        finally:
            if arrival is not None and not decision.done():
                arrival.withdrawn = True  # the caller went before it was judged
        if req is None:
            refused = refused or ShuttingDown()
            log.debug("refused %s: %s", request.request_id or "request", refused)  # counted
            await abort(context, refused)
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
    # Two transports share every line below: the gRPC stream (Session) and the same-host
    # lane (engine.service.lane), which calls `serve_session` and `session_actions` itself.
    async def Session(self, request_iterator, context: grpc.aio.ServicerContext):
        sink = SessionSink(self)
        sink.same_clock = same_clock(context.invocation_metadata())  # its stamps are believed
        reader = asyncio.create_task(self._read_session(request_iterator, sink))
        try:
            await self.serve_session(sink, context.write)
        finally:
            reader.cancel()

    async def serve_session(self, sink: SessionSink,
                            write: Callable[[pb.ProgressBatch], Awaitable[None]]) -> None:
        """The writer of one Session: each batch due goes out through `write` (which
        returns once the transport took it: its wait is how late the reader is). Returns
        when the engine closes the Session or its input ended with nothing left to send;
        raises the input's failure (a malformed action). Every request still open is
        cancelled on the way out."""
        clock = time.monotonic  # (not loop.time(): uvloop's counts whole ms)
        sink.flush()  # the first batch announces every model's queue state
        self.sessions.add(sink)
        try:
            while True:
                await sink.ready.wait()
                sink.ready.clear()
                batch = sink.take()
                if batch is not None:
                    started = clock()
                    await write(batch)
                    waited = clock() - started  # > 0: the gateway reads late (flow control)
                    wait = sink.write_wait
                    if waited > WRITE_LATE or wait:
                        wait += ((waited if waited > WRITE_LATE else 0.0) - wait) * WAIT_WEIGHT
                        sink.write_wait = wait if wait > 1e-5 else 0.0
                        self._relay_changed()
                if sink.closing:
                    return  # the engine is stopping: end the call with OK
                if sink.input_ended and (sink.failure is not None or
                                         not sink.open and not sink.events and not sink.totals):
                    if sink.failure is not None:
                        raise sink.failure  # a malformed action ends the call now
                    return
        finally:
            self.sessions.discard(sink)
            if sink.relay_lag():
                self._relay_changed()  # its lateness leaves with it
            self.holds.set(sink, None)  # and its hold
            sink.ended.set()
            for arrival in sink.pending.values():
                if arrival is not None:
                    arrival.withdrawn = True  # admitted later: cancelled at once
            sink.pending.clear()
            for rt, req in list(sink.open.values()):
                rt.pacer.cancel(req)
            sink.open.clear()

    async def SessionLane(self, request: pb.SessionLaneRequest, context):
        """Where the same-host Session lane listens (engine.service.lane)."""
        if self.lane is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "the session lane is off (engine --session-lane off)")
        return self.lane.info()

    async def _read_session(self, request_iterator, sink: SessionSink) -> None:
        failure = None
        try:
            async for message in request_iterator:
                self.session_actions(message, sink)
        except Exception as exc:  # (a malformed action: the writer ends the call with it)
            failure = exc
        finally:
            sink.end_input(failure)  # let the writer notice the end of input

    def session_actions(self, message: pb.SessionActions, sink: SessionSink) -> None:
        """One message of a Session's client, applied in order (synchronously: admission
        has no await between check and reservation). Its Opens are all handed to their
        pacers before any is judged, and its hold applies after them: the hold counts
        them as sent, and the pacers judge in the order of the arrivals' instants."""
        touched: set[Pacer] = set()
        try:
            if message.HasField("relay_lag_s"):
                lag = message.relay_lag_s
                sink.reported_lag = min(lag, 1.0) if lag > 0 else 0.0  # (NaN: 0)
                self._relay_changed()
            for action in message.actions:
                kind = action.WhichOneof("action")
                if kind == "open":
                    self._session_open(action.open, sink, touched)
                elif kind == "cancel":
                    self._session_cancel(action.cancel.tag, sink)
                elif kind == "refused":
                    self._session_refused(action.refused)
            if message.HasField("hold_s") and sink.same_clock:
                self.holds.set(sink, message.hold_s)
        finally:
            for pacer in touched:
                pacer.decide()
            sink.flush()

    def _session_open(self, action: pb.Open, sink: SessionSink, touched: set[Pacer]) -> None:
        tag, request = action.tag, action.request

        def then(rt: ModelRuntime, req: Request | None, exc: Exception | None) -> None:
            sink.pending.pop(tag, None)
            if req is None:
                sink.events.append(pb.Progress(tag=tag, rejected=rejected_pb(exc or ShuttingDown())))
            else:
                sink.open[tag] = (rt, req)
                sink.events.append(pb.Progress(tag=tag, admitted=pb.Admitted(
                    engine_request_id=req.id, waiting=rt.core.num_waiting)))
            sink.flush()

        try:
            if tag in sink.open or tag in sink.pending:
                raise SubmitError(f"tag {tag} is already open in this session")
            if tag + max(request.n, 1) - 1 > _U64:
                raise SubmitError(f"tags {tag} .. {tag} + n - 1 (n = {request.n}) exceed 2^64 - 1")
            sink.pending[tag] = None
            rt, arrival = self._admit(request, sink, tag, sink.same_clock, then, decide=False)
            touched.add(rt.pacer)
        except REFUSED as exc:
            sink.pending.pop(tag, None)
            sink.events.append(pb.Progress(tag=tag, rejected=rejected_pb(exc)))
            return
        if tag in sink.pending:  # not judged yet
            sink.pending[tag] = arrival

    def _session_cancel(self, tag: int, sink: SessionSink) -> None:
        if tag in sink.pending:  # not judged yet: it is, as it arrived, then cancelled
            arrival = sink.pending.pop(tag)
            if arrival is not None:
                arrival.withdrawn = True
            sink.events.append(pb.Progress(tag=tag, finished=pb.Finished(
                reason=pb.FINISH_REASON_CANCELLED)))
            return
        entry = sink.open.get(tag)
        if entry is None:
            return  # unknown or already finished
        rt, req = entry
        if not rt.pacer.cancel(req):
            return  # finishing in the step in flight: its one Finished is on the way
        del sink.open[tag]
        sink.events.append(pb.Progress(tag=tag, finished=finished_pb(req)))
        sink.seen.pop(rt.key, None)  # the client forgot the queue state: say it again
        sink.seen_changes = -1

    def _session_refused(self, refused: pb.Refused) -> None:
        replica = self.fleet.replicas.get(refused.model, {}).get(refused.replica)
        if replica is not None and refused.count:
            replica.runtime.metrics.on_rejected(REFUSALS[QueueSaturated][1], refused.count)

    # ---- capacity and models ------------------------------------------------------------
    def _capacity(self, replicas) -> list[pb.ModelCapacity]:
        now = self.fleet.now()
        rows = []
        for r in replicas:
            core = r.runtime.core
            rows.append(pb.ModelCapacity(
                model=core.name, max_waiting=core.max_waiting, max_num_seqs=core.max_num_seqs,
                waiting=core.num_waiting, running=core.num_running, replica=r.index,
                starting=r.ready_in(now) > 0, draining=r.draining, ready_in_s=r.ready_in(now)))
        return rows

    def _select(self, model: str, replica: int | None) -> list:
        """The replicas a capacity call acts on (UnknownModel, ReplicaNotFound for none)."""
        if model and model not in self.fleet.deployments:
            raise UnknownModel(self._unknown_model(model))
        return self.fleet.select(model, replica)

    async def GetCapacity(self, request: pb.GetCapacityRequest, context):
        replica = request.replica if request.HasField("replica") else None
        try:
            return pb.CapacityResponse(models=self._capacity(self._select(request.model, replica)))
        except REFUSED as exc:
            await abort(context, exc)

    def _check_control(self, context, call: str = "SetCapacity") -> None:
        """Constant-time check of `authorization: Bearer <control token>`, when one is set."""
        if self._control_token is None:
            return
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and bearer_ok(value, self._control_token):
                return
        raise Unauthenticated(f"{call} needs metadata `authorization: Bearer <control token>`")

    async def SetCapacity(self, request: pb.SetCapacityRequest, context):
        try:
            return self._set_capacity(request, context)
        except REFUSED as exc:
            await abort(context, exc)

    def _set_capacity(self, request: pb.SetCapacityRequest, context) -> pb.SetCapacityResponse:
        self._check_control(context)
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
                                      queue_states=[rt.queue_state_pb() for rt in runtimes])

    async def SetReplicas(self, request: pb.SetReplicasRequest, context):
        try:
            self._check_control(context, "SetReplicas")
            if not self.accepting:
                raise ShuttingDown()
            if request.model and request.model not in self.fleet.deployments:
                raise UnknownModel(self._unknown_model(request.model))
        except REFUSED as exc:
            await abort(context, exc)
        try:
            self.fleet.check_count(request.replicas)
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
        try:
            self._check_control(context, "InjectFault")
        except Unauthenticated as exc:
            await abort(context, exc)
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

    async def GetMetrics(self, request: pb.GetMetricsRequest, context):
        """With engines (replica indices), theirs alone (a gateway's replica port, scraped
        every 50 ms by an endpoint picker): rendered on the loop (a few hundred us: a
        thread would wait for the GIL longer). All of them (a gateway in front of one
        replica, or no replica filter): off the loop,
        so the pacer keeps its wake-ups. NOT_FOUND when no model has any of the engines."""
        if self.metrics is None:
            return pb.MetricsText()
        models, engines = list(request.models), list(request.engines)
        if engines:
            text = self.metrics.render(models, engines)
        else:
            text = await asyncio.get_running_loop().run_in_executor(
                None, self.metrics.render, models, engines)
        if not text and request.engines and not self.metrics.has_engines(request.engines):
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"no model has replica {', '.join(map(str, request.engines))}")
        return pb.MetricsText(text=text)

    async def WatchMetrics(self, request: pb.WatchMetricsRequest, context):
        """Each replica's exposition as it changes (engine.service.metrics_feed)."""
        if self.metrics is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this engine keeps no metrics")
        interval = watch_interval(request.interval_s)
        if interval is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"interval_s must be 0 (the default) or a number of seconds "
                                f">= 0.005, got {request.interval_s!r}")
        async for push in watch(self.metrics, self.watchers, interval):
            yield push

    def _max_request_tokens(self, deployment) -> int:
        """The largest request the model takes: every replica of a model has the same rules,
        so any replica's core answers (a model with none left: a core built to ask)."""
        replicas = self.fleet.replicas.get(deployment.name)
        core = next(iter(replicas.values())).runtime.core if replicas else EngineCore(deployment)
        return core.max_request_tokens

    async def ListModels(self, request, context):
        def info(d, name: str, parent: str = "", rank: int = 0) -> pb.ModelInfo:
            return pb.ModelInfo(name=name, hardware=d.hardware.name, tp=d.tp,
                                max_model_len=d.scheduler.max_model_len or d.model.max_seq_len,
                                kv_blocks=total_blocks(d), block_size=d.scheduler.block_size,
                                parent=parent, lora_rank=rank,
                                max_request_tokens=self._max_request_tokens(d))

        deployments = self.fleet.deployments
        models = [info(d, d.name) for d in deployments.values()]
        models += [info(deployments[base], name, base, rank)
                   for name, (base, _, rank) in self.adapters.items()]
        return pb.ListModelsResponse(models=models)

    # ---- LoRA adapters -------------------------------------------------------------------
    def load_adapter(self, name: str, path: str, base: str, rank: int) -> str:
        """Register an adapter on every replica of its base (LoraError / KeyError for the
        caller to map); replicas added later load it too (`adapt`)."""
        deployments = self.fleet.deployments
        base = base or (next(iter(deployments)) if len(deployments) == 1 else "")
        if base not in deployments:
            raise KeyError(base)
        replicas = self.fleet.select(base, None)
        if any(r.runtime.core.loras is None for r in replicas):
            raise LoraError(f"LoRA is not enabled for {base} (start the engine with "
                            "--enable-lora or --lora-modules)")
        if name in deployments or name in self.adapters:
            raise LoraError(f"The lora adapter '{name}' has already been loaded.")
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
            self._check_control(context, "LoadLoraAdapter")
        except Unauthenticated as exc:
            await abort(context, exc)
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
        try:
            self._check_control(context, "UnloadLoraAdapter")
        except Unauthenticated as exc:
            await abort(context, exc)
        entry = self.adapters.pop(request.lora_name, None)
        if entry is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"The lora adapter '{request.lora_name}' cannot be found.")
        for r in self.fleet.select(entry[0], None):
            if r.runtime.adapters.pop(request.lora_name, None) is not None:
                r.runtime.core.loras.unload(request.lora_name)
        log.info("LoRA adapter %s unloaded", request.lora_name)
        return pb.LoraAdapterResponse(
            message=f"Success: LoRA adapter '{request.lora_name}' removed successfully.")

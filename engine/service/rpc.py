"""The engine's gRPC service: the admission funnel, progress delivery and metrics.

Knows the protobuf messages (inference_lab.v1) and gRPC status codes of Submit, the
Session and the metrics calls. Does not know timing (engine.drivers.pacer) or scheduling
(engine.sim.core). Beside it, one module per job: the refusal table
(engine.service.refusals), core objects as messages (engine.service.messages), a
Session's batches and their writer (engine.service.session), the control calls
(engine.service.control, mixed in), sleep mode (engine.service.sleep, mixed in), vLLM's dev-mode pause and prefix-cache reset (engine.service.dev, mixed in), vLLM's own
VllmEngine service over the same funnel (engine.service.vllm_grpc, `admit_call`); each replica's runtime is the fleet's
(engine.fleet.runtime).

Admission is decided by the pacer in the order of the arrivals' instants (engine.drivers
.pacer `arrive`): each is checked against max_waiting and queued in one synchronous step
of EngineCore.submit, at its modelled instant, once no earlier arrival can still come (the
Sessions' holds: engine.service.holds); so no burst can over- or under-admit, and a
refusal leaves before any message is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from inference_lab.common.clock import same_clock
from inference_lab.engine.drivers.arrivals import Arrival
from inference_lab.engine.drivers.pacer import Pacer, Stream
from inference_lab.engine.fleet import handoff
from inference_lab.engine.fleet.replicas import Fleet, ReplicaUnavailable
from inference_lab.engine.fleet.runtime import ModelRuntime
from inference_lab.engine.service.control import ControlRpcs
from inference_lab.engine.service.holds import Holds
from inference_lab.engine.service.messages import finished_pb, offload_caps
from inference_lab.engine.metrics.exposition import MetricsRegistry
from inference_lab.engine.service.metrics_feed import Watchers, watch, watch_interval
from inference_lab.engine.service.refusals import (REFUSALS, REFUSED, ShuttingDown,
                                                   UnknownModel, abort, rejected_pb)
from inference_lab.engine.service.dev import DevRpcs
from inference_lab.engine.service.session import SessionSink
from inference_lab.engine.service.sleep import SleepRpcs
from inference_lab.engine.sim.core import QueueSaturated, SubmitError
from inference_lab.engine.sim.kv_transfer import NONE, PRODUCER, KvTransfer, prompt_digest
from inference_lab.engine.sim.reasoning import reasoning_tokens
from inference_lab.engine.sim.request import Request
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc

log = logging.getLogger(__name__)

_U64 = 2**64 - 1


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


class EngineService(ControlRpcs, SleepRpcs, DevRpcs, engine_pb2_grpc.EngineServicer):
    """The RPCs over a fleet of ModelRuntimes (one per model and replica index): the
    admission funnel, Submit, the Session and metrics here, the control calls mixed in
    (ControlRpcs)."""

    def __init__(self, fleet: Fleet, metrics: MetricsRegistry | None = None,
                 holds: Holds | None = None) -> None:
        ControlRpcs.__init__(self)
        self.fleet = fleet
        self.holds = holds if holds is not None else Holds()  # what the pacers may decide
        self.holds.on_moved = self._holds_moved
        self.metrics = metrics
        self.watchers = Watchers(metrics)  # the open WatchMetrics calls
        self.sessions: set[SessionSink] = set()
        self.queue_changes = 0  # counts queue-state changes of any replica, and fleet changes
        for rt in fleet.runtimes():
            rt.on_queue_change = self._queue_changed
        self.accepting = True
        self.relay_lag = 0.0  # the latest Session reader's lateness told to the pacers
        self.lane = None  # engine.service.lane.SessionLane once listening (None: off)
        # a reasoning model's replies open with reasoning when the request says nothing
        # (its preset's share; --reasoning), else only when the request asks for it
        self.reasoning = False

    def fleet_changed(self) -> None:
        """The replica set changed: new replicas report to Sessions too."""
        for rt in self.fleet.runtimes():
            rt.on_queue_change = self._queue_changed
        self._queue_changed()
        if self.metrics is not None:
            self.metrics.touch()  # replicas' series came or went

    def base_model(self, model: str) -> str | None:
        """The base model `model` names: itself, or the base of the LoRA adapter so named."""
        models = self.fleet.deployments
        if not model and len(models) == 1:
            return next(iter(models))
        if model not in models and model in self.adapters:
            return self.adapters[model][0]
        return model if model in models else None

    def _runtime(self, model: str, replica: int = 0) -> ModelRuntime:
        """The replica that admits this request now; raises one of REFUSED."""
        name = self.base_model(model)
        if name is None:
            raise UnknownModel(model, self.fleet.deployments)
        rt = self.fleet.lookup(name, replica).runtime  # ReplicaNotFound, ReplicaUnavailable
        if rt.sleep_level:
            raise ReplicaUnavailable(
                "REPLICA_SLEEPING", f"replica {rt.replica} of {name!r} is sleeping (level "
                f"{rt.sleep_level}): POST /wake_up first")
        return rt

    def _holds_moved(self) -> None:
        """The senders' hold moved on: the pacers may decide further."""
        for rt in self.fleet.runtimes():
            rt.pacer.poke()

    def relay_changed(self) -> None:
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
        kv, pull, wanted = self._connector(rt, request)

        def decided(arrival: Arrival, req: Request | None, exc: Exception | None) -> None:
            if pull is not None:  # the producer frees its blocks when the pull has ended
                pull.release_at(rt.pacer.wall_of(req.ready) if req is not None else None)
            elif wanted and req is not None:
                rt.core.transfers.recomputed += 1  # its KV is gone: prefilled here
            if req is None:
                if exc is not None:
                    rt.metrics.on_rejected(REFUSALS[type(exc)][1])
            else:
                if request.stop_at_end:
                    req.eos = True  # ends as "stop" (metrics), not "length"
                reasoning = rt.core.deployment.model.reasoning
                if reasoning is not None and not req.pooling:  # a reasoning model's reply
                    share = (request.reasoning_share if request.HasField("reasoning_share")
                             else reasoning.share if self.reasoning else 0.0)
                    if share > 0:
                        req.reasoning = reasoning_tokens(min(share, 1.0), req.max_tokens)
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
                                   lora=lora, arrived=arrived, decide=decide, kv=kv)

    def _connector(self, rt: ModelRuntime, request: pb.SubmitRequest):
        """(what the request asks of the KV connector, the producer's handoff it pulls,
        whether it wanted one): vLLM's kv_transfer_params as NixlConnector acts on them.
        A kv_producer replica pulls nothing (it prefills what it is given); a replica without
        a connector (no --kv-roles) ignores them, as vLLM without --kv-transfer-config,
        but for the offload caps (max_load_tokens, max_offload_tokens, kv_load_tiers) when
        it offloads. A pull presents its prompt's digest: a handoff of another prompt is a
        miss."""
        if not request.HasField("kv_transfer_params"):
            return None, None, False
        params = request.kv_transfer_params
        caps = offload_caps(params)
        if rt.kv_role == NONE:
            if rt.core.offload is None or caps == (-1, -1, None):
                return None, None, False
            return KvTransfer(False, 0, *caps), None, False
        wanted = params.do_remote_prefill and rt.kv_role != PRODUCER
        pull = (handoff.find(self.fleet, rt.core.name, params.remote_engine_id,
                             params.remote_request_id,
                             prompt_digest(request.prompt_token_ids, request.prompt_tokens))
                if wanted else None)
        kv = KvTransfer(params.do_remote_decode, pull.tokens if pull is not None else 0, *caps)
        return kv, pull, wanted

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
    async def admit_call(self, request: pb.SubmitRequest, sink,
                         context: grpc.aio.ServicerContext) -> tuple[ModelRuntime, Request]:
        """A call's one request through the funnel (Submit, and vLLM's Generate:
        engine.service.vllm_grpc): its replica and queued request, or the call aborted
        with its refusal before any message. A caller gone before the judgement
        withdraws the arrival."""
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
        return rt, req

    async def Submit(self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext):
        sink = SubmitSink()
        rt, req = await self.admit_call(request, sink, context)
        try:
            await context.write(pb.SubmitEvent(
                admitted=pb.Admitted(engine_request_id=req.id, waiting=rt.core.num_waiting,
                                     reasoning_tokens=req.reasoning)))
            while True:
                event, last = await sink.queue.get()
                await context.write(event)
                if last:
                    return
        finally:
            rt.pacer.cancel(req)  # a no-op once finished; frees the request on disconnect

    # ---- Session: many requests over one stream -----------------------------------------
    # Two transports share every line below: the gRPC stream (Session) and the same-host
    # lane (engine.service.lane), which calls `SessionSink.serve` and `session_actions` itself.
    async def Session(self, request_iterator, context: grpc.aio.ServicerContext):
        sink = SessionSink(self)
        sink.same_clock = same_clock(context.invocation_metadata())  # its stamps are believed
        reader = asyncio.create_task(self._read_session(request_iterator, sink))
        try:
            await sink.serve(context.write)
        finally:
            reader.cancel()

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
                self.relay_changed()
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
                    engine_request_id=req.id, waiting=rt.core.num_waiting,
                    reasoning_tokens=req.reasoning)))
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

    # ---- metrics (engine.metrics, engine.service.metrics_feed) ----------------------------
    async def GetMetrics(self, request: pb.GetMetricsRequest, context):
        """With engines (replica indices), theirs alone (a gateway's replica port, scraped
        every 50 ms by an endpoint picker): rendered on the loop (a few replicas' text is
        quick to render: a thread would wait for the GIL longer). All of them (a gateway
        in front of one replica, or no replica filter): off the loop, so the pacer keeps
        its wake-ups. NOT_FOUND when no model has any of the engines."""
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

"""The gateway's client of the engine: the one object handlers and routes talk to.

Knows: the engine's gRPC API (engine.proto) as the gateway uses it. Every HTTP request
travels over a single multiplexed bidirectional `Session` (gateway.transport, over the
engine's same-host lane or gRPC; gateway.channel opens it and replaces a broken one):
`open()` sends `Open(tag, request)` with a gateway-unique tag and returns a
`RequestStream` (gateway.streams) that the Session's dispatcher fills; `cancel()` sends
`Cancel(tag)`. Unary wrappers cover ListModels (cached; refreshed on reconnect and on an
unknown model), GetCapacity and SetCapacity (with the gateway's secrets as `authorization`
metadata, as on the Session and every call that changes state), LoRA adapters, replicas, faults, the engine's expositions
(gateway.metrics_feed: a replica's from the copy the engine keeps pushed here) and the
engine's gRPC health (`serving()`: NOT_SERVING while it drains for shutdown).

Refusals without a round trip, only where they are the engine's own answer
(gateway.admission): `refusal()` gives the engine's text for a request of one sequence
whose arrival stamp lies in a span over which the engine said the queue stays full, and
which is within the largest request the engine says the model takes
(`ModelInfo.max_request_tokens`); gateway.admit decides on it, once per request, before
`open()`, which sends what it is given. A capacity change made through this client
(`set_capacity`) applies the engine's "not full" reply at once.

The hold: the requests this gateway has read and not yet sent (`backlog`,
gateway.backlog, released by the request's `Hold` once it is sent) bound how far the
engine may decide its modelled queue (the Session says the oldest one's stamp).

Does not know: HTTP, OpenAI shapes, token counting, or what the tokens mean.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inference_lab.common.tokenizer import ids_to_bytes
from inference_lab.gateway.backlog import Backlog
from inference_lab.gateway.channel import EngineChannel, SingleFlight
from inference_lab.gateway.errors import ErrorKind, GatewayError, engine_unavailable, from_grpc_error
from inference_lab.gateway.metrics_feed import EngineExpositions
from inference_lab.gateway.streams import ClientGone, RequestStream, SequenceRoute, any_ready
from inference_lab.gateway.transport.session import Probe, Session
from inference_lab.v1 import engine_pb2 as pb

# What a caller of the client needs: the client, what `open` returns and raises, the
# wait on several streams, and the observer it takes.
__all__ = ["ClientGone", "EngineClient", "Probe", "RequestStream", "any_ready"]

_NAME_SHOWN = 200  # an unknown model's name is echoed up to this many characters
_MODEL_REFRESH_MIN_INTERVAL_S = 1.0  # an unknown model name refreshes the cache at most this often
_ENGINE_SERVICE = pb.DESCRIPTOR.services_by_name["Engine"].full_name


class EngineClient:
    """Lazily connected client of one engine. Create and use inside a running loop."""

    def __init__(
        self, target: str, *, connect_timeout: float = 1.0, rpc_timeout: float = 5.0,
        control_token: str | None = None, probe: Probe | None = None,
        session_lane: str | None = None, api_key: str | None = None,
        backlog: Backlog | None = None,
    ) -> None:
        self.target = target
        self._probe = probe  # an observer of the Session pipe (diagnostics), usually None
        # Every secret the gateway holds, one `authorization` entry each: sent with the
        # engine's calls that change state and with the Session and SessionLane, which an
        # engine with secrets requires (engine.service.access: it takes whichever it knows).
        self._control_metadata = tuple(("authorization", f"Bearer {secret}")
                                       for secret in (control_token, api_key) if secret) or None
        self._connect_timeout = connect_timeout
        self._rpc_timeout = rpc_timeout
        self._tags = itertools.count(1)
        self._refreshing = SingleFlight()
        self._models: dict[str, pb.ModelInfo] = {}
        self._models_at = float("-inf")
        # Generation requests read and not yet sent (gateway.backlog): the Session's hold
        # (shared by the clients of one gateway's engines: gateway.engines).
        self.backlog = backlog if backlog is not None else Backlog()
        self._metrics = EngineExpositions(target, connect_timeout, self._finished_seq)
        # session_lane "auto": the Session over the engine's same-host lane when it offers
        # one, else gRPC; "off": gRPC always. None: $INFERENCE_LAB_SESSION_LANE, else "auto".
        self._channel = EngineChannel(
            target, connect_timeout=connect_timeout, session_lane=session_lane, probe=probe,
            metadata=self._control_metadata,
            backlog=self.backlog, prepare=self._fetch_models, on_metrics=self._metrics.feed.take)
        self.session_lane = self._channel.session_lane

    @property
    def _session(self) -> Session | None:
        """The current Session (None before the first connect), live or broken."""
        return self._channel.session

    # ---- the hot path ------------------------------------------------------------------

    async def open(
        self, model: str, prompt: Sequence[int] | int, max_tokens: int | None, *, priority: int = 0,
        request_id: str = "", n: int = 1, replica: int | None = None,
        arrived: float | None = None, reasoning: float | None = 0.0, kv_transfer=None,
    ) -> RequestStream:
        """Start one request on the Session (on replica `replica` of the model; None =
        the engine's default, replica 0); its first event is `admitted` or `rejected`.
        It sends what it is given: whether to refuse the request here is the caller's
        decision, taken before (gateway.admit, with `refusal`). `max_tokens` None lets
        the engine choose the length. With n > 1 it samples n sequences: their progress
        lands in `totals` and each sends its Finished. Raises
        GatewayError(engine_unavailable) when the engine cannot be reached. `prompt` is the
        prompt's token IDs (or only its length). `arrived`: when the request arrived here
        (time.monotonic()); an engine on this machine books its arrival then
        (inference_lab.common.clock). `reasoning`: the share of the reply that comes first
        as reasoning (None: the engine's default). The Open leaves with the Session's next
        message, built once the caller yields to the loop."""
        prompt_tokens = prompt if isinstance(prompt, int) else len(prompt)
        for _ in range(2):
            session = self._channel.live()
            if session is None:
                await self._channel.ensure_session()
                continue
            tag = next(self._tags)
            if self._probe is not None:
                self._probe.on_open(tag)
            stream = RequestStream(tag, asyncio.get_running_loop(), model, n, replica or 0)
            action = pb.SessionAction()
            action.open.tag = tag
            req = action.open.request
            req.model = model
            req.prompt_tokens = prompt_tokens
            if not isinstance(prompt, int):
                req.prompt_token_ids = ids_to_bytes(prompt)
            if max_tokens is not None:
                req.max_tokens = max_tokens
            req.priority = priority
            if request_id:
                req.request_id = request_id
            if replica is not None:
                req.replica = replica
            if arrived is not None:
                req.arrival_monotonic_s = arrived
            if reasoning is not None:
                req.reasoning_share = reasoning
            if kv_transfer is not None:  # vLLM's kv_transfer_params, as parsed
                kv_params_into(req.kv_transfer_params, kv_transfer)
            session.routes[tag] = stream  # no await between the liveness check and this
            if n > 1:
                req.n = n
                for index in range(1, n):  # sequence i reports under tag + i
                    session.routes[next(self._tags)] = SequenceRoute(stream, index)
            session.send(action)
            return stream
        raise engine_unavailable("the session broke while connecting")

    def refusal(self, model: str, prompt_tokens: int, max_tokens: int | None, n: int = 1,
                replica: int | None = None, arrived: float | None = None) -> str | None:
        """The engine's saturation message when this request, which arrived at `arrived`
        (time.monotonic(); None: now), is refused here on the engine's word
        (gateway.admission: the refusal is then counted for the engine's `Refused`
        report); else None. One prompt's part of gateway.admit's decision. Without
        max_tokens the engine fits the length it chooses to the model."""
        session = self._channel.session
        if session is None or session.broken or not session.admission.saturated:
            return None  # (the common case: no queue is full)
        return session.admission.refusal(model, replica or 0, arrived,
                                         prompt_tokens + (max_tokens or 1), n,
                                         self._largest_request)

    def pick_rank(self, model: str) -> int | None:
        """The data-parallel rank of a request that names none: None, one engine's own
        default (gateway.engines balances several)."""
        return None

    def may_refuse(self, arrived: float | None) -> bool:
        """Whether some queue's "full" span covers an arrival at `arrived` (None: now): a
        cheap test before parsing a body only to ask `refusal`."""
        session = self._channel.live()
        return session is not None and session.admission.may_refuse(arrived)

    def _largest_request(self, model: str) -> int | None:
        """The largest request (prompt + output tokens) the engine says `model` takes."""
        info = self._models.get(model)
        return None if info is None else info.max_request_tokens

    def cancel(self, stream: RequestStream, reason: BaseException | None = None) -> None:
        """Cancel a request still running in the engine (no-op when it is done)."""
        if stream.done:
            return
        session = self._channel.live()
        if session is not None:
            for tag in range(stream.tag + 1, stream.tag + stream.n):
                session.routes.pop(tag, None)
            if session.routes.pop(stream.tag, None) is not None:
                action = pb.SessionAction()
                action.cancel.tag = stream.tag
                session.send(action)
                # (a place it frees counts from the engine's next step boundary, where the
                # span of a "full" announcement ends anyway: the copy stays right)
        stream.fail(reason or ClientGone())

    @property
    def inflight(self) -> int:
        session = self._channel.live()
        return 0 if session is None else len(session.routes)

    # ---- connection --------------------------------------------------------------------

    def connect_soon(self) -> None:
        """Open the Session now, in the background (a gateway starting: its first requests
        need not wait for it, which would make their first tokens late); a failure is left
        to the first request, which connects again."""
        self._channel.connect_soon()

    async def close(self) -> None:
        await self._channel.close()
        await self._metrics.close()
        await self._channel.settle()

    async def _unary(self, name: str, request: Any, timeout: float, metadata=None) -> Any:
        return await self._channel.unary(name, request, timeout, metadata)

    # ---- models ------------------------------------------------------------------------

    async def _fetch_models(self) -> int:
        resp = await self._unary("ListModels", pb.ListModelsRequest(), self._connect_timeout)
        self._models = {m.name: m for m in resp.models}
        self._models_at = time.monotonic()
        return len(self._models)

    async def list_models(self, refresh: bool = False) -> list[pb.ModelInfo]:
        """The served models (cached; `refresh` asks the engine, so it doubles as a ping)."""
        if refresh or not self._models:
            await self._fetch_models()
        return list(self._models.values())

    def known_model(self, name: str) -> pb.ModelInfo | None:
        """The served model called `name` as last listed, without asking the engine."""
        return self._models.get(name)

    async def resolve_model(self, name: str) -> pb.ModelInfo:
        """The served model called `name`; refreshes the cache once if it is unknown."""
        info = self._models.get(name)
        if info is not None:
            return info
        if self._channel.live() is None:
            await self._channel.ensure_session()  # connecting refreshes the cache
        elif time.monotonic() - self._models_at >= _MODEL_REFRESH_MIN_INTERVAL_S:
            await self._refreshing.run(self._fetch_models)
        info = self._models.get(name)
        if info is None:
            shown = name if len(name) <= _NAME_SHOWN else name[:_NAME_SHOWN] + "..."
            raise GatewayError(ErrorKind.MODEL_NOT_FOUND, f"The model `{shown}` does not exist.")
        return info

    # ---- capacity -----------------------------------------------------------------------

    async def get_capacity(self, model: str | None = None,
                           replica: int | None = None) -> list[pb.ModelCapacity]:
        """Every replica's row (of one model and/or one replica index when given)."""
        resp = await self._unary(
            "GetCapacity", pb.GetCapacityRequest(model=model or "", replica=replica),
            self._rpc_timeout)
        return list(resp.models)

    async def kv_event_sources(self, replica: int | None = None) -> list[pb.KvEventSource]:
        """The engine's KV-event publishers as bound (one replica's when given; none when
        events are off)."""
        stub = self._channel.stub()
        try:
            resp = await stub.GetKvEventSources(pb.GetKvEventSourcesRequest(replica=replica),
                                                timeout=self._rpc_timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:  # an engine without KV events
                return []
            raise from_grpc_error(exc) from None
        return list(resp.sources)

    async def load_lora_adapter(self, name: str, path: str, base: str = "") -> str:
        """Register a LoRA adapter in the engine; the model list is refreshed."""
        resp = await self._unary("LoadLoraAdapter", pb.LoadLoraAdapterRequest(
            lora_name=name, lora_path=path, base_model_name=base), self._rpc_timeout,
            metadata=self._control_metadata)
        await self._fetch_models()
        return resp.message

    async def unload_lora_adapter(self, name: str) -> str:
        resp = await self._unary("UnloadLoraAdapter", pb.UnloadLoraAdapterRequest(lora_name=name),
                                 self._rpc_timeout, metadata=self._control_metadata)
        await self._fetch_models()
        return resp.message

    async def set_capacity(
        self, model: str | None = None, max_num_seqs: int | None = None,
        max_waiting: int | None = None, replica: int | None = None,
    ) -> list[pb.ModelCapacity]:
        fields: dict[str, Any] = {}
        if model:
            fields["model"] = model
        if replica is not None:
            fields["replica"] = replica
        if max_num_seqs is not None:
            fields["max_num_seqs"] = max_num_seqs
        if max_waiting is not None:
            fields["max_waiting"] = max_waiting
        resp = await self._unary(
            "SetCapacity", pb.SetCapacityRequest(**fields), self._rpc_timeout,
            metadata=self._control_metadata,
        )
        session = self._channel.live()
        if session is not None:
            # A raised bound counts from now, not the next push. A reply's "full" is never
            # taken: it is the queue at the change, before the engine's next step, and the
            # Session may already have announced a later state (that step moving the
            # waiting requests into the new places); a stale "full" applied after it would
            # refuse every request here for good, the engine having nothing new to announce.
            # "Full" comes on the Session, in order; until then the engine refuses itself.
            for state in resp.queue_states:
                if not state.saturated:
                    session.admission.set(state)
        return list(resp.models)

    # ---- replicas -----------------------------------------------------------------------

    async def set_replicas(self, model: str | None, replicas: int) -> list[pb.ModelCapacity]:
        """Add or drain replicas live (SetReplicas, with the gateway's secrets)."""
        resp = await self._unary(
            "SetReplicas", pb.SetReplicasRequest(model=model or "", replicas=replicas),
            self._rpc_timeout, metadata=self._control_metadata)
        return list(resp.models)

    async def sleep(self, model: str | None, replica: int | None, level: int = 0,
                    wake: bool = False, tags: list[str] | None = None) -> list[pb.ModelCapacity]:
        """Put replicas to sleep at `level`, or `wake` them (restoring `tags`, all when
        empty): Sleep, with the control token. Every replica acted on, after."""
        resp = await self._unary(
            "Sleep", pb.SleepRequest(model=model or "", replica=replica, level=level, wake=wake,
                                     tags=tags or ()),
            self._rpc_timeout, metadata=self._control_metadata)
        return list(resp.models)

    # ---- vLLM's dev mode ----------------------------------------------------------------

    async def pause(self, model: str | None, replica: int | None, mode: int = 0,
                    clear_cache: bool = True, resume: bool = False) -> list[pb.ModelCapacity]:
        """Pause replicas in `mode` (a PauseMode), or `resume` them: Pause, with the
        control token. Every replica acted on, after. A "wait" pause answers once the
        running requests have finished, so it has no deadline."""
        timeout = None if mode == pb.PAUSE_MODE_WAIT and not resume else self._rpc_timeout
        resp = await self._unary(
            "Pause", pb.PauseRequest(model=model or "", replica=replica, mode=mode,
                                     clear_cache=clear_cache, resume=resume),
            timeout, metadata=self._control_metadata)
        return list(resp.models)

    async def reset_prefix_cache(self, model: str | None, replica: int | None,
                                 external: bool = False) -> int:
        """Empty replicas' prefix caches (ResetPrefixCache, with the control token; with
        `external` their KV offload tiers too): the blocks forgotten."""
        resp = await self._unary(
            "ResetPrefixCache", pb.ResetPrefixCacheRequest(model=model or "", replica=replica,
                                                           reset_external=external),
            self._rpc_timeout, metadata=self._control_metadata)
        return resp.blocks_cleared

    # ---- metrics ------------------------------------------------------------------------

    async def replica_metrics(self, replica: int) -> bytes:
        """Replica `replica`'s exposition (GetMetrics with engines = [replica]) from the
        copy the engine keeps pushed here (gateway.metrics_feed): no engine call per
        scrape. It shows every request of this gateway that finished on the replica
        before the call; otherwise it is at most ~50 ms old. Asks GetMetrics when the
        copy cannot answer (an engine without WatchMetrics, a feed that does not come)."""
        return await self._metrics.replica(replica)

    def replica_metrics_now(self, replica: int) -> bytes | None:
        """`replica_metrics` when its copy is here already (no wait, no call); else None."""
        return self._metrics.replica_now(replica)

    def replica_metrics_if_fed(self, replica: int) -> bytes | None:
        """The copy of `replica`'s exposition while a scraper keeps the engine pushing it
        (not kept pushing for this caller); else None (ask `metrics_text`)."""
        return self._metrics.replica_if_fed(replica)

    def _finished_seq(self, replica: int) -> int:
        session = self._channel.live()
        return 0 if session is None else session.finished_seq.get(replica, 0)

    def copy_waits(self, replica: int) -> int:
        """Scrapes of `replica` whose copy had to wait for a newer push (a request this
        gateway saw finish was not in it yet)."""
        return self._metrics.copy_waits(replica)

    async def metrics_text(self, models: list[str] | None = None,
                           engines: list[int] | None = None) -> bytes:
        """The engine's Prometheus exposition (vllm:* and inference_lab_*) of `models` on
        the engines (replicas) `engines` (None: all), as text; one unary call with a short
        deadline. Empty when no model has those replicas."""
        return await self._metrics.text(models, engines)

    # ---- replica-level faults ----------------------------------------------------------

    async def inject_fault(self, kind: int, seconds: float = 0.0, factor: float = 0.0,
                           replica: int | None = None) -> pb.EngineFaultState:
        """InjectFault (with the gateway's secrets): crash, stall, slow down or clear, of the
        whole engine or of one replica (REPLICA_NOT_FOUND when no model has it)."""
        return await self._unary(
            "InjectFault", pb.InjectFaultRequest(kind=kind, seconds=seconds, factor=factor,
                                                 replica=replica),
            self._rpc_timeout, metadata=self._control_metadata)

    async def fault_state(self, replica: int | None = None) -> pb.EngineFaultState:
        """The whole engine's faults, or one replica's in effect."""
        return await self._unary("GetFaultState", pb.GetFaultStateRequest(replica=replica),
                                 self._rpc_timeout)

    async def stalled_for(self, replica: int) -> float:
        """Seconds left of a stall fault on `replica` (0 from an engine without faults)."""
        stub = self._channel.stub()
        try:
            state = await stub.GetFaultState(pb.GetFaultStateRequest(replica=replica),
                                             timeout=self._connect_timeout,
                                             wait_for_ready=False)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                return 0.0
            raise from_grpc_error(exc) from None
        return state.stalled_for_s

    # ---- health -------------------------------------------------------------------------

    async def serving(self) -> bool:
        """The engine's gRPC health: False while it drains for shutdown (an engine without
        the health service counts as serving)."""
        self._channel.stub()
        health = health_pb2_grpc.HealthStub(self._channel.channel)
        try:
            reply = await health.Check(
                health_pb2.HealthCheckRequest(service=_ENGINE_SERVICE),
                timeout=self._connect_timeout, wait_for_ready=False,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                return True
            raise from_grpc_error(exc) from None
        return reply.status == health_pb2.HealthCheckResponse.SERVING


def kv_params_into(msg: pb.KvTransferParams, params) -> None:
    """Copy parsed kv_transfer_params (any object with NixlConnector's keys and the
    offload caps as attributes, None where absent) into the request's message."""
    msg.do_remote_decode = bool(params.do_remote_decode)
    msg.do_remote_prefill = bool(params.do_remote_prefill)
    if params.remote_engine_id is not None:
        msg.remote_engine_id = params.remote_engine_id
    if params.remote_block_ids:
        msg.remote_block_ids.extend(params.remote_block_ids)
    if params.remote_host is not None:
        msg.remote_host = params.remote_host
    if params.remote_port is not None:
        msg.remote_port = params.remote_port
    if params.remote_request_id is not None:
        msg.remote_request_id = params.remote_request_id
    if params.tp_size is not None:
        msg.tp_size = params.tp_size
    if params.max_load_tokens is not None:  # KV offloading's per-request caps
        msg.max_load_tokens = params.max_load_tokens
    if params.max_offload_tokens is not None:
        msg.max_offload_tokens = params.max_offload_tokens
    if params.kv_load_tiers is not None:
        msg.kv_load_tiers.extend(t.medium for t in params.kv_load_tiers)
        msg.kv_load_tiers_given = True

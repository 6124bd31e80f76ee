"""The simulated fleet of virtual time: the replicas of one model, each an EngineCore
stepped on the loop's clock as the offline driver steps it (arrivals booked at their
instant, a step at the core's next event, its tokens delivered at its end).

The rules are the served lab's, from their one home each: which replicas exist, when
each is ready, how a scale request is checked and applied and which replica a request
may go to (engine.fleet.rules); every refusal's status and envelope (common.error_table);
the rows of /control/replicas and /control/capacity (common.control_rows); and each
replica's metrics, kept by the engine's own update points and rendered by its own
exposition (engine.metrics), so /metrics has the served engine's names, labels, HELP and
TYPE. With `data_parallel_size` D > 1 each replica is D ranks
(engine.drivers.data_parallel): its requests routed by vLLM's balancer, an MoE model's
ranks stepped in lockstep, a step's tokens delivered at its end as for one core; its
/metrics has one `engine` per rank, as vLLM's.

The control plane the runner uses is routed here by path and method (`ROUTES`), since the
gateway's handlers are aiohttp's and reach the engine over gRPC: GET/POST
/control/capacity (of a replica's port), GET/POST /control/replicas (base port), GET
/metrics, GET /v1/models, POST /v1/load_lora_adapter, POST /control/faults/replica
(`slow` and `clear`; other faults are not modelled here and are refused when the
scenario loads).

Knows asyncio's loop interface, the engine's core, the fleet's rules and its metrics.
Does not know sockets or HTTP framing (requests are handed over as objects), nor the
gateway or the engine service.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

from inference_lab.common.control_rows import capacity_row, replica_row
from inference_lab.common.error_table import (ERRORS, SATURATED_SPECS, ErrorKind, ErrorSpec,
                                             openai_envelope)
from inference_lab.engine.drivers.data_parallel import DataParallelRanks
from inference_lab.engine.fleet.rules import (MAX_REPLICAS, Replica, ReplicaNotFound,
                                              ReplicaTable, ReplicaUnavailable)
from inference_lab.engine.metrics.exposition import Exposition
from inference_lab.engine.metrics.series import REJECTION_REASONS
from inference_lab.engine.metrics.sglang import model_metrics
from inference_lab.engine.metrics.updates import Versions
from inference_lab.engine.sim.capacity import CapacityError, require_change
from inference_lab.engine.sim.core import EngineCore, QueueSaturated, SubmitError
from inference_lab.engine.sim.specs import Deployment
from inference_lab.experiments.client import Result

__all__ = ["VirtualLab", "BASE_PORT", "MAX_REPLICAS"]

BASE_PORT = 8000  # replica i answers on BASE_PORT + i (the ports are names only)
QUEUE_SATURATED, INVALID_REQUEST = REJECTION_REASONS  # the engine's refusal reasons


class _Runtime:
    """What one replica runs on in virtual time: its core (or data-parallel ranks), the
    requests it holds, its metrics (one ModelMetrics per core) and its timers."""

    __slots__ = ("replica", "core", "cores", "dp", "open", "scheduled", "pending", "timer",
                 "publisher", "metrics", "exposition", "unretired")

    def __init__(self, cores: list[EngineCore], dp: DataParallelRanks | None,
                 engines: list[int]) -> None:
        self.replica: Replica | None = None  # its entry in the fleet's table
        self.dp = dp  # data-parallel ranks (None: one core)
        self.cores = cores
        self.core = cores[0] if dp is None else None
        self.scheduled = False  # a step (or its delivery) is on the loop
        self.open: dict[tuple[int, int], tuple] = {}  # (rank, request id) -> (conn, Result, req)
        self.pending: set[int] = set()  # ranks whose step's delivery is on the loop
        self.timer = None  # the ranks' next step
        self.publisher = None  # the coordinator's next publication
        versions = Versions()
        # named as the cores' engine profile names them (vllm:* or sglang:*)
        self.metrics = [model_metrics(core, engine, versions) for core, engine in zip(cores, engines)]
        self.exposition = Exposition(list(self.metrics))
        self.unretired: list[tuple[float, int, object]] = []  # (end, rank, StepResult)

    def stepped(self, rank: int, result) -> None:
        """A step was computed: its metrics are updated when it retires (its end), as the
        pacer updates them (`retire`)."""
        self.unretired.append((result.end, rank, result))

    def retire(self, now: float) -> None:
        """The update point of every step that has ended by `now`, in order."""
        if self.unretired:
            later = []
            for entry in self.unretired:
                if entry[0] <= now:
                    self.metrics[entry[1]].on_step(entry[2])
                else:
                    later.append(entry)
            self.unretired = later


def _json(status: int, body) -> tuple[int, bytes]:
    return status, json.dumps(body).encode()


def _error(kind: ErrorKind, message: str, spec: ErrorSpec | None = None) -> tuple[int, bytes]:
    spec = spec or ERRORS[kind]
    return spec.status, openai_envelope(spec, message)


class VirtualLab:
    """The replicas of one model on the loop's clock (see the module's docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deployment: Deployment, *,
                 replicas: int = 1, startup_delay: float = 0.0, max_loras: int = 1,
                 data_parallel_size: int = 1) -> None:
        self.loop = loop
        self.data_parallel_size = data_parallel_size
        self.deployment = deployment
        self.model = deployment.name
        self.startup_delay = startup_delay
        self.max_loras = max_loras
        self.adapters: dict[str, int] = {}  # loaded LoRA adapters -> rank
        self.table = ReplicaTable([self.model], loop.time)
        self.slowdown = 1.0
        self.steps = 0
        for i in range(replicas):  # the deployment is up when the run starts
            self._place(i, 0.0)

    @property
    def replicas(self) -> dict[int, _Runtime]:
        """Each replica's runtime by index (draining ones included)."""
        return {i: r.runtime for i, r in self.table.replicas[self.model].items()}

    # ---- replicas -------------------------------------------------------------------------
    def _place(self, index: int, delay: float) -> None:
        dp = None
        if self.data_parallel_size > 1:
            dp = DataParallelRanks(self.deployment, self.data_parallel_size, slowdown=self.slowdown)
            cores = dp.cores
        else:
            cores = [EngineCore(self.deployment)]
        for core in cores:
            core.slowdown = self.slowdown
            if self.adapters:
                registry = core.enable_lora(self.max_loras)
                for name, rank in self.adapters.items():
                    registry.load(name, "", rank)
        # the `engine` label: the replica's index, or each rank's (vLLM's data-parallel)
        rt = _Runtime(cores, dp, [index] if dp is None else list(range(len(cores))))
        rt.replica = self.table.place(self.model, index, rt, delay)

    def scale(self, count: int) -> None:
        """`count` active replicas (ValueError: the fleet's rules refuse it)."""
        for step in self.table.plan(self.model, count):
            for index in step.add:
                self._place(index, self.startup_delay)
            for replica in step.drain:
                replica.draining = True
                self._maybe_close(replica.runtime)

    def _maybe_close(self, rt: _Runtime) -> None:
        replica = rt.replica
        if replica.draining and not rt.open and not any(c.has_work() for c in rt.cores) \
                and self.table.forget(replica):
            for handle in (rt.timer, rt.publisher):
                if handle is not None:
                    handle.cancel()
            rt.timer = rt.publisher = None

    # ---- requests ---------------------------------------------------------------------------
    def submit(self, port: int, job, conn) -> None:
        now = self.loop.time()
        result = Result(0, now, 0.0, 0.0)
        try:
            rt = self.table.lookup(self.model, port - BASE_PORT).runtime
        except (ReplicaUnavailable, ReplicaNotFound) as exc:
            # (a port with no replica: the served lab's is closed, no backend answers)
            return self._answer(conn, result, ErrorKind.REPLICA_UNAVAILABLE, str(exc))
        if job.model and job.model != self.model and job.model not in self.adapters:
            return self._answer(conn, result, ErrorKind.MODEL_NOT_FOUND,
                                f"model {job.model!r} does not exist")
        rank = rt.dp.route(now) if rt.dp is not None else 0
        core = rt.cores[rank]
        lora = core.loras.adapters.get(job.model) if job.model and job.model != self.model else None
        prompt = job.prompt_tokens if not job.token_ids else 0
        try:
            if rt.dp is None:
                req = core.submit(prompt, job.max_tokens, now, token_ids=job.token_ids, lora=lora)
            else:  # (counted in the rank's figures)
                req = rt.dp.submit(rank, now, prompt, job.max_tokens,
                                   token_ids=job.token_ids, lora=lora)
        except QueueSaturated as exc:
            rt.metrics[rank].on_rejected(QUEUE_SATURATED)
            if rt.dp is not None:
                self._publish_later(rt)
            # the status of the engine imitated (sglang: 503), as serve's gateway answers it
            return self._answer(conn, result, ErrorKind.QUEUE_SATURATED, str(exc),
                                SATURATED_SPECS[core.profile.saturated_status])
        except SubmitError as exc:
            rt.metrics[rank].on_rejected(INVALID_REQUEST)
            return self._answer(conn, result, ErrorKind.INVALID_REQUEST, str(exc))
        rt.open[(rank, req.id)] = (conn, result, req)
        if rt.dp is not None:
            self._schedule_ranks(rt)
        elif not rt.scheduled:
            self._schedule(rt)

    def _answer(self, conn, result: Result, kind: ErrorKind, message: str,
                spec: ErrorSpec | None = None) -> None:
        status, body = _error(kind, message, spec)
        result.status, result.done = status, self.loop.time()
        result.error = body[:300].decode("utf-8", "replace")  # as the client keeps a body
        self.loop.call_soon(conn.done, result)

    def _schedule(self, rt: _Runtime) -> None:
        t = rt.core.next_event_time()
        if t is None:
            rt.scheduled = False
            self._maybe_close(rt)
            return
        rt.scheduled = True
        now = self.loop.time()
        if t <= now:
            self.loop.call_soon(self._step, rt)
        else:
            self.loop.call_at(t, self._step, rt)

    def _step(self, rt: _Runtime) -> None:
        """Step the replica; steps that give nobody anything (no first token, no finish)
        run back to back in this one callback while each starts before any other
        callback could run (the loop's horizon): nothing can reach the replica meanwhile,
        so the order of events is the offline driver's."""
        core, loop = rt.core, self.loop
        now = loop.time()
        horizon = loop.horizon() if hasattr(loop, "horizon") else now
        rt.retire(now)
        while True:
            t = core.next_event_time()
            if t is None:
                rt.scheduled = False
                self._maybe_close(rt)
                return
            result = core.step(max(t, now))
            rt.stepped(0, result)
            self.steps += 1
            if result.first_token or result.finished:
                break
            nxt = core.next_event_time()
            if nxt is None or nxt >= horizon:
                break
        if result.first_token or result.finished:
            if result.end > now:
                loop.call_at(result.end, self._deliver, rt, result)
            else:
                self._deliver(rt, result)
        else:
            self._schedule(rt)

    def _deliver(self, rt: _Runtime, result, rank: int = 0) -> None:
        rt.retire(self.loop.time())  # this step's update point, then its finishes'
        metrics = rt.metrics[rank]
        for req in result.first_token:
            entry = rt.open.get((rank, req.id))
            if entry is not None:
                entry[1].first = req.first_token
        for req in result.finished:
            entry = rt.open.pop((rank, req.id), None)
            if entry is None:
                continue
            conn, res, _ = entry
            if rt.dp is not None:
                rt.dp.finished(rank, req)
            res.status = 200
            res.done = req.finish_time
            res.completion_tokens = req.num_output
            res.cached_tokens = req.cached_tokens
            res.modelled = {"queue_time_s": req.first_scheduled - req.arrival,
                            "ttft_s": req.first_token - req.arrival,
                            "e2e_s": req.finish_time - req.arrival,
                            "preemptions": req.preemptions}
            metrics.on_finished(req, req.num_output, req.finish_time)
            conn.done(res)
        # the next step after what this instant's completions sent (a closed loop's next turn)
        if rt.dp is None:
            self.loop.call_soon(self._schedule, rt)
        else:
            rt.pending.discard(rank)
            self.loop.call_soon(self._schedule_ranks, rt)

    # ---- data-parallel ranks ----------------------------------------------------------------
    def _schedule_ranks(self, rt: _Runtime) -> None:
        """Arm the ranks' next step: the earliest rank's next event, leaving out the ranks
        whose last step is not delivered yet (an MoE replica's aligned step: all of them)."""
        dp, loop = rt.dp, self.loop
        if rt.timer is not None:
            rt.timer.cancel()
            rt.timer = None
        self._publish_later(rt)
        t = None if dp.lockstep and rt.pending else dp.next_step_time(rt.pending)
        if t is None:
            rt.scheduled = bool(rt.pending)
            if not rt.scheduled:
                self._maybe_close(rt)
            return
        rt.scheduled = True
        rt.timer = loop.call_at(max(t, loop.time()), self._step_ranks, rt)

    def _step_ranks(self, rt: _Runtime) -> None:
        rt.timer = None
        loop = self.loop
        rt.retire(loop.time())
        for rank, result in rt.dp.step(loop.time(), rt.pending):
            self.steps += 1
            rt.stepped(rank, result)
            if result.first_token or result.finished:
                rt.pending.add(rank)
                loop.call_at(result.end, self._deliver, rt, result, rank)
        self._schedule_ranks(rt)

    def _publish_later(self, rt: _Runtime) -> None:
        """Arm the coordinator's next publication (the counts as they are now)."""
        if rt.publisher is not None:
            rt.publisher.cancel()
        t = rt.dp.next_publication()
        rt.publisher = None if t is None else self.loop.call_at(t, self._publish, rt)

    def _publish(self, rt: _Runtime) -> None:
        rt.publisher = None
        rt.dp.observe(self.loop.time())
        self._publish_later(rt)

    # ---- the control plane --------------------------------------------------------------------
    def request(self, method: str, url: str, body: dict | None = None) -> tuple[int, bytes]:
        parts = urlsplit(url)
        handler = ROUTES.get((method, parts.path)) or ROUTES.get(("*", parts.path))
        if handler is None:
            return _error(ErrorKind.ROUTE_NOT_FOUND,
                          f"{method} {parts.path}: not served in virtual time")
        return handler(self, method, parts.port or 0, body or {})

    def exposition(self, rt: _Runtime) -> bytes:
        """A replica's /metrics: the engine's series of its cores, as the engine renders them."""
        rt.retire(self.loop.time())
        return rt.exposition.render()

    def rows(self) -> list[dict]:
        """The rows of /control/replicas."""
        out = []
        for st in self.table.statuses(self.model):
            cores = self.table.replicas[self.model][st.replica].runtime.cores
            out.append(replica_row(st.model, st.replica, BASE_PORT + st.replica, st.starting,
                                   st.draining, st.ready_in_s,
                                   sum(c.num_waiting for c in cores),
                                   sum(c.num_running for c in cores)))
        return out

    def _replicas(self, method: str, port: int, body: dict) -> tuple[int, bytes]:
        if port != BASE_PORT:
            return _error(ErrorKind.ROUTE_NOT_FOUND, "/control/replicas is served on the base port")
        if method == "POST":
            count = body.get("replicas")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                return _error(ErrorKind.INVALID_REQUEST, 'Invalid replicas update: expected '
                              '{"model"?: string, "replicas": integer >= 0}')
            try:
                self.scale(count)
            except ValueError as exc:
                return _error(ErrorKind.INVALID_REQUEST, str(exc))
        return _json(200, self.rows())

    def _capacity(self, method: str, port: int, body: dict) -> tuple[int, bytes]:
        replica = self.table.replicas[self.model].get(port - BASE_PORT)
        if replica is None:
            kind = ErrorKind.REPLICA_NOT_FOUND if port != BASE_PORT else ErrorKind.REPLICA_UNAVAILABLE
            return _error(kind, f"no replica {port - BASE_PORT} of model {self.model!r}")
        rt = replica.runtime
        if method == "POST":
            seqs, waiting = body.get("max_num_seqs"), body.get("max_waiting")
            try:
                require_change(seqs, waiting)
                for core in rt.cores:  # every rank checked before any changes
                    core.check_capacity(seqs, waiting)
            except CapacityError as exc:
                return _error(ErrorKind.INVALID_REQUEST, str(exc))
            for core in rt.cores:
                core.set_capacity(seqs, waiting)
            if rt.dp is not None:
                self._schedule_ranks(rt)
            elif not rt.scheduled:
                self._schedule(rt)
        cores = rt.cores
        return _json(200, [capacity_row(self.model, cores[0].max_waiting, cores[0].max_num_seqs,
                                        sum(c.num_waiting for c in cores),
                                        sum(c.num_running for c in cores))])

    def _metrics(self, method: str, port: int, body: dict) -> tuple[int, bytes]:
        replica = self.table.replicas[self.model].get(port - BASE_PORT)
        if replica is None or not replica.ready(self.loop.time()):
            return 503, b""
        return 200, self.exposition(replica.runtime)

    def _models(self, method: str, port: int, body: dict) -> tuple[int, bytes]:
        names = [self.model, *self.adapters]
        return _json(200, {"object": "list", "data": [{"id": n, "object": "model"} for n in names]})

    def _load_lora(self, method: str, port: int, body: dict) -> tuple[int, bytes]:
        name = body.get("lora_name")
        rank = self._rank(body.get("lora_path"))
        self.adapters[name] = rank
        for rt in self.replicas.values():
            for core in rt.cores:
                registry = core.loras or core.enable_lora(self.max_loras)
                registry.load(name, "", rank)
        return 200, b"ok"

    def _replica_fault(self, method: str, port: int, body: dict) -> tuple[int, bytes]:
        fault = body.get("fault")
        factor = float(body.get("factor", 1.0)) if fault == "slow" else 1.0
        self.slowdown = factor
        for rt in self.replicas.values():
            for core in rt.cores:
                core.slowdown = factor
        return _json(200, {"slow_factor": factor})

    def _faults(self, method: str, port: int, body: dict) -> tuple[int, bytes]:
        return _json(200, {})

    @staticmethod
    def _rank(path) -> int:
        try:
            with open(f"{path}/adapter_config.json") as f:
                return int(json.load(f).get("r", 16))
        except (OSError, ValueError, TypeError):
            return 16


# (method, path) -> handler; "*": any method
ROUTES = {
    ("*", "/control/replicas"): VirtualLab._replicas,
    ("*", "/control/capacity"): VirtualLab._capacity,
    ("*", "/metrics"): VirtualLab._metrics,
    ("*", "/v1/models"): VirtualLab._models,
    ("POST", "/v1/load_lora_adapter"): VirtualLab._load_lora,
    ("POST", "/control/faults/replica"): VirtualLab._replica_fault,
    ("POST", "/control/faults"): VirtualLab._faults,
}

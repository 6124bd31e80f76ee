"""Virtual time: the experiment runner, unchanged, on a simulated clock, against a
simulated fleet that answers the same requests a served lab answers.

- `VirtualLoop`: an asyncio event loop whose `time()` is the simulated clock. When no
  callback is ready it jumps the clock to the earliest timer instead of waiting, so
  sleeps, timeouts and timers cost no wall time; nothing else changes (tasks, futures,
  `call_at`). Waiting with no timer at all is a deadlock and raises.
- `VirtualLab`: the replicas of one model, each an EngineCore stepped on that loop
  as the offline driver steps it (arrivals booked at their instant, a step at the core's
  next event, its tokens delivered at its end), with the fleet's rules: a replica is ready
  its start-up delay after it is created; scaling adds the lowest free indices and drains
  the highest (a draining replica admits nothing and closes once it holds nothing); a
  request to a replica that is not ready is a 503, one the full queue refuses a 529.
  It answers the control plane the runner uses, as the gateway does, with the same JSON:
  GET/POST /control/capacity (of a replica's port), GET/POST /control/replicas (base
  port), GET /metrics (a replica's vLLM series and the lab's capacity gauges), GET
  /v1/models, POST /v1/load_lora_adapter, POST /control/faults/replica (`slow` and
  `clear`; other faults are not modelled here and are refused when the scenario loads).
  With `data_parallel_size` D > 1 each replica is D ranks (engine.drivers.data_parallel):
  its requests routed by vLLM's balancer, an MoE model's ranks stepped in lockstep, a
  step's tokens delivered at its end as for one core; the replica's series sum its ranks.
- `VirtualBackend`: the runner's clock, timer, control client and endpoints over them.

Every response carries the engine's modelled timings, and the client's measurements are
those same instants (no network, no gateway): TTFT is the end of the step that made the
first token, e2e the end of the last one.

Knows asyncio's loop interface and the engine's core. Does not know sockets or HTTP
framing (requests are handed over as objects).
"""

from __future__ import annotations

import asyncio
import json
import selectors
from dataclasses import dataclass
from urllib.parse import urlsplit

from inference_lab.engine.drivers.data_parallel import DataParallelRanks
from inference_lab.engine.sim.core import EngineCore, QueueSaturated, SubmitError
from inference_lab.engine.sim.capacity import CapacityError
from inference_lab.engine.sim.specs import Deployment
from inference_lab.experiments.client import Result

__all__ = ["VirtualLoop", "VirtualLab", "VirtualBackend", "VirtualTimeError", "BASE_PORT"]

BASE_PORT = 8000  # replica i answers on BASE_PORT + i (the ports are names only)
MAX_REPLICAS = 64


class VirtualTimeError(RuntimeError):
    """The run waited with nothing scheduled: no event could ever wake it."""


class _Selector(selectors.SelectSelector):
    """Registers file objects as any selector does but never waits: `select(timeout)`
    moves the loop's clock forward by `timeout` and reports no I/O."""

    def __init__(self, loop: "VirtualLoop") -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout=None):
        if timeout is None:
            raise VirtualTimeError("virtual time: the run waits for something no timer or "
                                   "step will ever bring")
        if timeout > 0:
            self._loop.advance(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(selector=_Selector(self))

    def time(self) -> float:
        return self._now

    def horizon(self) -> float:
        """The earliest instant another callback may run at: now while any is ready, else
        the earliest timer's (inf: none). Read from asyncio's own queues (BaseEventLoop's
        `_ready` and `_scheduled`); a loop without them gives now (no running ahead)."""
        ready, scheduled = getattr(self, "_ready", None), getattr(self, "_scheduled", None)
        if ready is None or scheduled is None or ready:
            return self._now
        return scheduled[0].when() if scheduled else float("inf")

    def advance(self, seconds: float) -> None:
        # `seconds` is the earliest timer's instant less now: the sum lands within a
        # rounding error of it, well inside the loop's clock resolution (1 ns)
        self._now += seconds


class VirtualTimer:
    """alarm.Timer's interface on the loop's own timers."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback) -> None:
        self.loop, self.callback = loop, callback
        self.handle = None

    def arm(self, when: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.handle = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.handle = None
        self.callback()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


@dataclass(slots=True)
class Job:
    """One request as the virtual endpoint hands it over."""

    prompt_tokens: int
    max_tokens: int
    token_ids: bytes
    model: str  # "" = the base model, else a LoRA adapter


class _Replica:
    __slots__ = ("index", "core", "ready_at", "draining", "scheduled", "open", "success",
                 "generated", "prompted", "refused", "dp", "cores", "pending", "timer",
                 "publisher")

    def __init__(self, index: int, core: EngineCore, ready_at: float,
                 dp: DataParallelRanks | None = None) -> None:
        self.index, self.core, self.ready_at = index, core, ready_at
        self.draining = False
        self.scheduled = False  # a step (or its delivery) is on the loop
        self.open: dict[tuple[int, int], tuple] = {}  # (rank, request id) -> (conn, Result, req)
        self.success = self.generated = self.prompted = self.refused = 0
        self.dp = dp  # data-parallel ranks (None: one core)
        self.cores = dp.cores if dp is not None else [core]
        self.pending: set[int] = set()  # ranks whose step's delivery is on the loop
        self.timer = None  # the ranks' next step
        self.publisher = None  # the coordinator's next publication


class VirtualConnection:
    """client.Connection's interface: one request at a time, answered by the lab."""

    __slots__ = ("lab", "port", "on_done", "ctx", "closed", "busy")

    def __init__(self, lab: "VirtualLab", port: int) -> None:
        self.lab, self.port = lab, port
        self.on_done = None
        self.ctx = None
        self.closed = False
        self.busy = False

    def start(self, job: Job, on_done, ctx=None) -> None:
        self.on_done, self.ctx, self.busy = on_done, ctx, True
        self.lab.submit(self.port, job, self)

    def send(self, job: Job) -> asyncio.Future:
        waiter = self.lab.loop.create_future()
        self.start(job, _resolve, waiter)
        return waiter

    def close(self) -> None:
        self.closed = True

    def done(self, result: Result) -> None:
        self.busy = False
        on_done = self.on_done
        self.on_done = None
        on_done(self, result)


def _resolve(conn: VirtualConnection, result: Result) -> None:
    waiter = conn.ctx
    if not waiter.done():
        waiter.set_result(result)


class VirtualEndpoint:
    """client.Endpoint's interface for one replica port."""

    def __init__(self, lab: "VirtualLab", port: int) -> None:
        self.lab, self.port = lab, port

    def build(self, prompt, max_tokens: int, serial: int) -> Job:
        return Job(prompt.tokens, max_tokens, prompt.ids, prompt.adapter)

    async def connect(self) -> VirtualConnection:
        return VirtualConnection(self.lab, self.port)


def _json(status: int, body) -> tuple[int, bytes]:
    return status, json.dumps(body).encode()


def _error(status: int, message: str, code: str) -> tuple[int, bytes]:
    return _json(status, {"error": {"message": message, "type": "invalid_request_error"
                                    if status < 500 else "unavailable", "code": code}})


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
        self.replicas: dict[int, _Replica] = {}
        self.slowdown = 1.0
        self.steps = 0
        for i in range(replicas):  # the deployment is up when the run starts
            self.replicas[i] = self._new(i, ready_at=loop.time())

    # ---- replicas -------------------------------------------------------------------------
    def _new(self, index: int, ready_at: float) -> _Replica:
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
        return _Replica(index, cores[0] if dp is None else None, ready_at, dp)

    def scale(self, count: int) -> None:
        active = sorted(i for i, r in self.replicas.items() if not r.draining)
        index = 0
        for _ in range(count - len(active)):
            while index in self.replicas:
                index += 1
            self.replicas[index] = self._new(index, self.loop.time() + self.startup_delay)
        for index in reversed(active[count:]):
            replica = self.replicas[index]
            replica.draining = True
            self._maybe_close(replica)

    def _maybe_close(self, replica: _Replica) -> None:
        if replica.draining and not replica.open and not any(c.has_work() for c in replica.cores) \
                and self.replicas.get(replica.index) is replica:
            del self.replicas[replica.index]
            for handle in (replica.timer, replica.publisher):
                if handle is not None:
                    handle.cancel()
            replica.timer = replica.publisher = None

    def rows(self) -> list[dict]:
        now = self.loop.time()
        out = []
        for i in sorted(self.replicas):
            r = self.replicas[i]
            ready_in = 0.0 if r.draining else max(r.ready_at - now, 0.0)
            out.append({"model": self.model, "replica": i, "port": BASE_PORT + i,
                        "ready": not r.draining and ready_in <= 0, "starting": ready_in > 0,
                        "draining": r.draining, "ready_in_s": round(ready_in, 3),
                        "waiting": sum(c.num_waiting for c in r.cores),
                        "running": sum(c.num_running for c in r.cores)})
        return out

    # ---- requests ---------------------------------------------------------------------------
    def submit(self, port: int, job: Job, conn: VirtualConnection) -> None:
        now = self.loop.time()
        result = Result(0, now, 0.0, 0.0)
        replica = self.replicas.get(port - BASE_PORT)
        if replica is None or replica.draining or now < replica.ready_at:
            what = ("is draining" if replica is not None and replica.draining else
                    "is starting" if replica is not None else "does not exist")
            return self._answer(conn, result, 503, f"replica {port - BASE_PORT} {what}")
        if job.model and job.model != self.model and job.model not in self.adapters:
            return self._answer(conn, result, 404, f"model {job.model!r} does not exist")
        rank = replica.dp.route(now) if replica.dp is not None else 0
        core = replica.cores[rank]
        lora = core.loras.adapters.get(job.model) if job.model and job.model != self.model else None
        prompt = job.prompt_tokens if not job.token_ids else 0
        try:
            if replica.dp is None:
                req = core.submit(prompt, job.max_tokens, now, token_ids=job.token_ids, lora=lora)
            else:  # (counted in the rank's figures)
                req = replica.dp.submit(rank, now, prompt, job.max_tokens,
                                        token_ids=job.token_ids, lora=lora)
        except QueueSaturated as exc:
            replica.refused += 1
            if replica.dp is not None:
                self._publish_later(replica)
            return self._answer(conn, result, 529, str(exc))
        except SubmitError as exc:
            return self._answer(conn, result, 400, str(exc))
        replica.open[(rank, req.id)] = (conn, result, req)
        if replica.dp is not None:
            self._schedule_ranks(replica)
        elif not replica.scheduled:
            self._schedule(replica)

    def _answer(self, conn: VirtualConnection, result: Result, status: int, message: str) -> None:
        result.status, result.done = status, self.loop.time()
        result.error = json.dumps({"error": {"message": message}})[:300]
        self.loop.call_soon(conn.done, result)

    def _schedule(self, replica: _Replica) -> None:
        t = replica.core.next_event_time()
        if t is None:
            replica.scheduled = False
            self._maybe_close(replica)
            return
        replica.scheduled = True
        now = self.loop.time()
        if t <= now:
            self.loop.call_soon(self._step, replica)
        else:
            self.loop.call_at(t, self._step, replica)

    def _step(self, replica: _Replica) -> None:
        """Step the replica; steps that give nobody anything (no first token, no finish)
        run back to back in this one callback while each starts before any other
        callback could run (the loop's horizon): nothing can reach the replica meanwhile,
        so the order of events is the offline driver's."""
        core, loop = replica.core, self.loop
        now = loop.time()
        horizon = loop.horizon() if isinstance(loop, VirtualLoop) else now
        while True:
            t = core.next_event_time()
            if t is None:
                replica.scheduled = False
                self._maybe_close(replica)
                return
            result = core.step(max(t, now))
            self.steps += 1
            if result.first_token or result.finished:
                break
            nxt = core.next_event_time()
            if nxt is None or nxt >= horizon:
                break
        if result.first_token or result.finished:
            if result.end > now:
                loop.call_at(result.end, self._deliver, replica, result)
            else:
                self._deliver(replica, result)
        else:
            self._schedule(replica)

    def _deliver(self, replica: _Replica, result, rank: int = 0) -> None:
        for req in result.first_token:
            entry = replica.open.get((rank, req.id))
            if entry is not None:
                entry[1].first = req.first_token
        for req in result.finished:
            entry = replica.open.pop((rank, req.id), None)
            if entry is None:
                continue
            conn, res, _ = entry
            if replica.dp is not None:
                replica.dp.finished(rank, req)
            res.status = 200
            res.done = req.finish_time
            res.completion_tokens = req.num_output
            res.cached_tokens = req.cached_tokens
            res.modelled = {"queue_time_s": req.first_scheduled - req.arrival,
                            "ttft_s": req.first_token - req.arrival,
                            "e2e_s": req.finish_time - req.arrival,
                            "preemptions": req.preemptions}
            replica.success += 1
            replica.generated += req.num_output
            replica.prompted += req.prompt_len
            conn.done(res)
        # the next step after what this instant's completions sent (a closed loop's next turn)
        if replica.dp is None:
            self.loop.call_soon(self._schedule, replica)
        else:
            replica.pending.discard(rank)
            self.loop.call_soon(self._schedule_ranks, replica)

    # ---- data-parallel ranks ----------------------------------------------------------------
    def _schedule_ranks(self, replica: _Replica) -> None:
        """Arm the ranks' next step: the earliest rank's next event, leaving out the ranks
        whose last step is not delivered yet (an MoE replica's aligned step: all of them)."""
        dp, loop = replica.dp, self.loop
        if replica.timer is not None:
            replica.timer.cancel()
            replica.timer = None
        self._publish_later(replica)
        t = None if dp.lockstep and replica.pending else dp.next_step_time(replica.pending)
        if t is None:
            replica.scheduled = bool(replica.pending)
            if not replica.scheduled:
                self._maybe_close(replica)
            return
        replica.scheduled = True
        replica.timer = loop.call_at(max(t, loop.time()), self._step_ranks, replica)

    def _step_ranks(self, replica: _Replica) -> None:
        replica.timer = None
        loop = self.loop
        for rank, result in replica.dp.step(loop.time(), replica.pending):
            self.steps += 1
            if result.first_token or result.finished:
                replica.pending.add(rank)
                loop.call_at(result.end, self._deliver, replica, result, rank)
        self._schedule_ranks(replica)

    def _publish_later(self, replica: _Replica) -> None:
        """Arm the coordinator's next publication (the counts as they are now)."""
        if replica.publisher is not None:
            replica.publisher.cancel()
        t = replica.dp.next_publication()
        replica.publisher = None if t is None else self.loop.call_at(t, self._publish, replica)

    def _publish(self, replica: _Replica) -> None:
        replica.publisher = None
        replica.dp.observe(self.loop.time())
        self._publish_later(replica)

    # ---- the control plane --------------------------------------------------------------------
    def request(self, method: str, url: str, body: dict | None = None) -> tuple[int, bytes]:
        parts = urlsplit(url)
        port, path = parts.port or 0, parts.path
        replica = self.replicas.get(port - BASE_PORT)
        if path == "/control/replicas":
            if port != BASE_PORT:
                return _error(404, "/control/replicas is served on the base port", "not_found")
            if method == "POST":
                count = (body or {}).get("replicas")
                if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_REPLICAS:
                    return _error(400, f"replicas must be between 0 and {MAX_REPLICAS}", "invalid_value")
                self.scale(count)
            return _json(200, self.rows())
        if path == "/control/capacity":
            if replica is None:
                return _error(404 if port != BASE_PORT else 503, "no such replica", "replica_not_found")
            if method == "POST":
                try:
                    for core in replica.cores:
                        core.set_capacity((body or {}).get("max_num_seqs"),
                                          (body or {}).get("max_waiting"))
                except CapacityError as exc:
                    return _error(400, str(exc), "invalid_value")
                if replica.dp is not None:
                    self._schedule_ranks(replica)
                elif not replica.scheduled:
                    self._schedule(replica)
            cores = replica.cores
            return _json(200, [{"model": self.model, "max_waiting": cores[0].max_waiting,
                                "max_num_seqs": cores[0].max_num_seqs,
                                "waiting": sum(c.num_waiting for c in cores),
                                "running": sum(c.num_running for c in cores)}])
        if path == "/metrics":
            if replica is None or replica.draining or self.loop.time() < replica.ready_at:
                return 503, b""
            return 200, self.exposition(replica).encode()
        if path == "/v1/models":
            names = [self.model, *self.adapters]
            return _json(200, {"object": "list", "data": [{"id": n, "object": "model"} for n in names]})
        if path == "/v1/load_lora_adapter" and method == "POST":
            name = (body or {}).get("lora_name")
            rank = self._rank((body or {}).get("lora_path"))
            self.adapters[name] = rank
            for r in self.replicas.values():
                for core in r.cores:
                    registry = core.loras or core.enable_lora(self.max_loras)
                    registry.load(name, "", rank)
            return 200, b"ok"
        if path == "/control/faults/replica" and method == "POST":
            fault = (body or {}).get("fault")
            factor = float((body or {}).get("factor", 1.0)) if fault == "slow" else 1.0
            self.slowdown = factor
            for r in self.replicas.values():
                for core in r.cores:
                    core.slowdown = factor
            return _json(200, {"slow_factor": factor})
        if path == "/control/faults" and method == "POST":
            return _json(200, {})
        return _error(404, f"{method} {path}: not served in virtual time", "not_found")

    @staticmethod
    def _rank(path) -> int:
        try:
            with open(f"{path}/adapter_config.json") as f:
                return int(json.load(f).get("r", 16))
        except (OSError, ValueError, TypeError):
            return 16

    def exposition(self, replica: _Replica) -> str:
        cores, labels = replica.cores, f'engine="{replica.index}",model_name="{self.model}"'
        core = cores[0]
        return "".join(f"{name}{{{labels}}} {value}\n" for name, value in (
            ("vllm:num_requests_running", float(sum(c.num_running for c in cores))),
            ("vllm:num_requests_waiting", float(sum(c.num_waiting for c in cores))),
            ("vllm:kv_cache_usage_perc", sum(c.kv_usage() for c in cores) / len(cores)),
            ("vllm:request_success_total", float(replica.success)),
            ("vllm:generation_tokens_total", float(replica.generated)),
            ("vllm:prompt_tokens_total", float(replica.prompted)),
            ("inference_lab_rejections_total", float(replica.refused)),
            ("inference_lab_max_num_seqs", float(core.max_num_seqs)),
            ("inference_lab_max_waiting", float(core.max_waiting))))


class VirtualHttp:
    """The runner's control-plane client (runner.Http's interface) over the lab."""

    def __init__(self, lab: VirtualLab) -> None:
        self.lab = lab

    async def request(self, method: str, url: str, body: dict | None = None,
                      timeout: float = 5.0) -> tuple[int, bytes]:
        return self.lab.request(method, url, body)


class VirtualBackend:
    """What the runner needs of a lab, in virtual time."""

    virtual = True

    def __init__(self, lab: VirtualLab) -> None:
        self.lab = lab
        self.base_url = f"http://virtual:{BASE_PORT}"
        self.http = VirtualHttp(lab)
        self.clock = lab.loop.time

    def timer(self, loop, callback) -> VirtualTimer:
        return VirtualTimer(loop, callback)

    def endpoint(self, url: str) -> VirtualEndpoint:
        return VirtualEndpoint(self.lab, urlsplit(url).port or BASE_PORT)

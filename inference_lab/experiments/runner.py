"""Runs a scenario against a lab: the load (closed-loop users, Poisson arrivals, or a
trace replayed request by request) through a controller, the timeline's actions, a scrape
of the server's queue gauges, and, for a fleet, the routing of each request to a ready
replica, the replica set's changes and an autoscaler; every request becomes one record.

Times: the scenario is written in modelled seconds; with a time scale K the server's
clock runs K times faster than the wall, so the runner waits `at / K` wall seconds for
an action at `at`, and records client-measured durations multiplied by K (modelled
seconds, comparable with the engine's own `inference_lab` timings, which are recorded
beside them). Send delays are recorded in wall milliseconds.

The lab behind it is a backend: `LiveBackend` (a server over HTTP, on the wall clock) or
experiments.virtual's (the same requests answered by a simulated fleet on a simulated
clock). The runner reads the clock, arms timers, sends control requests and opens
connections through it and nothing else, so one scenario runs the same code either way.

Faults: a timeline action's `fault` goes to POST /control/faults/replica (stall, slow,
crash; its seconds divided by K, since the engine times them on the wall) or POST
/control/faults (errors); `clear` and the end of an `errors` fault reset both; the end of
a stall or a slowdown is the engine's own timer (the runner only marks it). A run with
faults clears them all when it ends, so a server given by --url is left as it was found.

A fleet ([fleet] in the scenario): the runner reads GET /control/replicas every
`poll_interval` (and after each scaling) and sends each request to the next ready
replica's port in turn (a Service in front of the pods); with none ready the request is
a 503 that never left the client. New replicas get the scenario's capacity as they
appear. An autoscaler is called every its `interval` with a view of the fleet and of the
metrics a Prometheus scraping each ready replica's /metrics every `metrics_interval`
would hold (plus the front's request counters), and what it asks for is sent as POST
/control/replicas.

A P/D fleet ([fleet] kv_roles): the replicas split by the role each names in GET
/control/replicas (which must be the scenario's P:D), and each request goes through
experiments.pd's router: its prefill to a prefill replica, then the request with the
returned kv_transfer_params to a decode replica; the decode replicas' transfer counters
are read when the run ends.

Knows: HTTP endpoints (/v1/completions, or /v1/embeddings for a pooling load;
/control/capacity, /control/replicas,
/control/faults, /metrics), the scenario, the controller and autoscaler interfaces. Does
not know how the server is started (the CLI does) or how results are summarised.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import random
import re
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from inference_lab.autoscale.metrics import MetricStore, Pod
from inference_lab.common.prometheus_text import model_sums
from inference_lab.engine.drivers.alarm import Timer
from inference_lab.experiments.client import Connection, ConnectionError_, Endpoint, Result, monotonic
from inference_lab.experiments.controllers import Controller, Outcome
from inference_lab.experiments.fleet import FleetSide, Route
from inference_lab.experiments.pd import PdRouter, decode_metrics, ratio_name
from inference_lab.experiments.prompts import Prompt, Prompts
from inference_lab.experiments.records import Records
from inference_lab.experiments.scenario import END, REPLICA_KINDS, Action, Scenario

log = logging.getLogger(__name__)

SCRAPE_INTERVAL = 0.25  # wall seconds between scrapes of the queue gauges (default)
SLOT_RECHECK = 0.1  # modelled seconds: a waiting user re-checks a limit that grew with no release
SHED_PAUSE = 0.01  # modelled seconds: at least this long before a user shed on the client tries again
DRAIN_TIMEOUT = 60.0  # wall seconds the requests still open at the end may take
VIRTUAL_DRAIN_TIMEOUT = 3600.0  # ... virtual seconds, in virtual time (they cost no wall time)
STOP_TIMEOUT = 5.0  # seconds a cancelled background task may take to end
STATUS_UNROUTED = 503  # no replica was ready: the front answered for the fleet
OPEN_LOOP_POOL = 64  # keep-alive connections opened before an open loop starts
STATUS_SHED = 0  # refused by the client's own controller, never sent
STATUS_NO_RESPONSE = -1
READY_WAIT_PD = 60.0  # wall seconds a P/D fleet's replicas may take to be ready
SHED = object()  # _acquire_blocking: the controller refused outright (no slot to wait for)

GAUGES = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "inference_lab_max_num_seqs": "max_num_seqs",
    "inference_lab_max_waiting": "max_waiting",
}


def parse_gauges(text: str, model: str) -> dict[str, float]:
    """The queue gauges of `model` from a Prometheus text exposition, summed over its
    engines (a server of several data-parallel ranks: one sample per `engine`)."""
    return {GAUGES[name]: value for name, value in model_sums(text, GAUGES, model).items()}


class Http:
    """Small control-plane requests (capacity, scrapes): a fresh connection each, so they
    never queue behind the load's keep-alive streams."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token

    async def request(self, method: str, url: str, body: dict | None = None,
                      timeout: float = 5.0) -> tuple[int, bytes]:
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        raw = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {path or '/'} HTTP/1.1", f"Host: {parts.hostname}:{parts.port}",
                "Connection: close", f"Content-Length: {len(raw)}"]
        if body is not None:
            head.append("Content-Type: application/json")
        if self.token:
            head.append(f"Authorization: Bearer {self.token}")

        async def go() -> tuple[int, bytes]:
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
            try:
                writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + raw)
                head_bytes = await reader.readuntil(b"\r\n\r\n")
                status = int(head_bytes[9:12]) if head_bytes.startswith(b"HTTP/1.") else -1
                match = re.search(rb"(?i)content-length:\s*(\d+)", head_bytes)
                body = (await reader.readexactly(int(match.group(1))) if match
                        else await reader.read(-1))
            finally:
                writer.close()
            return status, body

        async with asyncio.timeout(timeout):
            return await go()


class LiveBackend:
    """A served lab: the wall clock, a timerfd, HTTP."""

    virtual = False

    def __init__(self, base_url: str, model: str, api_key: str | None = None,
                 control_token: str | None = None, pooling: bool = False) -> None:
        self.base_url = base_url.rstrip("/")
        self.model, self.api_key, self.pooling = model, api_key, pooling
        self.http = Http(control_token)
        self.clock = monotonic

    def timer(self, loop: asyncio.AbstractEventLoop, callback) -> Timer:
        return Timer(loop, callback)

    def endpoint(self, url: str) -> Endpoint:
        return Endpoint(url, self.model, self.api_key, pooling=self.pooling)


class Runner(FleetSide):
    def __init__(self, scenario: Scenario, base_url: str, controller: Controller, *,
                 time_scale: float = 1.0, metrics_url: str | None = None,
                 api_key: str | None = None, control_token: str | None = None,
                 on_progress: Callable[[str], None] | None = None,
                 adapters: dict[str, str] | None = None, backend=None, autoscaler=None) -> None:
        self.sc = scenario
        self.backend = backend or LiveBackend(base_url, scenario.model, api_key, control_token,
                                              pooling=scenario.workload.pooling)
        self.virtual = self.backend.virtual
        self.clock = self.backend.clock
        self.adapters = adapters or {}  # LoRA adapter name -> path, loaded when not served
        self.base = self.backend.base_url
        self.endpoint = self.backend.endpoint(self.base)
        self.ctl = controller
        self.scaler = autoscaler
        self.rtt_e2e = scenario.rtt not in ("ttft", "per_token")  # the controller's latency sample
        self.k = 1.0 if self.virtual else time_scale
        self.metrics_url = metrics_url
        self.http = self.backend.http
        self.records = Records()
        self.rng = random.Random(scenario.workload.seed)
        self.prompts = Prompts(scenario.workload, text=not self.virtual)
        self._serial = 0  # requests built (each unstructured prompt's unique first token)
        self.users_target = scenario.workload.num_concurrent_users or 0
        self.rate = scenario.workload.arrival_rate or 0.0
        self.schedule = scenario.workload.rate_schedule
        self.trace = scenario.workload.trace() if scenario.workload.arrival_pattern == "trace" else None
        self._trace_i = 0
        self._trace_n = (min(len(self.trace), scenario.workload.num_requests or len(self.trace))
                         if self.trace is not None else 0)
        self.phase = 0
        self.progress = on_progress or (lambda line: None)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.t0 = 0.0
        self.end = 0.0  # clock time the load stops
        self._slot_waiters: list[asyncio.Future] = []
        self._tasks: set[asyncio.Task] = set()
        self._users: list[asyncio.Task] = []
        self._pending = 0  # open-loop requests in flight on pooled connections
        self._drained: asyncio.Future | None = None
        # the fleet: routes to ready replicas, round robin; without one, the base port
        self.fleet = scenario.fleet
        base_route = Route(0, urlsplit(self.base).port or 80, self.endpoint)
        self._routes: dict[int, Route] = {base_route.port: base_route}
        self._ready: list[Route] = [base_route]
        self._rr = 0
        self._configured: set[int] = set()  # replica indices given the scenario's capacity
        self.replicas = 1  # the scale target's replicas (starting and ready) at the last read
        self.pods: list[Pod] = []
        self.desired: int | None = None  # the last scaling asked for
        self.front_requests = 0  # requests the load sent to the fleet
        self.front_unrouted = 0  # ... that found no ready replica
        self.store = MetricStore()
        self._scraped_at = -math.inf  # the nominal instant of the last scrape round stored
        self._scrape_waiters: list[tuple[float, asyncio.Future]] = []
        self.pd: PdRouter | None = None  # a P/D fleet's router (started by _start_pd)

    # ---- clocks ------------------------------------------------------------------------
    def now(self) -> float:
        """Modelled seconds since the start."""
        return (self.clock() - self.t0) * self.k

    def wall_at(self, modelled: float) -> float:
        return self.t0 + modelled / self.k

    async def _sleep_until(self, modelled: float) -> None:
        delay = self.wall_at(modelled) - self.clock()
        if delay > 0:
            await asyncio.sleep(delay)

    # ---- control plane -------------------------------------------------------------------
    async def set_capacity(self, update: dict, url: str | None = None) -> None:
        await self._post("/control/capacity", {"model": self.sc.model, **update}, url)

    async def _post(self, path: str, body: dict, url: str | None = None) -> bytes:
        status, text = await self.http.request("POST", (url or self.base) + path, body)
        if status != 200:
            raise RuntimeError(f"POST {path} {json.dumps(body)} answered {status}: "
                               f"{text[:300].decode('utf-8', 'replace')}")
        return text

    async def load_adapters(self) -> None:
        """The load's LoRA adapters the server does not list yet, loaded on it."""
        if not self.adapters:
            return
        status, body = await self.http.request("GET", self.base + "/v1/models")
        served = {m.get("id") for m in json.loads(body).get("data", [])} if status == 200 else set()
        for name, path in self.adapters.items():
            if name not in served:
                await self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path,
                                                           "base_model_name": self.sc.model})

    async def apply_fault(self, fault: dict) -> None:
        """One fault action (scenario.FAULT_KEYS) as the server's control requests."""
        kind = fault["kind"]
        if kind in REPLICA_KINDS:
            body = {"fault": kind, "seconds": fault.get("seconds", 0.0) / self.k}
            if kind == "slow":
                body["factor"] = fault["factor"]
            if "replica" in fault:
                body["replica"] = fault["replica"]
            await self._post("/control/faults/replica", body)
        elif kind == "errors":
            await self._post("/control/faults", {k: v for k, v in fault.items()
                                                 if k not in ("kind", "seconds")})
        elif kind == "clear":
            await self.clear_faults()
        elif kind == END and fault["of"]["kind"] == "errors":
            await self._post("/control/faults", {"reset": True})
        elif kind == END and fault["of"]["kind"] == "slow" and self.virtual:
            await self._post("/control/faults/replica", {"fault": "clear"})
        # END of a stall or a slowdown: the engine's own timer ended it

    async def clear_faults(self) -> None:
        await self._post("/control/faults/replica", {"fault": "clear"})
        await self._post("/control/faults", {"reset": True})

    async def scrape(self) -> dict[str, float]:
        """The queue gauges from the engine's /metrics, else (none given, or it stopped
        answering: an engine restarted after a crash has a new metrics port) from the
        server's GET /control/capacity; a fleet's: the sums over its replicas."""
        if self.fleet is not None:
            rows = await self.read_replicas()
            return {"waiting": float(sum(r["waiting"] for r in rows)),
                    "running": float(sum(r["running"] for r in rows if not r["starting"]))}
        if self.metrics_url:
            try:
                status, body = await self.http.request("GET", self.metrics_url)
            except (OSError, asyncio.TimeoutError):
                status, body = -1, b""
            if status == 200:
                return parse_gauges(body.decode("utf-8", "replace"), self.sc.model)
        status, body = await self.http.request("GET", self.base + "/control/capacity")
        if status != 200:
            return {}
        out: dict[str, float] = {}
        for row in json.loads(body):  # (a server of data-parallel ranks: a row each, summed)
            if row.get("model") == self.sc.model:
                for k in GAUGES.values():
                    if k in row:
                        out[k] = out.get(k, 0.0) + float(row[k])
        return out

    async def _scraper(self) -> None:
        interval = self.sc.scrape_interval if self.sc.scrape_interval is not None else SCRAPE_INTERVAL * self.k
        tick = 0
        while True:
            gc.freeze()  # the last interval's survivors (records) out of the full passes
            started = self.now()
            try:
                gauges = await self.scrape()
            except (OSError, asyncio.TimeoutError, ValueError) as exc:
                log.debug("scrape failed: %s", exc)
                gauges = {}
            if gauges:
                self.records.server(started, gauges)
            tick += 1
            await self._sleep_until(tick * interval)

    # ---- the controller's slots -------------------------------------------------------------
    def _trace(self, wall: float) -> None:
        self.records.controller(wall, self.ctl.limit, self.ctl.inflight)

    def _wake(self) -> None:
        """Wake as many waiting users as the controller has free slots (at least one; a
        user that finds none waits again). A limit that grows without a release (Envoy's
        time windows) is seen at the waiters' SLOT_RECHECK instead."""
        free, woke = self.ctl.limit - self.ctl.inflight, 0
        while self._slot_waiters and (woke < free or not woke):
            fut = self._slot_waiters.pop(0)
            if not fut.done():
                fut.set_result(None)
                woke += 1

    async def _acquire_blocking(self):
        """A slot for a closed-loop user: wait for a release (or a limit that grew)."""
        while True:
            wall = self.clock()
            ticket = self.ctl.acquire((wall - self.t0) * self.k)
            if ticket is not None:
                self._trace(wall)
                return ticket
            if self.clock() >= self.end:
                return None
            if self.ctl.limit == math.inf:
                return SHED  # refused on the client without a limit to wait under (sre)
            fut = self.loop.create_future()
            self._slot_waiters.append(fut)
            try:
                async with asyncio.timeout(SLOT_RECHECK / self.k):
                    await fut
            except TimeoutError:
                pass

    def _release(self, ticket, result: Result) -> None:
        """The controller's sample from one response (`result.done`: when it ended)."""
        k, status = self.k, result.status
        if status == 200:
            outcome = Outcome.OK
            if self.rtt_e2e or not result.first:
                rtt = (result.done - result.sent) * k
            elif self.sc.rtt == "ttft":
                rtt = (result.first - result.sent) * k
            elif result.completion_tokens > 1:  # per_token
                rtt = (result.done - result.first) * k / (result.completion_tokens - 1)
            else:
                rtt = (result.done - result.sent) * k
        elif status == 529:
            outcome, rtt = Outcome.DROPPED, (result.done - result.sent) * k
        elif status == STATUS_NO_RESPONSE:
            outcome, rtt = Outcome.IGNORED, 0.0
        else:
            outcome, rtt = Outcome.IGNORED, (result.done - result.sent) * k
        self.ctl.release(ticket, (result.done - self.t0) * k, outcome, rtt)
        self.records.controller(result.done, self.ctl.limit, self.ctl.inflight)
        if self._slot_waiters:
            self._wake()

    # ---- one request ------------------------------------------------------------------------
    def _request(self, user: int, endpoint) -> tuple[object, Prompt, int]:
        """The next request of `user` (-1: an open-loop arrival) for `endpoint`: what it
        sends (bytes, or a virtual lab's job), its prompt and its output length."""
        wl, trace = self.sc.workload, self.trace
        if trace is not None:
            i = self._trace_i
            self._trace_i += 1
            output = trace.outputs[i]
            prompt = self.prompts.of_ids(trace.prompt_ids(i, wl.seed) if trace.has_blocks else b"",
                                         trace.inputs[i])
        else:
            input_len = wl.input_len_dist.sample(self.rng)
            output = 0 if wl.pooling else wl.output_len_dist.sample(self.rng)  # (embeddings)
            prompt = self.prompts.next(user, input_len, output)
        self._serial += 1
        return endpoint.build(prompt, output, self._serial), prompt, output

    def _unrouted(self) -> Result:
        now = self.clock()
        self.front_unrouted += 1
        return Result(STATUS_UNROUTED, now, 0.0, now, error="no ready replica")

    async def _one(self, conns: dict, due: float, user: int, ticket) -> Result:
        """Send one request (on the user's connection to the replica it goes to, or a new
        one) and record it."""
        limit, inflight, phase = self.ctl.limit, self.ctl.inflight, self.phase
        route = self._route()
        self.front_requests += 1
        if route is None:
            raw, prompt, output = self._request(user, self.endpoint)
            result = self._unrouted()
        elif self.pd is not None:
            raw, prompt, output = self._request(user, route.endpoint)
            result = await self.pd.send(raw)
        else:
            raw, prompt, output = self._request(user, route.endpoint)
            conn = conns.get(route.port)
            try:
                if conn is None or conn.closed:
                    conn = conns[route.port] = await route.endpoint.connect()
                result = await conn.send(raw)
            except (OSError, ConnectionError_) as exc:
                now = self.clock()
                result = Result(STATUS_NO_RESPONSE, now, 0.0, now, error=str(exc)[:300])
                if conn is not None:
                    conn.close()
                conns.pop(route.port, None)
            if self.fleet is not None:
                result.replica = route.index
        self._release(ticket, result)
        self.records.request(due, user, phase, limit, inflight, prompt, output, result)
        return result

    # ---- load ------------------------------------------------------------------------------
    async def _user(self, i: int) -> None:
        conns: dict = {}
        try:
            while self.clock() < self.end:
                if i >= self.users_target:
                    await asyncio.sleep(0.05 / self.k + 0.001)  # parked by a load change
                    continue
                due = self.clock()
                ticket = await self._acquire_blocking()
                if ticket is None:
                    break
                if ticket is SHED:  # recorded like a refusal, then the user pauses as after one
                    self.records.shed(due, self.phase, self.ctl.limit, self.ctl.inflight)
                    await asyncio.sleep(max(self.sc.retry_after_529, SHED_PAUSE) / self.k)
                    continue
                if i >= self.users_target:  # parked while it waited
                    self.ctl.release(ticket, self.now(), Outcome.IGNORED, 0.0)
                    self._wake()
                    continue
                result = await self._one(conns, due, i, ticket)
                if result.status != 200 and self.sc.retry_after_529 > 0:
                    await asyncio.sleep(self.sc.retry_after_529 / self.k)
        finally:
            for conn in conns.values():
                conn.close()

    def _ensure_users(self) -> None:
        while len(self._users) < self.users_target:
            self._users.append(self.loop.create_task(self._user(len(self._users))))

    async def _open_loop(self) -> None:
        """Open-loop arrivals (Poisson at the current rate or its schedule, or a trace's
        own instants), sent from a timer callback at each one's scheduled instant; its send
        delay counts from there (no coordinated omission: a late wake-up sends every
        arrival already due, each with its own delay). Requests go out on idle keep-alive
        connections to the replica they are routed to (a new one only when all of that
        replica's are busy) and end in the connection's callback: no task, future or
        closure per request."""
        per_route = max(OPEN_LOOP_POOL // max(len(self._ready), 1), 8)
        for route in self._ready:
            conns = await asyncio.gather(*(route.endpoint.connect() for _ in range(per_route)),
                                         return_exceptions=True)
            route.idle.extend(c for c in conns if not isinstance(c, BaseException))
        self._open_ended = self.loop.create_future()
        self._timer = self.backend.timer(self.loop, self._tick)
        self._peak = _peak_rate(self.schedule) if self.schedule is not None else 0.0
        try:
            self._due = self.clock()
            self._schedule()
            await self._open_ended
        finally:
            self._timer.close()

    def _next_due(self) -> float | None:
        """The next arrival's clock time (None: the trace has ended), or the instant to
        look at a zero rate again."""
        k = self.k
        if self.trace is not None:
            i = self._trace_i
            if i >= self._trace_n:
                return None
            self._idle_rate = False
            return self.t0 + self.trace.times[i] / k
        if self.schedule is not None:  # thinning: candidates at the peak rate, kept at rate(t) / peak
            peak, due = self._peak, self._due
            if peak <= 0:
                self._idle_rate = True
                return due + 0.01
            self._idle_rate = False
            while True:
                due += self.rng.expovariate(peak) / k
                if due >= self.end or self.rng.random() * peak <= self.schedule.rate_at((due - self.t0) * k):
                    return due
        if self.rate <= 0:
            self._idle_rate = True
            return self.clock() + 0.01
        self._idle_rate = False
        return self._due + self.rng.expovariate(self.rate) / k

    def _schedule(self) -> None:
        """Arm the timer for the next arrival (or to look at a zero rate again in 10 ms)."""
        due = self._next_due()
        if due is None or due >= self.end:
            if not self._open_ended.done():
                self._open_ended.set_result(None)
            return
        self._due = due
        self._timer.arm(due)

    def _tick(self) -> None:
        now = self.clock()
        while True:
            if not self._idle_rate:
                self._arrive(self._due, now)
            self._schedule()
            if self._due > now or self._open_ended.done():
                return
            now = self.clock()

    def _arrive(self, due: float, now: float) -> None:
        ctl = self.ctl
        ticket = ctl.acquire((now - self.t0) * self.k)
        if ticket is None:
            self.records.shed(due, self.phase, ctl.limit, ctl.inflight)
            if self.trace is not None:
                self._trace_i += 1  # that request of the trace was shed
            return
        limit, inflight = ctl.limit, ctl.inflight
        self.records.controller(now, limit, inflight)
        route = self._route()
        self.front_requests += 1
        if route is None:
            _, prompt, output = self._request(-1, self.endpoint)
            result = self._unrouted()
            self._release(ticket, result)
            self.records.request(due, -1, self.phase, limit, inflight, prompt, output, result)
            return
        raw, prompt, output = self._request(-1, route.endpoint)
        context = (due, ticket, self.phase, limit, inflight, prompt, output, route)
        if self.pd is not None:  # two hops: a task each
            self._pending += 1
            task = self.loop.create_task(self._pd_request(raw, context))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        idle = route.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                self._pending += 1
                conn.start(raw, self._open_done, context)
                return
        self._pending += 1
        task = self.loop.create_task(self._open_request(raw, context))
        self._tasks.add(task)  # all busy: connect
        task.add_done_callback(self._tasks.discard)

    def _open_done(self, conn: Connection, result: Result) -> None:
        due, ticket, phase, limit, inflight, prompt, output, route = conn.ctx
        conn.ctx = None
        if not conn.closed:
            route.idle.append(conn)
        if self.fleet is not None:
            result.replica = route.index
        self._settled(due, ticket, phase, limit, inflight, prompt, output, result)

    def _settled(self, due, ticket, phase, limit, inflight, prompt, output, result: Result) -> None:
        self._pending -= 1
        self._release(ticket, result)
        self.records.request(due, -1, phase, limit, inflight, prompt, output, result)
        if self._pending == 0 and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def _pd_request(self, raw, context: tuple) -> None:
        self._settled(*context[:-1], await self.pd.send(raw))

    async def _start_pd(self) -> None:
        """A P/D fleet: its replicas ready, each with the scenario's capacity, split into
        the prefill and decode pools by the role each names (GET /control/replicas), which
        must be the scenario's P:D."""
        deadline = self.clock() + READY_WAIT_PD
        while True:  # (a replica still starting may have no port yet)
            status, body = await self.http.request("GET", self.base + "/control/replicas")
            rows = [r for r in json.loads(body) if r.get("model") == self.sc.model] if status == 200 else []
            if rows and all(r["ready"] and r.get("port") for r in rows):
                break
            if self.clock() > deadline:
                raise RuntimeError(f"fleet.kv_roles: the replicas at {self.base} were not all ready "
                                   f"after {READY_WAIT_PD:g} s")
            await asyncio.sleep(0.05)
        rows = await self.read_replicas(rows)
        pools: dict[str, list[Route]] = {"kv_producer": [], "kv_consumer": []}
        for r in rows:
            if r["ready"] and r.get("kv_role") in pools:
                pools[r["kv_role"]].append(self._routes[r["port"]])
        want = self.sc.pd
        got = (len(pools["kv_producer"]), len(pools["kv_consumer"]))
        if got != want:
            raise RuntimeError(
                f"fleet.kv_roles = \"{ratio_name(want)}\": the server at {self.base} has "
                f"{got[0]} prefill (kv_producer) and {got[1]} decode (kv_consumer) replicas ready "
                f"(start it with --replicas {sum(want)} --kv-roles {ratio_name(want)})")
        self.pd = PdRouter(pools["kv_producer"], pools["kv_consumer"], self.fleet.pd_policy)
        self.desired = len(rows)

    async def _pd_facts(self) -> dict:
        """The P/D layout and each decode replica's transfer counters, for the records."""
        decode = {}
        for route in self.pd.decode:
            try:
                status, body = await self.http.request("GET", f"{self._url(route)}/metrics")
            except (OSError, asyncio.TimeoutError):
                continue
            if status == 200:
                decode[str(route.index)] = decode_metrics(body.decode("utf-8", "replace"), self.sc.model)
        return {"kv_roles": ratio_name(self.sc.pd), "policy": self.pd.policy,
                "prefill_replicas": [r.index for r in self.pd.prefill],
                "decode_replicas": [r.index for r in self.pd.decode], "decode_metrics": decode}

    async def _open_request(self, raw, context: tuple) -> None:
        """An arrival with every pooled connection of its replica busy: a new connection,
        kept after."""
        route = context[-1]
        try:
            conn = await route.endpoint.connect()
        except OSError as exc:
            now = self.clock()
            self._settled(*context[:-1], Result(STATUS_NO_RESPONSE, now, 0.0, now, error=str(exc)[:300]))
            return
        conn.start(raw, self._open_done, context)

    # ---- the timeline -------------------------------------------------------------------------
    async def _apply(self, action: Action) -> None:
        if action.capacity:
            if self.fleet is not None:
                for route in list(self._routes.values()):
                    if any(p.index == route.index and not p.draining for p in self.pods):
                        await self.set_capacity(action.capacity, self._url(route))
            else:
                await self.set_capacity(action.capacity)
        if action.fault:
            await self.apply_fault(action.fault)
        if action.replicas is not None:
            await self.scale_to(action.replicas, {"action": action.describe()})
        if "num_concurrent_users" in action.load:
            self.users_target = action.load["num_concurrent_users"]
            self._ensure_users()
            self._wake()
        if "arrival_rate" in action.load:
            self.rate = action.load["arrival_rate"]
        self.phase += 1
        kind = "" if not action.fault else "fault_end" if action.fault["kind"] == END else "fault"
        self.records.action(self.now(), action.at, action.describe(), kind)
        self.progress(f"t={action.at:.1f}s: {action.describe()}")

    async def _timeline(self) -> None:
        for action in self.sc.timeline:
            await self._sleep_until(action.at)
            await self._apply(action)

    async def run(self) -> Records:
        self.loop = asyncio.get_running_loop()
        await self.load_adapters()
        if self.sc.pd is not None:
            await self._start_pd()
        elif self.fleet is not None:
            await self._start_fleet()
        else:
            await self.set_capacity({"max_num_seqs": self.sc.max_num_seqs,
                                     "max_waiting": self.sc.max_waiting})
        # Start-up objects (modules, the scenario) and then, at every scrape, the records kept
        # so far go to the collector's permanent generation: a full pass scans only the last
        # 250 ms's objects instead of everything (a 20-45 ms pause at ~7 s into a run; a
        # burst of completions after a stall of the generator throws AIMD's limit out of
        # its band). Unfrozen when the run ends, unless the process had frozen objects of
        # its own before (the collector has one permanent generation: they stay with it).
        thaw = gc.get_freeze_count() == 0
        gc.freeze()
        self.t0 = self.clock()
        self.records.start(time.time(), self.k, self.t0)
        self.records.facts["virtual"] = self.virtual
        self.end = self.wall_at(self.sc.duration)
        self._trace(self.t0)
        background = [self.loop.create_task(self._scraper())]
        if self.fleet is not None:
            self._record_fleet()
            background += [self.loop.create_task(self._watch_fleet()),
                           self.loop.create_task(self._progress_lines())]
            if self.scaler is not None:
                background += [self.loop.create_task(self._prometheus()),
                               self.loop.create_task(self._autoscale())]
        timeline = self.loop.create_task(self._timeline())
        drain = VIRTUAL_DRAIN_TIMEOUT if self.virtual else DRAIN_TIMEOUT
        try:
            if self.sc.workload.arrival_pattern == "closed_loop":
                self._ensure_users()
                await asyncio.sleep(max(0.0, self.end - self.clock()))
                for fut in self._slot_waiters:
                    if not fut.done():
                        fut.set_result(None)
                done, pending = await asyncio.wait(self._users, timeout=drain)
            else:
                await self._open_loop()
                if self._pending:
                    self._drained = self.loop.create_future()
                    try:
                        async with asyncio.timeout(drain):
                            await self._drained
                    except TimeoutError:
                        log.warning("%d requests still open %.0f s after the end: abandoned",
                                    self._pending, drain)
                pending = set(self._tasks)
                if pending:
                    _, pending = await asyncio.wait(pending, timeout=drain)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("%d requests still open %.0f s after the end: cancelled",
                            len(pending), drain)
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            failed = timeline.done() and not timeline.cancelled() and timeline.exception()
            await _stop([timeline, *background], "background tasks")
            if thaw:
                gc.unfreeze()
            for route in self._routes.values():
                for conn in route.idle:
                    conn.close()
            if self.sc.has_faults:
                try:
                    await self.clear_faults()
                except (OSError, RuntimeError, asyncio.TimeoutError) as exc:
                    log.warning("could not clear the faults at the end: %s", exc)
        if failed:
            raise RuntimeError(f"the timeline failed: {failed}")
        if self.pd is not None:
            self.records.facts["pd"] = await self._pd_facts()
        self.records.finish(self.now())
        return self.records




async def _stop(tasks: list[asyncio.Task], what: str) -> None:
    """Cancel `tasks` and wait for them, at most STOP_TIMEOUT: one that swallowed its cancel
    is left behind with a warning instead of holding the run's end for ever."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    done, stuck = await asyncio.wait(tasks, timeout=STOP_TIMEOUT)
    for task in done:
        if not task.cancelled():
            task.exception()  # retrieved: an error at cancel time is not the run's
    if stuck:
        log.warning("%d %s did not stop within %g s of their cancel: left behind",
                    len(stuck), what, STOP_TIMEOUT)


def _peak_rate(schedule) -> float:
    """The highest rate a rate_schedule reaches (for thinning)."""
    if schedule.type == "sine":
        return max(schedule.low, schedule.high)
    if schedule.type == "square":
        return max(schedule.low, schedule.high)
    return max(rate for _, rate in schedule.points)

"""Runs a scenario against a server over HTTP: the load (closed-loop users or Poisson
arrivals) through a controller, the timeline's actions, and a 250 ms scrape of the
server's queue gauges; every request becomes one record.

Times: the scenario is written in modelled seconds; with a time scale K the server's
clock runs K times faster than the wall, so the runner waits `at / K` wall seconds for
an action at `at`, and records client-measured durations multiplied by K (modelled
seconds, comparable with the engine's own `inference_lab` timings, which are recorded
beside them). Send delays are recorded in wall milliseconds.

Faults: a timeline action's `fault` goes to POST /control/faults/replica (stall, slow,
crash; its seconds divided by K, since the engine times them on the wall) or POST
/control/faults (errors); `clear` and the end of an `errors` fault reset both; the end of
a stall or a slowdown is the engine's own timer (the runner only marks it). A run with
faults clears them all when it ends, so a server given by --url is left as it was found.

Knows: HTTP endpoints (/v1/completions, or /v1/embeddings for a pooling load;
/control/capacity, /control/faults, /metrics), the scenario and the controller interface. Does not know how the server is started (the CLI does) or how
results are summarised (summary, report).
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

from inference_lab.engine.drivers.alarm import Timer
from inference_lab.experiments.client import Connection, ConnectionError_, Endpoint, Result, monotonic
from inference_lab.experiments.controllers import Controller, Outcome
from inference_lab.experiments.prompts import Prompt, Prompts
from inference_lab.experiments.records import Records
from inference_lab.experiments.scenario import END, REPLICA_KINDS, Action, Scenario

log = logging.getLogger(__name__)

SCRAPE_INTERVAL = 0.25  # wall seconds between scrapes of the queue gauges
SLOT_RECHECK = 0.1  # modelled seconds: a waiting user re-checks a limit that grew with no release
SHED_PAUSE = 0.01  # modelled seconds: at least this long before a user shed on the client tries again
DRAIN_TIMEOUT = 60.0  # wall seconds the requests still open at the end may take
OPEN_LOOP_POOL = 64  # keep-alive connections opened before an open loop starts
STATUS_SHED = 0  # refused by the client's own controller, never sent
STATUS_NO_RESPONSE = -1
SHED = object()  # _acquire_blocking: the controller refused outright (no slot to wait for)

GAUGES = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "inference_lab_max_num_seqs": "max_num_seqs",
    "inference_lab_max_waiting": "max_waiting",
}


def parse_gauges(text: str, model: str) -> dict[str, float]:
    """The queue gauges of `model` from a Prometheus text exposition."""
    out: dict[str, float] = {}
    label = f'model_name="{model}"'
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, rest = line.partition("{")
        key = GAUGES.get(name)
        if key is None or label not in rest:
            continue
        try:
            out[key] = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            pass
    return out


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

        return await asyncio.wait_for(go(), timeout)


class Runner:
    def __init__(self, scenario: Scenario, base_url: str, controller: Controller, *,
                 time_scale: float = 1.0, metrics_url: str | None = None,
                 api_key: str | None = None, control_token: str | None = None,
                 on_progress: Callable[[str], None] | None = None,
                 adapters: dict[str, str] | None = None) -> None:
        self.sc = scenario
        self.adapters = adapters or {}  # LoRA adapter name -> path, loaded when not served
        self.base = base_url.rstrip("/")
        self.endpoint = Endpoint(self.base, scenario.model, api_key,
                                 pooling=scenario.workload.pooling)
        self.ctl = controller
        self.rtt_e2e = scenario.rtt not in ("ttft", "per_token")  # the controller's latency sample
        self.k = time_scale
        self.metrics_url = metrics_url
        self.http = Http(control_token)
        self.records = Records()
        self.rng = random.Random(scenario.workload.seed)
        self.prompts = Prompts(scenario.workload)
        self._serial = 0  # requests built (each unstructured prompt's unique first token)
        self.users_target = scenario.workload.num_concurrent_users or 0
        self.rate = scenario.workload.arrival_rate or 0.0
        self.phase = 0
        self.progress = on_progress or (lambda line: None)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.t0 = 0.0
        self.end = 0.0  # loop time the load stops
        self._slot_waiters: list[asyncio.Future] = []
        self._tasks: set[asyncio.Task] = set()
        self._idle: list[Connection] = []
        self._users: list[asyncio.Task] = []
        self._pending = 0  # open-loop requests in flight on pooled connections
        self._drained: asyncio.Future | None = None

    # ---- clocks ------------------------------------------------------------------------
    def now(self) -> float:
        """Modelled seconds since the start."""
        return (monotonic() - self.t0) * self.k

    def wall_at(self, modelled: float) -> float:
        return self.t0 + modelled / self.k

    # ---- control plane -------------------------------------------------------------------
    async def set_capacity(self, update: dict) -> None:
        await self._post("/control/capacity", {"model": self.sc.model, **update})

    async def _post(self, path: str, body: dict) -> None:
        status, text = await self.http.request("POST", self.base + path, body)
        if status != 200:
            raise RuntimeError(f"POST {path} {json.dumps(body)} answered {status}: "
                               f"{text[:300].decode('utf-8', 'replace')}")

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
        # END of a stall or a slowdown: the engine's own timer ended it

    async def clear_faults(self) -> None:
        await self._post("/control/faults/replica", {"fault": "clear"})
        await self._post("/control/faults", {"reset": True})

    async def scrape(self) -> dict[str, float]:
        """The queue gauges from the engine's /metrics, else (none given, or it stopped
        answering: an engine restarted after a crash has a new metrics port) from the
        server's GET /control/capacity."""
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
        for row in json.loads(body):
            if row.get("model") == self.sc.model:
                return {k: float(row[k]) for k in GAUGES.values() if k in row}
        return {}

    async def _scraper(self) -> None:
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
            await asyncio.sleep(SCRAPE_INTERVAL)

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
            wall = monotonic()
            ticket = self.ctl.acquire((wall - self.t0) * self.k)
            if ticket is not None:
                self._trace(wall)
                return ticket
            if monotonic() >= self.end:
                return None
            if self.ctl.limit == math.inf:
                return SHED  # refused on the client without a limit to wait under (sre)
            fut = self.loop.create_future()
            self._slot_waiters.append(fut)
            try:
                await asyncio.wait_for(fut, SLOT_RECHECK / self.k)
            except asyncio.TimeoutError:
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
    def _request(self, user: int) -> tuple[bytes, Prompt, int]:
        """The next request of `user` (-1: an open-loop arrival): its bytes, its prompt and
        its output length."""
        wl = self.sc.workload
        input_len = wl.input_len_dist.sample(self.rng)
        output = 0 if wl.pooling else wl.output_len_dist.sample(self.rng)  # (embeddings)
        prompt = self.prompts.next(user, input_len, output)
        self._serial += 1
        if prompt.text is None:
            return self.endpoint.request(prompt.tokens, output, self._serial, prompt.adapter), prompt, output
        return self.endpoint.request_text(prompt.text, output, prompt.adapter), prompt, output

    async def _one(self, conn: Connection | None, due: float, user: int, ticket) -> tuple[Result, Connection | None]:
        """Send one request (on `conn`, or a new connection) and record it."""
        raw, prompt, output = self._request(user)
        limit, inflight, phase = self.ctl.limit, self.ctl.inflight, self.phase
        try:
            if conn is None or conn.closed:
                conn = await self.endpoint.connect()
            result = await conn.send(raw)
        except (OSError, ConnectionError_) as exc:
            now = monotonic()
            result = Result(STATUS_NO_RESPONSE, now, 0.0, now, error=str(exc)[:300])
            if conn is not None:
                conn.close()
            conn = None
        self._release(ticket, result)
        self.records.request(due, user, phase, limit, inflight, prompt, output, result)
        return result, conn

    # ---- load ------------------------------------------------------------------------------
    async def _user(self, i: int) -> None:
        conn: Connection | None = None
        try:
            while monotonic() < self.end:
                if i >= self.users_target:
                    await asyncio.sleep(0.05 / self.k + 0.001)  # parked by a load change
                    continue
                due = monotonic()
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
                result, conn = await self._one(conn, due, i, ticket)
                if result.status != 200 and self.sc.retry_after_529 > 0:
                    await asyncio.sleep(self.sc.retry_after_529 / self.k)
        finally:
            if conn is not None:
                conn.close()

    def _ensure_users(self) -> None:
        while len(self._users) < self.users_target:
            self._users.append(self.loop.create_task(self._user(len(self._users))))

    async def _open_loop(self) -> None:
        """Poisson arrivals at the current rate, sent from a timer callback at each one's
        scheduled instant; its send delay counts from there (no coordinated omission: a
        late wake-up sends every arrival already due, each with its own delay). Requests go
        out on idle keep-alive connections (a new one only when all are busy) and end in
        the connection's callback: no task, future or closure per request."""
        conns = await asyncio.gather(*(self.endpoint.connect() for _ in range(OPEN_LOOP_POOL)),
                                     return_exceptions=True)
        self._idle.extend(c for c in conns if isinstance(c, Connection))
        self._open_ended = self.loop.create_future()
        self._timer = Timer(self.loop, self._tick)
        try:
            self._due = monotonic()
            self._schedule()
            await self._open_ended
        finally:
            self._timer.close()

    def _schedule(self) -> None:
        """Arm the timer for the next arrival (or to look at a zero rate again in 10 ms)."""
        rate = self.rate
        if rate <= 0:
            self._due = monotonic() + 0.01
            self._idle_rate = True
        else:
            self._due += self.rng.expovariate(rate) / self.k
            self._idle_rate = False
        if self._due >= self.end:
            if not self._open_ended.done():
                self._open_ended.set_result(None)
            return
        self._timer.arm(self._due)

    def _tick(self) -> None:
        now = monotonic()
        while True:
            if not self._idle_rate:
                self._arrive(self._due, now)
            self._schedule()
            if self._due > now or self._open_ended.done():
                return
            now = monotonic()

    def _arrive(self, due: float, now: float) -> None:
        ctl = self.ctl
        ticket = ctl.acquire((now - self.t0) * self.k)
        if ticket is None:
            self.records.shed(due, self.phase, ctl.limit, ctl.inflight)
            return
        limit, inflight = ctl.limit, ctl.inflight
        self.records.controller(now, limit, inflight)
        raw, prompt, output = self._request(-1)
        context = (due, ticket, self.phase, limit, inflight, prompt, output)
        idle = self._idle
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
        due, ticket, phase, limit, inflight, prompt, output = conn.ctx
        conn.ctx = None
        if not conn.closed:
            self._idle.append(conn)
        self._settled(due, ticket, phase, limit, inflight, prompt, output, result)

    def _settled(self, due, ticket, phase, limit, inflight, prompt, output, result: Result) -> None:
        self._pending -= 1
        self._release(ticket, result)
        self.records.request(due, -1, phase, limit, inflight, prompt, output, result)
        if self._pending == 0 and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def _open_request(self, raw: bytes, context: tuple) -> None:
        """An arrival with every pooled connection busy: a new connection, kept after."""
        try:
            conn = await self.endpoint.connect()
        except OSError as exc:
            now = monotonic()
            self._settled(*context, Result(STATUS_NO_RESPONSE, now, 0.0, now, error=str(exc)[:300]))
            return
        conn.start(raw, self._open_done, context)

    # ---- the timeline -------------------------------------------------------------------------
    async def _apply(self, action: Action) -> None:
        if action.capacity:
            await self.set_capacity(action.capacity)
        if action.fault:
            await self.apply_fault(action.fault)
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
            delay = self.wall_at(action.at) - monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._apply(action)

    async def run(self) -> Records:
        self.loop = asyncio.get_running_loop()
        await self.load_adapters()
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
        self.t0 = monotonic()
        self.records.start(time.time(), self.k, self.t0)
        self.end = self.wall_at(self.sc.duration)
        self._trace(self.t0)
        scraper = self.loop.create_task(self._scraper())
        timeline = self.loop.create_task(self._timeline())
        try:
            if self.sc.workload.arrival_pattern == "closed_loop":
                self._ensure_users()
                await asyncio.sleep(max(0.0, self.end - monotonic()))
                for fut in self._slot_waiters:
                    if not fut.done():
                        fut.set_result(None)
                done, pending = await asyncio.wait(self._users, timeout=DRAIN_TIMEOUT)
            else:
                await self._open_loop()
                if self._pending:
                    self._drained = self.loop.create_future()
                    try:
                        await asyncio.wait_for(self._drained, DRAIN_TIMEOUT)
                    except asyncio.TimeoutError:
                        log.warning("%d requests still open %.0f s after the end: abandoned",
                                    self._pending, DRAIN_TIMEOUT)
                pending = set(self._tasks)
                if pending:
                    _, pending = await asyncio.wait(pending, timeout=DRAIN_TIMEOUT)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("%d requests still open %.0f s after the end: cancelled",
                            len(pending), DRAIN_TIMEOUT)
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            failed = timeline.done() and not timeline.cancelled() and timeline.exception()
            timeline.cancel()
            scraper.cancel()
            await asyncio.gather(timeline, scraper, return_exceptions=True)
            if thaw:
                gc.unfreeze()
            for conn in self._idle:
                conn.close()
            if self.sc.has_faults:
                try:
                    await self.clear_faults()
                except (OSError, RuntimeError, asyncio.TimeoutError) as exc:
                    log.warning("could not clear the faults at the end: %s", exc)
        if failed:
            raise RuntimeError(f"the timeline failed: {failed}")
        self.records.finish(self.now())
        return self.records

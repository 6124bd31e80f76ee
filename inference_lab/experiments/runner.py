"""Runs a scenario against a lab: the load (closed-loop users, Poisson arrivals, or a
trace replayed request by request) through a controller, the timeline's actions, a scrape
of the server's queue gauges, and, for a fleet, the routing of each request to a ready
replica, the replica set's changes and an autoscaler; every request becomes one record.

Times: the scenario is written in modelled seconds; with a time scale K the server's
clock runs K times faster than the wall, so the runner waits `at / K` wall seconds for
an action at `at`, and records client-measured durations multiplied by K (modelled
seconds, comparable with the engine's own `inference_lab` timings, which are recorded
beside them). Send delays are recorded in wall milliseconds.

The lab behind it is a backend: `LiveBackend` (experiments.live: a server over HTTP, on
the wall clock) or experiments.virtual's (the same requests answered by a simulated fleet
on a simulated clock). The runner reads the clock, arms timers, sends control requests
and opens connections through it and nothing else, so one scenario runs the same code
either way. A run with faults clears them all when it ends, so a server given by --url is
left as it was found.

`Runner` is this module's start-up, clocks, control requests and run, with one part per
concern mixed in, each in its own module:

| part | module |
|---|---|
| the controller's slots, one request, closed-loop users | experiments.load |
| open-loop arrivals on pooled connections | experiments.open_loop |
| the timeline's actions and faults | experiments.timeline |
| the scrape of the queue gauges | experiments.scrape |
| a fleet: routing, the replica set, the metrics and the autoscaler's loop | experiments.fleet |
| a P/D fleet's pools and its decode counters | experiments.pd_fleet (the router: experiments.pd) |

Knows: HTTP endpoints (/v1/completions, or /v1/embeddings for a pooling load;
/control/capacity, /control/replicas, /control/faults, /metrics), the scenario, the
controller and autoscaler interfaces. Does not know how the server is started (the CLI
does) or how results are summarised.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import random
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from inference_lab.autoscale.metrics import MetricStore, Pod
from inference_lab.experiments.controllers import Controller
from inference_lab.experiments.fleet import FleetSide, Route
from inference_lab.experiments.live import Http, LiveBackend
from inference_lab.experiments.load import (SHED, STATUS_NO_RESPONSE, STATUS_SHED, STATUS_UNROUTED,
                                            LoadSide)
from inference_lab.experiments.open_loop import OpenLoopSide
from inference_lab.experiments.pd import PdRouter
from inference_lab.experiments.pd_fleet import PdFleetSide
from inference_lab.experiments.prompts import Prompts
from inference_lab.experiments.records import Records
from inference_lab.experiments.scenario import Scenario
from inference_lab.experiments.scrape import GAUGES, SCRAPE_INTERVAL, ScrapeSide, parse_gauges
from inference_lab.experiments.timeline import TimelineSide

__all__ = ["GAUGES", "Http", "LiveBackend", "Runner", "SCRAPE_INTERVAL", "SHED",
           "STATUS_NO_RESPONSE", "STATUS_SHED", "STATUS_UNROUTED", "parse_gauges"]

log = logging.getLogger(__name__)

DRAIN_TIMEOUT = 60.0  # wall seconds the requests still open at the end may take
VIRTUAL_DRAIN_TIMEOUT = 3600.0  # ... virtual seconds, in virtual time (they cost no wall time)
STOP_TIMEOUT = 5.0  # seconds a cancelled background task may take to end


class Runner(LoadSide, OpenLoopSide, TimelineSide, ScrapeSide, PdFleetSide, FleetSide):
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

    # ---- the run -------------------------------------------------------------------------
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
        # so far go to the collector's permanent generation: a full pass scans only the
        # objects made since the last scrape instead of everything (a full pass over a long
        # run's records stalls the generator, and a burst of completions after a stall
        # throws AIMD's limit out of its band). Unfrozen when the run ends, unless the
        # process had frozen objects of its own before (the collector has one permanent
        # generation: they stay with it).
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

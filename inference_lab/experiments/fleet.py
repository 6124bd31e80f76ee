"""The runner's fleet side (experiments.runner.Runner mixes it in): each request routed
to the next ready replica's port, the replica set read every `poll_interval` (and after
each scaling), the scenario's capacity given to replicas as they appear, a Prometheus
scraping every ready replica's /metrics (and the front's counters) every
`metrics_interval`, and the autoscaler's loop, whose decisions go to POST
/control/replicas. Everything through the runner's backend (its clock, its control client,
its endpoints), so it runs the same served or in virtual time.

Knows: GET/POST /control/replicas, a replica's /metrics, the autoscaler interface
(inference_lab.autoscale). Does not know the load or the controllers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from inference_lab.autoscale.metrics import (FRONT, FRONT_REQUESTS, FRONT_UNROUTED, FleetView, Pod,
                                             parse_exposition)

__all__ = ["FleetSide", "Route"]

log = logging.getLogger("inference_lab.experiments.runner")

PROGRESS_EVERY = 3600.0  # modelled seconds between progress lines of a fleet's run
EPS = 1e-9  # modelled seconds: instants this close are the same one
READY_WAIT = 60.0  # wall seconds more than the start-up delay the initial replicas may take


@dataclass(slots=True, eq=False)
class Route:
    """One replica's port, its endpoint and its idle keep-alive connections."""

    index: int
    port: int
    endpoint: object
    idle: list = field(default_factory=list)


class FleetSide:
    """The fleet's half of the Runner (its attributes are set in Runner.__init__)."""

    async def read_replicas(self, rows: list[dict] | None = None) -> list[dict]:
        """GET /control/replicas (or an answer already in hand): the routes to ready
        replicas, the scale target's count, and the capacity of replicas new to us."""
        if rows is None:
            status, body = await self.http.request("GET", self.base + "/control/replicas")
            if status != 200:
                raise RuntimeError(f"GET /control/replicas answered {status}")
            rows = [r for r in json.loads(body) if r.get("model") == self.sc.model]
        host = urlsplit(self.base).hostname
        scheme_host = f"{urlsplit(self.base).scheme}://{host}"
        ready, pods = [], []
        present = set()
        for r in rows:
            index, port = r["replica"], r["port"]
            present.add(index)
            pods.append(Pod(index, r["ready"], r["starting"], r["draining"]))
            route = self._routes.get(port)
            if route is None or route.index != index:
                route = self._routes[port] = Route(index, port, self.backend.endpoint(f"{scheme_host}:{port}"))
            if r["ready"]:
                ready.append(route)
            if index not in self._configured and not r["draining"]:
                self._configured.add(index)
                await self.set_capacity({"max_num_seqs": self.sc.max_num_seqs,
                                         "max_waiting": self.sc.max_waiting}, f"{scheme_host}:{port}")
        self._configured &= present
        self._ready = ready
        self.pods = pods
        self.replicas = sum(1 for p in pods if not p.draining)
        return rows

    def _record_fleet(self) -> None:
        ready = sum(1 for p in self.pods if p.ready)
        starting = sum(1 for p in self.pods if p.starting)
        draining = sum(1 for p in self.pods if p.draining)
        self.records.fleet(self.now(), self.replicas, ready, starting, draining,
                           self.desired if self.desired is not None else self.replicas)

    async def scale_to(self, replicas: int, why: dict | None = None) -> None:
        before = self.replicas
        text = await self._post("/control/replicas", {"model": self.sc.model, "replicas": replicas})
        self.desired = replicas
        await self.read_replicas([r for r in json.loads(text) if r.get("model") == self.sc.model])
        self.records.scaling(self.now(), before, replicas, max(0, replicas - before), why or {})
        self._record_fleet()

    async def _watch_fleet(self) -> None:
        interval, tick = self.fleet.poll_interval, 0
        while True:
            try:
                await self.read_replicas()
                self._record_fleet()
            except (OSError, asyncio.TimeoutError, ValueError, RuntimeError) as exc:
                log.warning("reading the replica set failed: %s", exc)
            tick += 1
            await self._sleep_until(tick * interval)

    async def _prometheus(self) -> None:
        """Every ready replica's /metrics, and the front's counters, every metrics_interval;
        each round stamped with the instant it was due (as Prometheus stamps a scrape with
        its scheduled time), so the same round has the same time served and virtual."""
        interval, tick = self.fleet.metrics_interval, 0
        while True:
            t = tick * interval
            samples: dict[object, dict[str, float]] = {
                FRONT: {FRONT_REQUESTS: float(self.front_requests), FRONT_UNROUTED: float(self.front_unrouted)}}
            for route in list(self._ready):
                scraped = await self._scrape(route, parse_exposition)
                if scraped is not None:
                    samples[route.index] = scraped
            self.store.scrape_round(t, samples)
            self._scraped(t)
            tick += 1
            await self._sleep_until(tick * interval)

    async def _scrape(self, route, parse):
        """`parse(text, model)` of one replica's /metrics, or None: unreachable, not a 200,
        or an exposition that does not parse (a failed scrape, as Prometheus counts it)."""
        try:
            status, body = await self.http.request("GET", f"{self._url(route)}/metrics")
        except (OSError, asyncio.TimeoutError):
            return None
        if status != 200:
            return None
        try:
            return parse(body.decode("utf-8", "replace"), self.sc.model)
        except ValueError as exc:
            log.warning("replica %d's /metrics does not parse: %s", route.index, exc)
            return None

    def _scraped(self, t: float) -> None:
        self._scraped_at = t
        waiting, self._scrape_waiters = self._scrape_waiters, []
        for due, fut in waiting:
            if due > t + EPS:
                self._scrape_waiters.append((due, fut))
            elif not fut.done():
                fut.set_result(None)

    async def _scrape_seen(self, at: float) -> None:
        """Wait until the scrape round due at or before modelled instant `at` is stored
        (a decision sees the round of its own instant, served as in virtual time); at
        most one metrics_interval, then the decision reads what there is."""
        interval = self.fleet.metrics_interval
        if at < 0:
            return
        due = math.floor(at / interval + EPS) * interval
        if self._scraped_at >= due - EPS:
            return
        fut = asyncio.get_running_loop().create_future()
        self._scrape_waiters.append((due, fut))
        try:
            async with asyncio.timeout(interval / self.k):
                await fut
        except TimeoutError:
            log.debug("the scrape round due at %.1f s was not stored in time", due)

    def _url(self, route: Route) -> str:
        parts = urlsplit(self.base)
        return f"{parts.scheme}://{parts.hostname}:{route.port}"

    async def _autoscale(self) -> None:
        scaler, tick = self.scaler, 0
        max_replicas = self.fleet.max_replicas
        while self.clock() < self.end:  # the run is judged over the load: no scaling after it
            # the sync's scheduled instant is its time (a controller's ticker), served as in
            # virtual time: HTTP delays do not move a stabilization window's edge
            now = tick * scaler.interval
            try:
                await self.read_replicas()
                await self._scrape_seen(now - self.fleet.metrics_delay)
                view = FleetView(now, self.replicas, list(self.pods), self.store, self.sc.model,
                                 self.fleet.metrics_delay)
                desired = scaler.decide(now, view)
                if desired is not None:
                    desired = min(max(int(desired), 0), max_replicas)
                    if desired != self.replicas:
                        await self.scale_to(desired, dict(getattr(scaler, "last", {}) or {}))
            except (OSError, asyncio.TimeoutError, RuntimeError) as exc:
                log.warning("autoscaler step failed: %s", exc)
            tick += 1
            await self._sleep_until(tick * scaler.interval)

    async def _progress_lines(self) -> None:
        tick = 1
        while True:
            await self._sleep_until(tick * PROGRESS_EVERY)
            ready = sum(1 for p in self.pods if p.ready)
            self.progress(f"t={tick * PROGRESS_EVERY:.0f}s: {self.replicas} replicas ({ready} ready), "
                          f"{self.front_requests:,} requests")
            tick += 1

    def _route(self) -> Route | None:
        ready = self._ready
        if not ready:
            return None
        self._rr += 1
        return ready[self._rr % len(ready)]

    async def _start_fleet(self) -> None:
        """The scenario's replicas, ready, each with the scenario's capacity, before the
        load starts (a deployment that is up)."""
        fleet = self.fleet
        await self._post("/control/replicas", {"model": self.sc.model, "replicas": fleet.replicas})
        deadline = self.clock() + READY_WAIT + (0 if self.virtual else 3600 / self.k)
        while True:
            rows = await self.read_replicas()
            if all(r["ready"] for r in rows if not r["draining"]) or self.clock() > deadline:
                break
            await asyncio.sleep(0.05)
        self.desired = fleet.replicas

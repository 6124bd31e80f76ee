"""The gateway's own Prometheus series, cheap enough for a scrape every 50 ms per port.

Knows: HTTP requests by route and status (a counter), their durations by route (a
histogram), the generation requests open in the engine, whether the last scrape got the
engine's series, how many scrapes waited for the engine's copy (read-your-finishes), and
the process's own `process_*` / `python_*` (prometheus-client's collectors, as vLLM's API
server exports them). The counts are plain numbers; their text
is rendered by prometheus-client once per set of label values (a new route or status
renders it again), and a scrape only fills in the numbers (common.exposition). The
process's series are one text for every port of the process, rendered again when it is
older than PROCESS_MAX_AGE_S (listing /proc/self/fd and formatting them is a large share
of what a replica scrape costs the gateway; the ports of a fleet, each scraped often,
share one render).

Does not know: the engine's series (the app puts them in front), routes or HTTP.
"""

from __future__ import annotations

import time

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from inference_lab.common.exposition import Hist, HistLines, Lines, fmt, render, split_families

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
REQUESTS = "inference_lab_gateway_http_requests"
DURATION = "inference_lab_gateway_http_request_duration_seconds"
INFLIGHT = "inference_lab_gateway_inflight_requests"
ENGINE_UP = "inference_lab_gateway_engine_metrics_up"
COPY_WAITS = "inference_lab_gateway_metrics_copy_waits"
PROCESS_MAX_AGE_S = 0.04  # as old as the engine's copy may be (its look interval)


class ProcessText:
    """The process's own series (process_*, python_info, python_gc_*) as text, shared by
    every port of the process and rendered at most once per PROCESS_MAX_AGE_S."""

    def __init__(self, max_age: float = PROCESS_MAX_AGE_S) -> None:
        self.max_age = max_age
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)  # the process's own, as vLLM's API server has
        self._text = b""
        self._at = float("-inf")

    def text(self) -> bytes:
        now = time.monotonic()
        if now - self._at >= self.max_age:
            self._text = generate_latest(self.registry)
            self._at = now
        return self._text


PROCESS = ProcessText()


class GatewayMetrics:
    """One gateway port's series (each replica port has its own)."""

    def __init__(self, inflight: dict) -> None:
        self.inflight = inflight  # the generation requests open in the engine
        self.requests: dict[tuple[str, int], int] = {}  # (route, status) -> count
        self.durations: dict[str, Hist] = {}  # route -> seconds
        self.engine_up = 0
        self.copy_waits = 0  # scrapes whose engine copy had to wait (set by the app)
        self.process = PROCESS  # one per process, shared by its ports
        self._shape: tuple = ()
        self._headers: list[str] = []
        self._fills: list = []

    def observe(self, route: str, status: int, seconds: float) -> None:
        key = (route, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        hist = self.durations.get(route)
        if hist is None:
            hist = self.durations[route] = Hist(LATENCY_BUCKETS)
        hist.observe(seconds)

    def families(self) -> list:
        """The gateway's own families as prometheus-client objects (what it renders)."""
        requests = CounterMetricFamily(REQUESTS, "HTTP requests answered by the gateway, by "
                                       "route and status.", labels=["route", "status"])
        for (route, status), count in self.requests.items():
            requests.add_metric([route, str(status)], count)
        duration = HistogramMetricFamily(DURATION, "Time from request start to the handler's "
                                         "end (whole stream when streaming).", labels=["route"])
        bounds = [fmt(b) for b in LATENCY_BUCKETS] + ["+Inf"]
        for route, hist in self.durations.items():
            counts, total = hist.cumulative()
            duration.add_metric([route], list(zip(bounds, counts)), total)
        inflight = GaugeMetricFamily(INFLIGHT, "Generation requests open in the engine on "
                                     "behalf of HTTP clients.", value=len(self.inflight))
        up = GaugeMetricFamily(ENGINE_UP, "1 when the last /metrics scrape got the engine's "
                               "series, 0 when it could not.", value=self.engine_up)
        waits = CounterMetricFamily(COPY_WAITS, "Scrapes of this replica whose copy of the "
                                    "engine's series had to wait for the push of a request "
                                    "this gateway saw finish.", value=self.copy_waits)
        return [requests, duration, inflight, up, waits]

    def exposition(self) -> bytes:
        """The gateway's own series then the process's, as text."""
        shape = (tuple(self.requests), tuple(self.durations))  # label values seen so far
        if shape != self._shape:
            self._compile(shape)
        requests_lines, durations, rest_lines = self._fills
        parts = [self._headers[0], requests_lines.fill(list(self.requests.values())),
                 self._headers[1], *(lines.render() for lines in durations)]
        rest = (len(self.inflight), self.engine_up, self.copy_waits)
        for header, lines, value in zip(self._headers[2:], rest_lines, rest):
            parts.append(header)
            parts.append(lines.fill((value,)))
        return "".join(parts).encode() + self.process.text()

    def _compile(self, shape: tuple) -> None:
        families = split_families(render(self.families()).decode())
        self._headers = [header for header, _ in families]
        (_, requests), (_, durations), (_, inflight), (_, up), (_, waits) = families
        per_route = len(LATENCY_BUCKETS) + 3  # buckets, +Inf, _count, _sum
        hists = [HistLines(hist, durations[i * per_route:(i + 1) * per_route])
                 for i, hist in enumerate(self.durations.values())]
        self._fills = [Lines(requests), hists, [Lines(inflight), Lines(up), Lines(waits)]]
        self._shape = shape

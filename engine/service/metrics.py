"""The engine's Prometheus metrics: a table of names plus one update point per step.

Names mirror vLLM's `vllm:*` so that tools that scrape vLLM read the simulator
unchanged; the lab's own carry the `inference_lab_` prefix. Everything lives in one
CollectorRegistry per engine (never the global one). Gauges of live state (depth,
running, KV usage, the capacity knobs) are read from the cores at scrape time, so they
are exact at every scrape and cost nothing in between. The pacer calls `on_step` once
per retired step and `on_finished` once per finished request; the service calls
`on_rejected`.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from inference_lab.engine.sim.core import EngineCore, StepResult
from inference_lab.engine.sim.request import FINISH_REASON, Request

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                   0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LAG_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)

# name -> (kind, help, labels). Histograms and counters get their usual suffixes.
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "vllm:num_requests_waiting": ("gauge", "Requests waiting (queued + accepted, not yet scheduled).", ("model_name",)),
    "vllm:num_requests_running": ("gauge", "Requests holding a batch slot.", ("model_name",)),
    "vllm:kv_cache_usage_perc": ("gauge", "Fraction of KV cache blocks in use (0-1).", ("model_name",)),
    "vllm:time_to_first_token_seconds": ("histogram", "Modelled time to first token.", ("model_name",)),
    "vllm:e2e_request_latency_seconds": ("histogram", "Modelled end-to-end request latency.", ("model_name",)),
    "vllm:request_queue_time_seconds": ("histogram", "Modelled time waiting before first scheduled.", ("model_name",)),
    "vllm:prompt_tokens": ("counter", "Prompt tokens of finished requests.", ("model_name",)),
    "vllm:generation_tokens": ("counter", "Tokens generated.", ("model_name",)),
    "vllm:num_preemptions": ("counter", "Recompute preemptions.", ("model_name",)),
    "vllm:request_success": ("counter", "Finished requests by finish reason.", ("model_name", "finished_reason")),
    "inference_lab_max_waiting": ("gauge", "Waiting bound (0 = unbounded).", ("model_name",)),
    "inference_lab_max_num_seqs": ("gauge", "Admission cap on running requests.", ("model_name",)),
    "inference_lab_rejections": ("counter", "Requests refused before admission, by reason.", ("model_name", "reason")),
    "inference_lab_pacing_lag_seconds": ("histogram", "Wall clock minus the instant each pacer wake-up was planned for (a step end or a held update).", ("model_name",)),
    "inference_lab_steps": ("counter", "Engine iterations simulated.", ("model_name",)),
}


# Live gauges: name -> how to read it from a core.
LIVE = {
    "vllm:num_requests_waiting": lambda core: core.num_waiting,
    "vllm:num_requests_running": lambda core: core.num_running,
    "vllm:kv_cache_usage_perc": lambda core: core.kv_usage(),
    "inference_lab_max_waiting": lambda core: core.max_waiting,
    "inference_lab_max_num_seqs": lambda core: core.max_num_seqs,
}


class LiveGauges(Collector):
    def __init__(self, cores: list[EngineCore]) -> None:
        self.cores = cores

    def collect(self):
        for name, read in LIVE.items():
            family = GaugeMetricFamily(name, METRICS[name][1], labels=["model_name"])
            for core in self.cores:
                family.add_metric([core.name], float(read(core)))
            yield family


class EngineMetrics:
    def __init__(self, cores: list[EngineCore], registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.registry.register(LiveGauges(cores))
        self._m = {}
        for name, (kind, doc, labels) in METRICS.items():
            if kind == "gauge":
                continue  # live, see LiveGauges
            if kind == "counter":
                self._m[name] = Counter(name, doc, labels, registry=self.registry)
            else:
                buckets = LAG_BUCKETS if "lag" in name else LATENCY_BUCKETS
                self._m[name] = Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def for_model(self, core: EngineCore) -> "ModelMetrics":
        return ModelMetrics(self._m, core)


class ModelMetrics:
    """The children of every metric for one model, bound once (label lookups are slow)."""

    def __init__(self, metrics: dict, core: EngineCore) -> None:
        name = core.name
        self.core = core
        self._metrics = metrics
        self.ttft = metrics["vllm:time_to_first_token_seconds"].labels(name)
        self.e2e = metrics["vllm:e2e_request_latency_seconds"].labels(name)
        self.queue = metrics["vllm:request_queue_time_seconds"].labels(name)
        self.prompt = metrics["vllm:prompt_tokens"].labels(name)
        self.generation = metrics["vllm:generation_tokens"].labels(name)
        self.preemptions = metrics["vllm:num_preemptions"].labels(name)
        self.lag = metrics["inference_lab_pacing_lag_seconds"].labels(name)
        self.steps = metrics["inference_lab_steps"].labels(name)
        self.success = {reason: metrics["vllm:request_success"].labels(name, reason)
                        for reason in FINISH_REASON.values()}
        self.rejections = {}

    def on_step(self, result: StepResult) -> None:
        self.steps.inc()
        if result.sampled:
            self.generation.inc(result.sampled)
        if result.preempted:
            self.preemptions.inc(len(result.preempted))

    def on_finished(self, req: Request) -> None:
        self.prompt.inc(req.prompt_len)
        self.success[FINISH_REASON[req.status]].inc()
        if req.first_token >= 0:
            self.ttft.observe(req.first_token - req.arrival)
        if req.first_scheduled >= 0:
            self.queue.observe(req.first_scheduled - req.arrival)
        self.e2e.observe(req.finish_time - req.arrival)

    def on_rejected(self, reason: str, count: int = 1) -> None:
        child = self.rejections.get(reason)
        if child is None:
            child = self.rejections[reason] = self._metrics["inference_lab_rejections"].labels(
                self.core.name, reason)
        child.inc(count)

    def on_lag(self, seconds: float) -> None:
        self.lag.observe(seconds if seconds > 0 else 0.0)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> ThreadingHTTPServer:
    """GET /metrics in the classic text format, whatever the Accept header asks.

    prometheus_client's own server negotiates OpenMetrics with Prometheus 2.x, and its
    OpenMetrics output rewrites `vllm:` sample names to `vllm_` (client_python#1177),
    which would break every vLLM-compatible query. The text format keeps the colons.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served here")
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # scrapes are not worth a log line each
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server

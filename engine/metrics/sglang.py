"""The engine's metrics as SGLang names them (`sglang:*`), for a replica whose engine
profile is sglang (engine.sim.profiles).

Knows SGLang's series (sgl-project/sglang, python/sglang/srt/metrics/collector.py at
00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538): the scheduler's gauges, labelled model_name,
engine_type ("unified"), tp_rank, pp_rank and dp_rank (the replica index); the tokenizer's
counters and histograms, labelled model_name, with SGLang's bucket boundaries (TTFT
0.1-400 s, inter-token 0.002-8 s, e2e 0.1-2400 s). `SglangMetrics` keeps those histograms
beside the vllm-named numbers of ModelMetrics, fed at the same update points;
`render_sglang` writes the exposition. The inter-token histogram takes, per step, one
interval per decoding request, as SGLang spreads a streamed chunk over its tokens.

Simplifications, stated: sglang:cache_hit_rate is the prefix cache's hit share since
start (SGLang's is the last prefill batch's), and sglang:gen_throughput is the tokens
generated over the simulated time between two scrapes (SGLang's: between two decode logs).

Does not know: who calls the update points, nor how the text is served.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from inference_lab.common.exposition import Hist, render
from inference_lab.engine.metrics.series import FINISHED_REASON
from inference_lab.engine.metrics.updates import ModelMetrics, Versions
from inference_lab.engine.sim.core import EngineCore, StepResult
from inference_lab.engine.sim.request import Request

TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
       1200, 1800, 2400)
ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
       0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
SCHEDULER_LABELS = ["model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank"]
# name -> help, as SGLang's collector writes them
GAUGES = {
    "sglang:num_running_reqs": "The number of running requests.",
    "sglang:num_used_tokens": "The number of used tokens.",
    "sglang:token_usage": "The token usage.",
    "sglang:gen_throughput": "The generation throughput (token/s).",
    "sglang:num_queue_reqs": "The number of requests in the waiting queue.",
    "sglang:cache_hit_rate": "The prefix cache hit rate.",
    "sglang:max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
    "sglang:new_token_ratio": "The new token ratio.",
}
COUNTERS = {
    "sglang:prompt_tokens": "Number of prefill tokens processed.",
    "sglang:generation_tokens": "Number of generation tokens processed.",
    "sglang:cached_tokens": "Number of cached prompt tokens.",
    "sglang:num_requests": "Number of requests processed.",
    "sglang:num_aborted_requests": "Number of requests aborted.",
}
HISTOGRAMS = {
    "sglang:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "sglang:inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "sglang:e2e_request_latency_seconds": "Histogram of End-to-end request latency in seconds",
}


class SglangMetrics(ModelMetrics):
    """One sglang replica's numbers: ModelMetrics' plus SGLang's histograms."""

    def __init__(self, core: EngineCore, engine_index: int = 0,
                 versions: Versions | None = None) -> None:
        super().__init__(core, engine_index, versions)
        self.sglang = {"sglang:time_to_first_token_seconds": Hist(TTFT),
                       "sglang:inter_token_latency_seconds": Hist(ITL),
                       "sglang:e2e_request_latency_seconds": Hist(E2E)}
        self.requests = self.aborted = 0.0
        self._last = (0.0, 0.0)  # (generation tokens, simulated clock) at the last scrape
        self.throughput = 0.0

    def on_step(self, result: StepResult) -> None:
        ttft = self.sglang["sglang:time_to_first_token_seconds"]
        for req in result.first_token:
            if not 0 <= req.finish_time < req.first_token:
                ttft.observe(req.first_token - req.arrival)
        if result.num_decodes:
            self.sglang["sglang:inter_token_latency_seconds"].observe(
                result.end - result.start, result.num_decodes)
        super().on_step(result)

    def _observe_finished(self, req: Request, tokens: int, last_token: float) -> None:
        self.sglang["sglang:e2e_request_latency_seconds"].observe(req.finish_time - req.arrival)
        self.requests += 1
        if FINISHED_REASON[req.status] == "abort":
            self.aborted += 1
        super()._observe_finished(req, tokens, last_token)

    def gauges(self) -> dict[str, float]:
        core = self.core
        sched = core.scheduler
        cache = core.prefix_cache
        tokens = self.counters["vllm:generation_tokens"]
        last_tokens, last_clock = self._last
        if core.clock > last_clock:
            self.throughput = (tokens - last_tokens) / (core.clock - last_clock)
            self._last = (tokens, core.clock)
        used = (sched.total_blocks - sched.free_blocks) * sched.block_size
        return {
            "sglang:num_running_reqs": float(core.num_running),
            "sglang:num_used_tokens": float(used),
            "sglang:token_usage": core.kv_usage(),
            "sglang:gen_throughput": self.throughput,
            "sglang:num_queue_reqs": float(core.num_waiting),
            "sglang:cache_hit_rate": (cache.stats.hits / cache.stats.queries
                                      if cache is not None and cache.stats.queries else 0.0),
            "sglang:max_total_num_tokens": float(sched.total_blocks * sched.block_size),
            "sglang:new_token_ratio": float(getattr(sched, "new_token_ratio", 0.0)),
        }

    def counts(self) -> dict[str, float]:
        c = self.counters
        return {"sglang:prompt_tokens": c["vllm:prompt_tokens"],
                "sglang:generation_tokens": c["vllm:generation_tokens"],
                "sglang:cached_tokens": c["vllm:prompt_tokens_cached"],
                "sglang:num_requests": self.requests,
                "sglang:num_aborted_requests": self.aborted}


def render_sglang(models: list[SglangMetrics]) -> bytes:
    """The sglang:* exposition of `models`: gauges per replica (dp_rank), the tokenizer's
    series per model name (summed over its replicas, as one SGLang server's tokenizer
    counts every rank's requests)."""
    gauges = {name: GaugeMetricFamily(name, doc, labels=SCHEDULER_LABELS)
              for name, doc in GAUGES.items()}
    by_model: dict[str, list[SglangMetrics]] = {}
    for m in models:
        labels = [m.core.name, "unified", "0", "0", str(m.engine)]
        for name, value in m.gauges().items():
            gauges[name].add_metric(labels, value)
        by_model.setdefault(m.core.name, []).append(m)
    families = list(gauges.values())
    for name, doc in COUNTERS.items():
        family = CounterMetricFamily(name, doc, labels=["model_name"])
        for model, members in by_model.items():
            family.add_metric([model], sum(m.counts()[name] for m in members))
        families.append(family)
    for name, doc in HISTOGRAMS.items():
        family = HistogramMetricFamily(name, doc, labels=["model_name"])
        for model, members in by_model.items():
            bounds = members[0].sglang[name].bounds
            counts, total = [0] * (len(bounds) + 1), 0.0
            for m in members:
                cumulative, sum_ = m.sglang[name].cumulative()
                counts = [a + b for a, b in zip(counts, cumulative)]
                total += sum_
            edges = [floatToGoString(b) for b in bounds] + ["+Inf"]
            family.add_metric([model], list(zip(edges, counts)), total)
        families.append(family)
    return render(families)


def model_metrics(core: EngineCore, engine_index: int = 0,
                  versions: Versions | None = None) -> ModelMetrics:
    """A replica's metrics as its engine profile names them."""
    if core.profile.metric_prefix == "sglang:":
        return SglangMetrics(core, engine_index, versions)
    return ModelMetrics(core, engine_index, versions)

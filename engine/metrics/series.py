"""The engine's metric series: one table of names, types, help texts and labels, and
what each reads or is fed by.

Names, types, labels and label values are vLLM's (`vllm:*`, labels `model_name` and
`engine`, the replica index; `finished_reason` stop / length / abort / error / repetition),
so tools that scrape vLLM read the simulator unchanged; the lab's own carry the
`inference_lab_` prefix. `LIVE` gauges are read from a core at scrape time; the rest are
fed by the update points (engine.metrics.updates); `OPTIONS` turn the optional series on
per model; `bucket_sets` gives each histogram its boundaries (engine.metrics.buckets).

The table itself is data: series.toml beside this module (read once at import).

Does not know: when a series is updated (engine.metrics.updates), how it is rendered
(engine.metrics.exposition), nor any server.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

from inference_lab.engine.metrics import buckets as B
from inference_lab.engine.sim.request import Status

LAG_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)
# the stream cadence's interval, each control period (0 = every step; engine.drivers.cadence)
INTERVAL_BUCKETS = (0.0, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.006, 0.008, 0.012, 0.016,
                    0.024, 0.032, 0.05)

# vLLM's FinishReason strings, in its order; the lab produces length and abort.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
FINISHED_REASON: dict[Status, str] = {
    Status.FINISHED_LENGTH: "length",
    Status.FINISHED_CANCELLED: "abort",  # a client hang-up or cancellation
    Status.FINISHED_ABORTED: "abort",  # engine shutdown
}
REJECTION_REASONS = ("QUEUE_SATURATED", "INVALID_REQUEST")  # shown from the start, at 0
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "disk")  # vllm:prompt_tokens_cached_by_source's, the lab's
# vLLM's kv_offload_*_size buckets (bytes per transfer job)
OFFLOAD_SIZE_BUCKETS = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")  # by sleep level 0, 1, 2


@dataclass(frozen=True, slots=True)
class Spec:
    kind: str  # "counter" | "gauge" | "histogram"
    doc: str
    labels: tuple[str, ...] = ()  # beyond model_name and engine
    buckets: str = ""  # a key of bucket_sets for histograms
    when: str = ""  # exported only for a model with this option (OPTIONS); "" always


def _load_table() -> dict[str, Spec]:
    text = resources.files(__package__).joinpath("series.toml").read_text(encoding="utf-8")
    return {name: Spec(row["kind"], row["doc"], tuple(row.get("labels", ())),
                       row.get("buckets", ""), row.get("when", ""))
            for name, row in tomllib.loads(text).items()}


# name -> Spec, in the exposition's order (series.toml beside this file: one table of data).
METRICS: dict[str, Spec] = _load_table()
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # labelled like vLLM's: config keys + engine
LORA_INFO = "vllm:lora_requests_info"  # one gauge per model serving LoRA adapters

# Live gauges: name -> how to read it from a core.
LIVE = {
    "vllm:num_requests_running": lambda core: core.num_running,
    "vllm:num_requests_waiting": lambda core: core.num_waiting,
    # (with num_waiting, what its two samples are: ModelMetrics.samples)
    "vllm:num_requests_waiting_by_reason": lambda core: core.num_deferred,
    "vllm:kv_cache_usage_perc": lambda core: core.kv_usage(),
    "inference_lab_max_waiting": lambda core: core.max_waiting,
    "inference_lab_max_num_seqs": lambda core: core.max_num_seqs,
    # counters the core keeps itself (the prefix cache's, in tokens)
    "vllm:prefix_cache_queries": lambda core: core.prefix_cache.stats.queries if core.prefix_cache else 0,
    "vllm:prefix_cache_hits": lambda core: core.prefix_cache.stats.hits if core.prefix_cache else 0,
    # ... and the KV connector's (engine.sim.kv_transfer)
    "vllm:external_prefix_cache_queries": lambda core: core.transfers.external_queries,
    "vllm:external_prefix_cache_hits": lambda core: core.transfers.external_hits,
    "inference_lab_kv_transfer_pending_blocks": lambda core: core.handoffs.held_blocks,
    "inference_lab_kv_transfer_pulled": lambda core: core.transfers.pulled,
    "inference_lab_kv_transfer_expired": lambda core: core.transfers.expired,
    "inference_lab_kv_transfer_recomputed": lambda core: core.transfers.recomputed,
}
# KV offloading's numbers (engine.sim.offload), read from a core that has it at scrape
# time; they move only in steps, so the model's version keys them (not read for a cache key).
OFFLOAD_LIVE = {
    "vllm:kv_offload_load_bytes": lambda core: core.offload.stats.load_bytes,
    "vllm:kv_offload_store_bytes": lambda core: core.offload.stats.store_bytes,
    "vllm:kv_offload_load_time": lambda core: core.offload.stats.load_time,
    "vllm:kv_offload_store_time": lambda core: core.offload.stats.store_time,
    "vllm:kv_offload_allocation_failure": lambda core: core.offload.stats.allocation_failures,
    "vllm:kv_offload_cpu_cache_usage_perc": lambda core: core.offload.host.pinned_usage(),
    "inference_lab_kv_offload_host_usage_perc": lambda core: core.offload.host.usage(),
}
# Series fed by a request's finish and by each step (the rest are live or event counters).
FINISH_HISTOGRAMS = {
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "inference": "vllm:request_inference_time_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "prompt": "vllm:request_prompt_tokens",
    "generation": "vllm:request_generation_tokens",
    "max_generation": "vllm:request_max_num_generation_tokens",
    "n": "vllm:request_params_n",
    "max_tokens": "vllm:request_params_max_tokens",
    "kv_computed": "vllm:request_prefill_kv_computed_tokens",
    "preemptions": "vllm:request_num_preemptions",
}
# What turns an optional series on, per model (Spec.when).
OPTIONS = {
    "speculative": lambda core: core.speculative is not None,
    "kv_cache_metrics": lambda core: core.kv_residency is not None,
    "mfu": lambda core: core.mfu_metrics,
    "offload": lambda core: core.offload is not None,
}


def bucket_sets(max_model_len: int) -> dict[str, tuple[float, ...]]:
    return {"ttft": B.TTFT, "per_token": B.PER_TOKEN, "e2e": B.E2E, "phase": B.PHASE,
            "tokens": B.one_two_five(max_model_len), "iteration": B.VLLM_ITERATION_TOKENS,
            "n": B.VLLM_PARAMS_N, "preemptions": B.VLLM_NUM_PREEMPTIONS,
            "kv_residency": B.VLLM_KV_RESIDENCY, "lag": LAG_BUCKETS, "interval": INTERVAL_BUCKETS,
            "offload_size": OFFLOAD_SIZE_BUCKETS}

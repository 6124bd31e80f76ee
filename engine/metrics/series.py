"""The engine's metric series: one table of names, types, help texts and labels, and
what each reads or is fed by.

Names, types, labels and label values are vLLM's (`vllm:*`, labels `model_name` and
`engine`, the replica index; `finished_reason` stop / length / abort / error / repetition),
so tools that scrape vLLM read the simulator unchanged; the lab's own carry the
`inference_lab_` prefix. `LIVE` gauges are read from a core at scrape time; the rest are
fed by the update points (engine.metrics.updates); `OPTIONS` turn the optional series on
per model; `bucket_sets` gives each histogram its boundaries (engine.metrics.buckets).

Does not know: when a series is updated (engine.metrics.updates), how it is rendered
(engine.metrics.exposition), nor any server.
"""

from __future__ import annotations

from dataclasses import dataclass

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
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")  # by sleep level 0, 1, 2


@dataclass(frozen=True, slots=True)
class Spec:
    kind: str  # "counter" | "gauge" | "histogram"
    doc: str
    labels: tuple[str, ...] = ()  # beyond model_name and engine
    buckets: str = ""  # a key of BucketSets for histograms
    when: str = ""  # exported only for a model with this option (OPTIONS); "" always


# name -> Spec. Counters get `_total` in the exposition, histograms their suffixes.
METRICS: dict[str, Spec] = {
    # live state, read at scrape time
    "vllm:num_requests_running": Spec("gauge", "Requests in the running batch."),
    "vllm:num_requests_waiting": Spec("gauge", "Requests waiting to be scheduled."),
    "vllm:num_requests_waiting_by_reason": Spec(
        "gauge", "Number of waiting requests by reason. Reason labels: 'capacity' = waiting "
        "for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
        "budget, KV transfer, blocked status). Sum of all reasons equals "
        "vllm:num_requests_waiting.", ("reason",)),
    "vllm:kv_cache_usage_perc": Spec("gauge", "Fraction of KV cache blocks in use (1 = full)."),
    "vllm:engine_sleep_state": Spec("gauge", "Engine sleep state; awake = 0 means engine is "
                                    "sleeping; awake = 1 means engine is awake; "
                                    "weights_offloaded = 1 means sleep level 1; "
                                    "discard_all = 1 means sleep level 2.", ("sleep_state",)),
    # counters
    "vllm:num_preemptions": Spec("counter", "Recompute preemptions."),
    "vllm:prompt_tokens": Spec("counter", "Prompt tokens of requests whose prefill completed."),
    "vllm:prompt_tokens_by_source": Spec("counter", "Prompt tokens by where their KV came from.",
                                         ("source",)),
    "vllm:prompt_tokens_cached": Spec("counter", "Prompt tokens served from a cache."),
    "vllm:prompt_tokens_recomputed": Spec("counter", "Cached prompt tokens computed again."),
    "vllm:prefix_cache_queries": Spec("counter", "Prefix cache queries, in terms of number of "
                                      "queried tokens."),
    "vllm:prefix_cache_hits": Spec("counter", "Prefix cache hits, in terms of number of cached "
                                   "tokens."),
    "vllm:external_prefix_cache_queries": Spec(
        "counter", "External prefix cache queries from KV connector cross-instance cache "
        "sharing, in terms of number of queried tokens."),
    "vllm:external_prefix_cache_hits": Spec(
        "counter", "External prefix cache hits from KV connector cross-instance cache "
        "sharing, in terms of number of cached tokens."),
    "vllm:generation_tokens": Spec("counter", "Tokens generated."),
    "vllm:request_success": Spec("counter", "Finished requests by finish reason.",
                                 ("finished_reason",)),
    # speculative decoding (vLLM's SpecDecodingProm), for a model with [speculative]
    "vllm:spec_decode_num_drafts": Spec("counter", "Number of spec decoding drafts.",
                                        when="speculative"),
    "vllm:spec_decode_num_draft_tokens": Spec("counter", "Number of draft tokens.",
                                              when="speculative"),
    "vllm:spec_decode_num_accepted_tokens": Spec("counter", "Number of accepted tokens.",
                                                 when="speculative"),
    "vllm:spec_decode_num_accepted_tokens_per_pos": Spec(
        "counter", "Accepted tokens per draft position.", ("position",), when="speculative"),
    # the step's work per GPU by the cost model (vLLM's PerfMetricsProm), with
    # --enable-mfu-metrics
    "vllm:estimated_flops_per_gpu": Spec(
        "counter", "Estimated number of floating point operations per GPU (for Model Flops "
        "Utilization calculations).", when="mfu"),
    "vllm:estimated_read_bytes_per_gpu": Spec(
        "counter", "Estimated number of bytes read from memory per GPU (for Model Flops "
        "Utilization calculations).", when="mfu"),
    "vllm:estimated_write_bytes_per_gpu": Spec(
        "counter", "Estimated number of bytes written to memory per GPU (for Model Flops "
        "Utilization calculations).", when="mfu"),
    # histograms of counts
    "vllm:request_prompt_tokens": Spec("histogram", "Prompt tokens per finished request.",
                                       buckets="tokens"),
    "vllm:request_generation_tokens": Spec("histogram", "Generated tokens per finished request.",
                                           buckets="tokens"),
    "vllm:iteration_tokens_total": Spec("histogram", "Tokens per engine step (prompt tokens of "
                                        "prefills completed in it + tokens generated).",
                                        buckets="iteration"),
    "vllm:request_max_num_generation_tokens": Spec("histogram", "Most tokens generated by one "
                                                   "sequence of a finished request.", buckets="tokens"),
    "vllm:request_params_n": Spec("histogram", "The n parameter of finished requests.",
                                  buckets="n"),
    "vllm:request_params_max_tokens": Spec("histogram", "The max_tokens of finished requests.",
                                           buckets="tokens"),
    "vllm:request_prefill_kv_computed_tokens": Spec("histogram", "Prompt tokens computed (not "
                                                    "cached) per finished request.", buckets="tokens"),
    "vllm:request_num_preemptions": Spec("histogram", "Preemptions per finished request.",
                                         buckets="preemptions"),
    # KV block residency (vLLM's --kv-cache-metrics), sampled blocks, observed at eviction
    "vllm:kv_block_lifetime_seconds": Spec(
        "histogram", "Histogram of KV cache block lifetime from allocation to eviction. "
        "Sampled metrics (controlled by --kv-cache-metrics-sample).",
        buckets="kv_residency", when="kv_cache_metrics"),
    "vllm:kv_block_idle_before_evict_seconds": Spec(
        "histogram", "Histogram of idle time before KV cache block eviction. "
        "Sampled metrics (controlled by --kv-cache-metrics-sample).",
        buckets="kv_residency", when="kv_cache_metrics"),
    "vllm:kv_block_reuse_gap_seconds": Spec(
        "histogram", "Histogram of time gaps between consecutive KV cache block accesses. "
        "Only the most recent accesses are recorded (ring buffer). Sampled metrics "
        "(controlled by --kv-cache-metrics-sample).", buckets="kv_residency",
        when="kv_cache_metrics"),
    # histograms of modelled time
    "vllm:time_to_first_token_seconds": Spec("histogram", "Arrival to the end of the step that "
                                             "sampled the first token.", buckets="ttft"),
    "vllm:inter_token_latency_seconds": Spec("histogram", "Time between successive tokens of a "
                                             "request.", buckets="per_token"),
    "vllm:request_time_per_output_token_seconds": Spec("histogram", "Per request: decode time / "
                                                       "(tokens - 1).", buckets="per_token"),
    "vllm:e2e_request_latency_seconds": Spec("histogram", "Arrival to finish.", buckets="e2e"),
    "vllm:request_queue_time_seconds": Spec("histogram", "Arrival to first scheduled.",
                                            buckets="phase"),
    "vllm:request_inference_time_seconds": Spec("histogram", "First scheduled to last token.",
                                                buckets="phase"),
    "vllm:request_prefill_time_seconds": Spec("histogram", "First scheduled to first token.",
                                              buckets="phase"),
    "vllm:request_decode_time_seconds": Spec("histogram", "First token to last token.",
                                             buckets="phase"),
    # the lab's own
    "inference_lab_max_waiting": Spec("gauge", "Waiting bound (0 = unbounded)."),
    "inference_lab_max_num_seqs": Spec("gauge", "Admission cap on running requests."),
    "inference_lab_rejections": Spec("counter", "Requests refused before admission, by reason.",
                                     ("reason",)),
    "inference_lab_pacing_lag_seconds": Spec("histogram", "Wall clock minus the instant each "
                                             "pacer wake-up was planned for.", buckets="lag"),
    "inference_lab_arrival_booked_late_seconds": Spec(
        "histogram", "Arrivals booked later than the instant they were stamped with (wall "
        "s later): the engine had decided that instant before the arrival reached it (the "
        "host was behind by more than the engine could wait for).", buckets="lag"),
    "inference_lab_steps": Spec("counter", "Engine iterations simulated."),
    "inference_lab_data_parallel_dummy_passes": Spec(
        "counter", "Steps of an MoE model's data-parallel group this rank sat out in a "
        "dummy pass (it had no work; the expert layers step together)."),
    "inference_lab_coalesced_updates": Spec("counter", "Mid-stream token updates held back "
                                            "to go with a later one (a running stream's "
                                            "tokens grouped), per stream and wake-up."),
    "inference_lab_stream_update_interval_seconds": Spec(
        "gauge", "Least wall time between a running stream's token updates now (0 = every "
        "step; set by lateness, or by --max-update-rate)."),
    "inference_lab_stream_cadence_interval_seconds": Spec(
        "histogram", "The stream update interval at the end of each 50 ms control period "
        "of the cadence (wall s; 0 = every step): how long it stayed where.",
        buckets="interval"),
    "inference_lab_stream_cadence_relay_lag_seconds": Spec(
        "histogram", "The gateway's mean lateness over each 50 ms control period of the "
        "cadence (wall s): what the cadence held under its 1 ms target.", buckets="lag"),
    "inference_lab_wake_seconds": Spec(
        "gauge", "Modelled seconds this replica's last wake from sleep mode took to reload "
        "what its sleep freed (weights over the host link); 0 until it first wakes."),
    "inference_lab_kv_transfer_info": Spec(
        "gauge", "This replica's role in prefill/decode disaggregation (vLLM's kv_role) and "
        "the engine id its handoffs carry; value 1.", ("kv_role", "kv_engine_id")),
    "inference_lab_kv_transfer_seconds": Spec(
        "histogram", "Modelled time of each KV pull from a prefill replica, its wait for the "
        "link included (decode side, observed when the request is first scheduled).",
        buckets="phase"),
    "inference_lab_kv_transfer_pending_blocks": Spec(
        "gauge", "KV blocks held for decode replicas to pull (prefill side): counted "
        "against this replica's KV capacity until pulled or freed by the abort timeout."),
    "inference_lab_kv_transfer_pulled": Spec(
        "counter", "Handoffs a decode replica pulled (prefill side)."),
    "inference_lab_kv_transfer_expired": Spec(
        "counter", "Handoffs freed by the abort timeout before any pull (prefill side)."),
    "inference_lab_kv_transfer_recomputed": Spec(
        "counter", "Requests that asked for a remote prefill whose KV was gone (timed out, "
        "pulled already, an unknown engine id): their prompt computed here (decode side)."),
    "inference_lab_relay_lag_seconds": Spec(
        "gauge", "How late the gateway relays this engine's token batches now (wall s): "
        "its own report (SessionActions.relay_lag_s) or the mean time a Session write waits "
        "for it, the larger; over 1 ms for a lasting share of the time, the cadence groups "
        "mid-stream tokens, as few as keep it under 1 ms."),
}
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
}


def bucket_sets(max_model_len: int) -> dict[str, tuple[float, ...]]:
    return {"ttft": B.TTFT, "per_token": B.PER_TOKEN, "e2e": B.E2E, "phase": B.PHASE,
            "tokens": B.one_two_five(max_model_len), "iteration": B.VLLM_ITERATION_TOKENS,
            "n": B.VLLM_PARAMS_N, "preemptions": B.VLLM_NUM_PREEMPTIONS,
            "kv_residency": B.VLLM_KV_RESIDENCY, "lag": LAG_BUCKETS, "interval": INTERVAL_BUCKETS}

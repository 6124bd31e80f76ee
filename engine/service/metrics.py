"""The engine's Prometheus metrics: a table of names, one update point per step and per
finish, and an exposition cheap enough to scrape every 50 ms.

Names, types, labels and label values are vLLM's (`vllm:*`, labels `model_name` and
`engine`, the replica index; `finished_reason` stop / length / abort / error / repetition),
so tools that scrape vLLM read the simulator unchanged; the lab's own carry the
`inference_lab_` prefix. What each series observes, and when, follows vLLM's
`IterationStats` / `FinishedRequestStats` on the modelled timeline (docs/metrics.md):
TTFT and the prompt-token counter when the first token's step ends, one inter-token
observation per decoding request per step, and at every finish, whatever its reason
(length, a client hang-up or cancellation, shutdown): e2e, queue, prefill, decode,
inference, per-request TPOT and the token histograms.

Storage is plain numbers (a list of bucket counts per histogram, `observe(value, n)` in
one bisect), so a step of 256 decodes costs one observation, not 256. Gauges of live
state are read from the cores at scrape time. The exposition: the text of every series
(HELP, TYPE, name and labels) is rendered once by prometheus-client; a scrape only fills
in the numbers with prometheus-client's own float formatting, and a model whose numbers
have not changed since the last scrape is served from cache
(tests/core/test_metrics_exposition.py checks the bytes equal prometheus-client's
`generate_latest` of the same families). Writes happen on the event loop; renders may run
in another thread (the HTTP port's) and read a consistent-enough copy (a histogram's
count is its cumulated copy).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from inference_lab.common.exposition import Hist, HistLines, Lines, render, split_families
from inference_lab.engine.service import metric_buckets as B
from inference_lab.engine.sim.core import EngineCore, StepResult
from inference_lab.engine.sim.request import Request, Status

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


class Versions:
    """The engine's metrics version: one counter that every model's update points bump (and
    EngineMetrics.touch, for live gauges moved elsewhere), so a version orders every change
    of the engine (a replica restarted keeps counting up). A copy rendered at version v shows
    every change counted up to v (WatchMetrics)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class ModelMetrics:
    """One model's numbers and its update points (called by the pacer and the service)."""

    def __init__(self, core: EngineCore, engine_index: int = 0,
                 versions: Versions | None = None) -> None:
        self.core = core
        self.labels = (core.name, str(engine_index))
        on = {option for option, applies in OPTIONS.items() if applies(core)}
        self.names = tuple(name for name, spec in METRICS.items() if not spec.when or spec.when in on)
        self.engine = engine_index  # the `engine` label as a number
        self.versions = versions or Versions()
        self.version = 0  # the engine's version at its last change: unchanged = cached text
        sets = bucket_sets(core.max_model_len)
        self.hists = {name: Hist(sets[spec.buckets])
                      for name, spec in METRICS.items() if spec.kind == "histogram"}
        self.counters = {name: 0.0 for name, spec in METRICS.items()  # and the event gauges
                         if spec.kind != "histogram" and not spec.labels and name not in LIVE}
        self.mfu = "mfu" in on
        self.success = dict.fromkeys(FINISHED_REASONS, 0.0)
        self.rejections = dict.fromkeys(REJECTION_REASONS, 0.0)
        h = self.hists
        self._ttft = h["vllm:time_to_first_token_seconds"]
        self._itl = h["vllm:inter_token_latency_seconds"]
        self._iteration = h["vllm:iteration_tokens_total"]
        self._lag = h["inference_lab_pacing_lag_seconds"]
        self._late = h["inference_lab_arrival_booked_late_seconds"]
        self._cadence_lag = h["inference_lab_stream_cadence_relay_lag_seconds"]
        self._cadence_interval = h["inference_lab_stream_cadence_interval_seconds"]
        self._finish = {key: h[name] for key, name in FINISH_HISTOGRAMS.items()}
        self._transfer = h["inference_lab_kv_transfer_seconds"]
        self.external = 0  # prompt tokens pulled from producers (by source: external_kv_transfer)
        self.sleep_level = 0  # sleep mode: 0 awake, 1 or 2 the level it sleeps at
        spec = core.speculative
        self.accepted_per_pos = [0.0] * (spec.gamma if spec is not None else 0)

    # ---- update points ---------------------------------------------------------------
    def on_step(self, result: StepResult) -> None:
        """A retired step: its tokens, first tokens, inter-token gaps and preemptions."""
        c = self.counters
        c["inference_lab_steps"] += 1
        sampled = result.sampled
        for req in result.finished:
            if req.pooling:  # (the token of a pooling request's prefill is not kept)
                sampled -= 1
        c["vllm:generation_tokens"] += sampled
        if result.preempted:
            c["vllm:num_preemptions"] += len(result.preempted)
        prompt = cached = external = 0
        for req in result.first_token:
            if 0 <= req.finish_time < req.first_token:
                continue  # ended (hung up) before the step that would sample it ended
            if req.index == 0:  # n > 1: one prefill for every sequence of the request
                prompt += req.prompt_len
                cached += req.cached_tokens
                external += req.external_tokens
            self._ttft.observe(req.first_token - req.arrival)
        if prompt:
            c["vllm:prompt_tokens"] += prompt
            c["vllm:prompt_tokens_cached"] += cached
            self.external += external
        for req in result.admitted:
            if req.external_tokens and req.transfer_s:
                self._transfer.observe(req.transfer_s)
        if result.num_decodes:  # every member of the decode group: one token each, whose
            self._itl.observe(result.end - result.start, result.num_decodes)  # previous
            # token came at the end of the previous (back-to-back) step
        self._iteration.observe(prompt + sampled)
        drafts = result.drafts
        if drafts:  # O(gamma): a draft that kept k tokens counts positions 0..k-1
            accepted = result.accepted_per_draft
            c["vllm:spec_decode_num_drafts"] += drafts
            c["vllm:spec_decode_num_draft_tokens"] += result.draft_tokens
            c["vllm:spec_decode_num_accepted_tokens"] += drafts * accepted
            per_pos = self.accepted_per_pos
            for pos in range(accepted):
                per_pos[pos] += drafts
        if self.mfu:  # the cost model's per-GPU terms of the step (O(1) in the batch)
            c["vllm:estimated_flops_per_gpu"] += result.flops
            c["vllm:estimated_read_bytes_per_gpu"] += result.read_bytes
            c["vllm:estimated_write_bytes_per_gpu"] += result.write_bytes
        residency = self.core.kv_residency
        if residency is not None and residency.evicted:  # sampled blocks evicted this step
            h = self.hists
            lifetime, idle = h["vllm:kv_block_lifetime_seconds"], h["vllm:kv_block_idle_before_evict_seconds"]
            reuse = h["vllm:kv_block_reuse_gap_seconds"]
            for life, idle_s, gaps in residency.take():
                lifetime.observe(life)
                idle.observe(idle_s)
                for gap in gaps:
                    reuse.observe(gap)
        self._changed()

    def on_finished(self, req: Request, tokens: int, last_token: float) -> None:
        """Any finish (length, client hang-up or cancellation, shutdown): `tokens` had been
        generated by the end of the last step that ended, the latest at `last_token`
        (sim time; -1 when none)."""
        reason = FINISHED_REASON[req.status]
        if req.pooling:
            tokens = 0  # an embedding or a score generates nothing (vLLM counts none)
        # a request of n > 1 that ended before its siblings were spawned (cancelled while
        # waiting) ends every sequence of it: each counts, as each sequence that ran does
        count = req.n if req.family is None and req.n > 1 else 1
        self.success["stop" if reason == "length" and req.eos else reason] += count
        for _ in range(count):
            self._observe_finished(req, tokens, last_token)
        if req.index == 0:  # once per request, with its n (its siblings finish as well)
            self._finish["n"].observe(req.n)
        self._changed()

    def _observe_finished(self, req: Request, tokens: int, last_token: float) -> None:
        arrival, end = req.arrival, req.finish_time
        scheduled = req.first_scheduled if 0 <= req.first_scheduled <= end else -1.0
        first = req.first_token if tokens and 0 <= req.first_token <= end else -1.0
        f = self._finish
        f["e2e"].observe(end - arrival)
        f["queue"].observe((scheduled if scheduled >= 0 else end) - arrival)
        if scheduled >= 0:
            prefill = (first if first >= 0 else end) - scheduled
            decode = last_token - first if first >= 0 and last_token > first else 0.0
            inference = (last_token if first >= 0 else end) - scheduled
        else:
            prefill = decode = inference = 0.0
        f["prefill"].observe(prefill)
        f["decode"].observe(decode)
        f["inference"].observe(inference)
        f["tpot"].observe(decode / (tokens - 1) if tokens > 1 else 0.0)
        f["prompt"].observe(req.prompt_len)
        f["kv_computed"].observe(req.prompt_len - req.cached_tokens)
        f["generation"].observe(tokens)
        f["max_generation"].observe(tokens)
        f["max_tokens"].observe(req.max_tokens)
        f["preemptions"].observe(req.preemptions)

    def on_rejected(self, reason: str, count: int = 1) -> None:
        self.rejections[reason] = self.rejections.get(reason, 0.0) + count
        self._changed()

    def on_cadence(self, held: int, interval: float) -> None:
        """The pacer held `held` updates back; `interval` is its update interval now."""
        c = self.counters
        c["inference_lab_coalesced_updates"] += held
        c["inference_lab_stream_update_interval_seconds"] = interval
        self._changed()

    def on_cadence_period(self, relay_lag: float, interval: float) -> None:
        """A control period of the cadence ended: the relay's mean lateness over it, and
        the interval it left."""
        self._cadence_lag.observe(relay_lag)
        self._cadence_interval.observe(interval)
        self._changed()

    def on_sleep(self, level: int, wake_seconds: float | None = None) -> None:
        """Sleep mode: the replica sleeps at `level` (0: awake); `wake_seconds` is what a
        wake that just happened took (modelled)."""
        self.sleep_level = level
        if wake_seconds is not None:
            self.counters["inference_lab_wake_seconds"] = wake_seconds
        self._changed()

    def on_dummy_pass(self) -> None:
        """This rank sat its data-parallel group's step out (engine.drivers.lockstep)."""
        self.counters["inference_lab_data_parallel_dummy_passes"] += 1
        self._changed()

    def on_relay(self, seconds: float) -> None:
        """The gateway's lateness as the cadence now sees it."""
        self.counters["inference_lab_relay_lag_seconds"] = seconds
        self._changed()

    def on_lag(self, seconds: float) -> None:
        self._lag.observe(seconds if seconds > 0 else 0.0)
        self._changed()

    def on_late(self, seconds: float) -> None:
        """An arrival booked `seconds` later than its stamp."""
        self._late.observe(seconds)
        self._changed()

    def touch(self) -> None:
        """A live number moved outside the update points (a handoff freed)."""
        self._changed()

    def _changed(self) -> None:
        versions = self.versions
        versions.n += 1
        self.version = versions.n

    # ---- what a scrape reads ---------------------------------------------------------
    def samples(self, name: str) -> list[tuple[tuple[str, ...], object]]:
        """(extra label values, value) of one series; a histogram's value is
        (cumulative counts, sum)."""
        spec = METRICS[name]
        if name == "vllm:num_requests_waiting_by_reason":
            waiting = self.core.num_waiting  # vLLM's reasons, in its order
            deferred = min(self.core.num_deferred, waiting)
            return [(("capacity",), float(waiting - deferred)), (("deferred",), float(deferred))]
        if name in LIVE:
            return [((), float(LIVE[name](self.core)))]
        if spec.kind == "histogram":
            return [((), self.hists[name].cumulative())]
        if name == "vllm:request_success":
            return [((r,), self.success[r]) for r in FINISHED_REASONS]
        if name == "vllm:engine_sleep_state":
            return [((s,), float(level == self.sleep_level)) for level, s in enumerate(SLEEP_STATES)]
        if name == "vllm:prompt_tokens_by_source":
            c = self.counters
            cached = c["vllm:prompt_tokens_cached"]
            by = {"local_compute": c["vllm:prompt_tokens"] - cached,
                  "local_cache_hit": cached - self.external,
                  "external_kv_transfer": float(self.external)}
            return [((s,), by.get(s, 0.0)) for s in PROMPT_SOURCES]
        if name == "inference_lab_kv_transfer_info":
            return [((self.core.kv_role, self.core.kv_identity["remote_engine_id"]), 1.0)]
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            return [((str(pos),), v) for pos, v in enumerate(self.accepted_per_pos)]
        if name == "inference_lab_rejections":
            return [((r,), v) for r, v in sorted(self.rejections.items())]
        return [((), self.counters[name])]

    def shape(self) -> tuple[str, ...]:
        """The label values that come and go (rejection reasons): a new one needs a new
        template."""
        return tuple(sorted(self.rejections))

    def cache_config(self) -> dict[str, str]:
        """vllm:cache_config_info's labels (vLLM's CacheConfig keys the lab knows)."""
        config = self.core.deployment.scheduler
        return {"block_size": str(self.core.block_size), "cache_dtype": "auto",
                "enable_prefix_caching": str(config.enable_prefix_caching),
                "gpu_memory_utilization": str(config.gpu_memory_utilization),
                "num_gpu_blocks": str(self.core.total_blocks), "engine": self.labels[1]}


# ---- exposition --------------------------------------------------------------------------
def families(models: list[ModelMetrics]):
    """The families of `models` as prometheus-client objects (what generate_latest takes)."""
    for name, spec in METRICS.items():
        members = [m for m in models if name in m.names]
        if not members:  # an optional series no model has is not shown (as vLLM)
            continue
        labels = ["model_name", "engine", *spec.labels]
        if spec.kind == "histogram":
            family = HistogramMetricFamily(name, spec.doc, labels=labels)
        elif spec.kind == "counter":
            family = CounterMetricFamily(name, spec.doc, labels=labels)
        else:
            family = GaugeMetricFamily(name, spec.doc, labels=labels)
        for m in members:
            for extra, value in m.samples(name):
                if spec.kind == "histogram":
                    counts, total = value
                    bounds = [floatToGoString(b) for b in m.hists[name].bounds] + ["+Inf"]
                    family.add_metric([*m.labels, *extra], list(zip(bounds, counts)), total)
                else:
                    family.add_metric([*m.labels, *extra], value)
        yield family
    if models:
        info = GaugeMetricFamily(CACHE_CONFIG_INFO, "Cache configuration of each engine.",
                                 labels=list(models[0].cache_config()))
        for m in models:
            info.add_metric(list(m.cache_config().values()), 1.0)
        yield info


class _Collect:
    def __init__(self, models: list[ModelMetrics]) -> None:
        self.models = models

    def collect(self):
        return families(self.models)


class _Template:
    """One model's exposition with its numbers taken out, family by family: rendered once
    by prometheus-client (common.exposition), then filled in per scrape: each histogram's
    lines kept until it changes, the whole model's kept while nothing changed."""

    def __init__(self, model: ModelMetrics) -> None:
        self.model = model
        self.shape = model.shape()
        families = split_families(generate_latest(_Collect([model])).decode())
        self.headers = [header for header, _ in families]  # HELP and TYPE lines per family
        self.names = (*model.names, CACHE_CONFIG_INFO)  # the family of each header
        self.fills: list = []  # per family: HistLines, or (name, Lines) of other samples
        for (_, prefixes), name in zip(families, model.names):
            if METRICS[name].kind == "histogram":
                self.fills.append(HistLines(model.hists[name], prefixes))
            else:
                self.fills.append((name, Lines(prefixes)))
        self.info = "".join(p + "1.0\n" for p in families[-1][1])  # cache_config_info
        self.key: tuple = ()
        self.chunks: list[str] = []

    def render(self) -> list[str]:
        """The sample lines of each family, as text."""
        m = self.model
        key = (m.version, *(read(m.core) for read in LIVE.values()))
        if key == self.key:
            return self.chunks
        chunks = []
        for fill in self.fills:
            if isinstance(fill, HistLines):
                chunks.append(fill.render())
            else:
                name, lines = fill
                chunks.append(lines.fill([value for _, value in m.samples(name)]))
        chunks.append(self.info)
        self.key, self.chunks = key, chunks
        return chunks


LORA_INFO = "vllm:lora_requests_info"


def lora_info(models: list[ModelMetrics]) -> bytes:
    """vLLM's vllm:lora_requests_info for the models serving LoRA adapters: one gauge per
    model whose value is the time of the scrape and whose labels carry the state, as vLLM
    reports it: max_lora, running_lora_adapters and waiting_lora_adapters (names joined
    by commas), plus the lab's model_name and engine."""
    served = [m for m in models if m.core.loras is not None]
    if not served:
        return b""
    family = GaugeMetricFamily(LORA_INFO, "Running stats on lora requests.",
                               labels=["model_name", "engine", "max_lora",
                                       "running_lora_adapters", "waiting_lora_adapters"])
    now = time.time()
    for m in served:
        running, waiting = m.core.lora_adapters_in_use()
        family.add_metric([*m.labels, str(m.core.loras.max_loras), ",".join(running),
                           ",".join(waiting)], now)
    return render([family])


class Exposition:
    """The models' metrics as Prometheus text: all of them, or the ones asked for."""

    def __init__(self, models: list[ModelMetrics]) -> None:
        self.models = models
        self._templates: dict[int, _Template] = {}
        self._lock = threading.Lock()  # renders come from the HTTP thread and the loop's pool

    def render(self, names: list[str] | None = None, engines: list[int] | None = None) -> bytes:
        """The exposition of the models called `names` on the engines (replicas) indexed
        `engines` (None or empty: all), merged family by family."""
        wanted = {str(e) for e in engines or ()}
        chosen = [m for m in list(self.models) if (not names or m.core.name in names)
                  and (not wanted or m.labels[1] in wanted)]
        if not chosen:
            return b""
        with self._lock:
            templates = [self._template(m) for m in chosen]
            rendered = [t.render() for t in templates]
        out = []
        first = templates[0]
        if all(t.names == first.names for t in templates):  # the same families in each
            for i, header in enumerate(first.headers):
                out.append(header)
                out.extend(chunks[i] for chunks in rendered)
        else:  # optional series some models have: each family once, in the table's order
            placed = [dict(zip(t.names, range(len(t.names)))) for t in templates]
            for name in (*METRICS, CACHE_CONFIG_INFO):
                header = None
                for t, where, chunks in zip(templates, placed, rendered):
                    i = where.get(name)
                    if i is not None:
                        if header is None:
                            header = t.headers[i]
                            out.append(header)
                        out.append(chunks[i])
        return "".join(out).encode() + lora_info(chosen)

    def forget(self, model: ModelMetrics) -> None:
        with self._lock:
            if model in self.models:
                self.models.remove(model)
            self._templates.pop(id(model), None)

    def _template(self, model: ModelMetrics) -> _Template:
        template = self._templates.get(id(model))
        if template is None or template.shape != model.shape():
            template = self._templates[id(model)] = _Template(model)
        return template


class EngineMetrics:
    """Every served model's metrics, one ModelMetrics per core."""

    def __init__(self, cores: list[EngineCore] = (), engine_index: int | list[int] = 0) -> None:
        """`engine_index`: the `engine` label, one for every core or one per core (a
        replica index). engine.fleet adds and removes replicas' cores live (for_replica,
        remove); their label is the replica index plus `engine_index` (when an int)."""
        indexes = engine_index if isinstance(engine_index, list) else [engine_index] * len(cores)
        self.offset = engine_index if isinstance(engine_index, int) else 0
        self.versions = Versions()  # shared by every model and replica
        self.models = [ModelMetrics(core, i, self.versions)
                       for core, i in zip(cores, indexes, strict=True)]
        self.exposition = Exposition(self.models)

    def for_model(self, core: EngineCore) -> ModelMetrics:
        return next(m for m in self.models if m.core is core)

    def for_replica(self, core: EngineCore, replica: int = 0) -> ModelMetrics:
        """A new replica's metrics (engine = offset + replica)."""
        model = ModelMetrics(core, self.offset + replica, self.versions)
        self.models.append(model)
        return model

    def remove(self, model: ModelMetrics) -> None:
        """A closed replica's series leave the exposition."""
        self.exposition.forget(model)

    def has_engines(self, engines: list[int]) -> bool:
        wanted = {str(e) for e in engines}
        return any(m.labels[1] in wanted for m in list(self.models))

    def render(self, names: list[str] | None = None, engines: list[int] | None = None) -> bytes:
        return self.exposition.render(names, engines)

    def touch(self) -> None:
        """A live gauge moved outside the update points (an admission, a capacity or
        replica change): the engine-wide version counts it, so a watch that sees the version
        unchanged knows nothing moved (engine.service.metrics_feed)."""
        self.versions.n += 1

    def replica_keys(self, engines: set[int] | None = None) -> dict[int, tuple]:
        """Per replica (engine label; only `engines` when given), what its exposition
        depends on: the version and live gauges of each of its models. An unchanged key
        renders the same series and values."""
        keys: dict[int, list] = {}
        for m in list(self.models):
            index = m.engine
            if engines is not None and index not in engines:
                continue
            keys.setdefault(index, []).append(
                (id(m), m.version, *(read(m.core) for read in LIVE.values())))
        return {index: tuple(key) for index, key in keys.items()}


# A connection of the metrics endpoint that sends nothing for this long is closed (a
# scrape takes milliseconds; each open connection holds a thread until then).
METRICS_SOCKET_TIMEOUT_S = 5.0


def serve_metrics(metrics: EngineMetrics, host: str, port: int) -> ThreadingHTTPServer:
    """GET /metrics in the classic text format, whatever the Accept header asks.

    prometheus-client's OpenMetrics output rewrites `vllm:` sample names to `vllm_`
    (client_python#1177), which would break every vLLM-compatible query. The text format
    keeps the colons. A connection idle for METRICS_SOCKET_TIMEOUT_S is closed, so idle
    connections cannot pile up threads.
    """

    class Handler(BaseHTTPRequestHandler):
        timeout = METRICS_SOCKET_TIMEOUT_S  # socket timeout of every read and write

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served here")
                return
            body = metrics.render()
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

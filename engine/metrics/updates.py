"""The update points of one replica's metrics: what a retired step, a finish, a
refusal, the cadence, sleep mode and the pacer's lag add to the series of
engine.metrics.series, and what a scrape reads of them (`samples`).

What each series observes, and when, follows vLLM's `IterationStats` /
`FinishedRequestStats` on the modelled timeline (docs/metrics.md): TTFT and the
prompt-token counter when the first token's step ends, one inter-token observation per
decoding request per step, and at every finish, whatever its reason (length, a client
hang-up or cancellation, shutdown): e2e, queue, prefill, decode, inference, per-request
TPOT and the token histograms. Storage is plain numbers (a list of bucket counts per
histogram, `observe(value, n)` in one bisect), so a step of 256 decodes costs one
observation, not 256. Writes happen on the driver's thread; a render may read from
another (a histogram's count is its cumulated copy).

Does not know: who calls the update points (the pacer and the service, or the
virtual-time lab), how the numbers are rendered (engine.metrics.exposition).
"""

from __future__ import annotations

from inference_lab.common.exposition import Hist
from inference_lab.engine.metrics.series import (CACHED_SOURCES, FINISH_HISTOGRAMS, FINISHED_REASON,
                                                 FINISHED_REASONS, LIVE, METRICS, OFFLOAD_LIVE, OPTIONS,
                                                 PROMPT_SOURCES, REJECTION_REASONS,
                                                 SLEEP_STATES, bucket_sets)
from inference_lab.engine.sim.core import EngineCore, StepResult
from inference_lab.engine.sim.request import Request

class Versions:
    """The engine's metrics version: one counter that every model's update points bump (and
    MetricsRegistry.touch, for live gauges moved elsewhere), so a version orders every change
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
                         if spec.kind != "histogram" and not spec.labels and name not in LIVE
                         and name not in OFFLOAD_LIVE}
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
        self.offloaded = [0, 0]  # prompt tokens loaded from the host tier, of which via disk
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
                if req.offload is not None:
                    self.offloaded[0] += req.offload.host_tokens
                    self.offloaded[1] += req.offload.disk_tokens
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
        offload = self.core.offload
        if offload is not None and (offload.stats.load_sizes or offload.stats.store_sizes):
            self._offload_sizes(offload.stats)
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

    def _offload_sizes(self, stats) -> None:
        """The step's transfer jobs, each one observation of its bytes."""
        h = self.hists
        for name, sizes in (("vllm:kv_offload_load_size", stats.load_sizes),
                            ("vllm:kv_offload_store_size", stats.store_sizes)):
            for size in sizes:
                h[name].observe(size)
        stats.load_sizes.clear()
        stats.store_sizes.clear()

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
        if name in OFFLOAD_LIVE:
            return [((), float(OFFLOAD_LIVE[name](self.core)))]
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
        if name == "vllm:prompt_tokens_cached_by_source":  # counted when the first token came
            host, disk = self.offloaded
            device = self.counters["vllm:prompt_tokens_cached"] - self.external
            by = {"device": device, "host": float(host - disk), "disk": float(disk)}
            return [((s,), by[s]) for s in CACHED_SOURCES]
        if name == "vllm:kv_offload_config_info":
            offload = self.core.offload
            return [((str(offload.num_chunks), str(offload.bpc),
                      str(offload.num_chunks * offload.chunk_bytes), str(offload.cpu_tokens)), 1.0)]
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
        labels = {"block_size": str(self.core.block_size), "cache_dtype": "auto",
                  "enable_prefix_caching": str(config.enable_prefix_caching),
                  "gpu_memory_utilization": str(config.gpu_memory_utilization),
                  "num_gpu_blocks": str(self.core.total_blocks)}
        offload = self.core.deployment.offload
        if offload is not None:  # (vLLM's CacheConfig fields; shown only with offloading on)
            labels["kv_offloading_backend"] = offload.backend
            labels["kv_offloading_size"] = str(offload.size_gib)
        labels["engine"] = self.labels[1]
        return labels

"""The offline driver: runs EngineCore against a workload as fast as the CPU allows,
jumping the simulated clock from event to event, and summarises latency and throughput.

Knows workloads (open-loop arrival streams and closed-loop users) and the summary's
shape (compatible with inference-lab's JSON summary). Does not know the wall clock,
except to report how much CPU the run took.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inference_lab.engine.sim.core import EngineCore, QueueSaturated, SubmitError
from inference_lab.engine.sim.specs import Deployment
from inference_lab.common.workload import WorkloadSpec, draw_adapter
from inference_lab.engine.drivers.workload_feed import WorkloadFeed


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of an ascending list."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def distribution(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    mean = sum(ordered) / len(ordered) if ordered else 0.0
    return {
        "min": ordered[0] if ordered else 0.0,
        "mean": mean,
        "p50": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
    }


@dataclass(slots=True)
class RunRecorder:
    """Per-request outcomes of a run, in simulated seconds."""

    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    per_token: list[float] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    total: int = 0
    rejected_saturated: int = 0
    rejected_invalid: int = 0
    first_arrival: float = math.inf
    last_finish: float = 0.0
    # sums over the steps that ran, for inference-lab's `utilization` means
    busy_steps: int = 0
    kv_util: float = 0.0
    flops_util: float = 0.0
    bandwidth_util: float = 0.0

    def arrived(self, now: float) -> None:
        """A request sent at `now` (taken or refused)."""
        self.total += 1
        if now < self.first_arrival:
            self.first_arrival = now

    def finished(self, req) -> None:
        """A request's outcome, at its finish (from any core: the last finish is the
        latest of them)."""
        self.input_tokens += req.prompt_len
        self.output_tokens += 0 if req.pooling else req.max_tokens  # (an embedding: none)
        ttft = req.first_token - req.arrival
        e2e = req.finish_time - req.arrival
        self.ttft.append(ttft)
        self.e2e.append(e2e)
        if req.max_tokens > 1:
            self.per_token.append((e2e - ttft) / (req.max_tokens - 1))
        if req.finish_time > self.last_finish:
            self.last_finish = req.finish_time

    def step(self, core: EngineCore, result) -> None:
        """One step's utilisation: KV blocks in use after it, and the shares of its time
        its FLOPs and its bytes would take at the peak rates (each at most 1)."""
        span = result.end - result.start
        if not result.num_tokens or span <= 0:
            return
        self.busy_steps += 1
        self.kv_util += core.kv_usage()
        self.flops_util += min(result.compute_seconds / span, 1.0)
        self.bandwidth_util += min(result.memory_seconds / span, 1.0)


def prefix_cache(cores: list[EngineCore]) -> dict:
    """Queries and hits in prompt tokens over the cores, as vLLM counts them, and their
    ratio; with KV offloading, the prompt tokens loaded from the host tier (`host_hits`,
    vLLM's cached-by-source host) and, of those, promoted from disk first (`disk_hits`)."""
    caches = [c.prefix_cache for c in cores if c.prefix_cache is not None]
    if not caches:
        return {"enabled": False}
    q = sum(c.stats.queries for c in caches)
    h = sum(c.stats.hits for c in caches)
    out = {"enabled": True, "queries": q, "hits": h, "hit_rate": h / q if q else 0.0}
    offloads = [c.offload.stats for c in cores if c.offload is not None]
    if offloads:
        out["host_hits"] = sum(s.host_tokens for s in offloads)
        out["disk_hits"] = sum(s.disk_tokens for s in offloads)
    return out


def _timing(dep: Deployment) -> dict:
    """The timing model, and for `calibrated` where its parameters come from."""
    if dep.timing != "calibrated" or dep.hardware.calibration is None:
        return {"model": dep.timing}
    cal = dep.hardware.calibration
    out = {"model": dep.timing, "calibration": cal.provenance, "fit": cal.fit}
    if cal.vllm_version:  # the vLLM generation the fit imitates (engine.sim.generations)
        out["vllm_version"] = cal.vllm_version
    return out


def summarise(rec: RunRecorder, core: EngineCore, steps: int, cpu_seconds: float) -> dict:
    span = max(rec.last_finish - (rec.first_arrival if rec.total else 0.0), 1e-12)
    completed = len(rec.e2e)
    busy = rec.busy_steps or 1
    ms = lambda xs: {k: v * 1000.0 for k, v in distribution(xs).items()}  # noqa: E731
    return {
        "model": core.name,
        "hardware": core.deployment.hardware.name,
        "unmodelled": list(core.deployment.unmodelled),
        "timing": _timing(core.deployment),
        "latency_metrics": {
            "ttft_ms": ms(rec.ttft),
            "e2e_ms": ms(rec.e2e),
            "per_token_ms": ms(rec.per_token),
        },
        "throughput_metrics": {
            "input_tokens_per_sec": rec.input_tokens / span,
            "output_tokens_per_sec": rec.output_tokens / span,
            "requests_per_sec": completed / span,
        },
        "utilization": {  # means over the steps that ran, as inference-lab's
            "avg_kv_cache_util": rec.kv_util / busy,
            "avg_flops_util": rec.flops_util / busy,
            "avg_bandwidth_util": rec.bandwidth_util / busy,
        },
        "requests": {
            "completed": completed,
            "total": rec.total,
            "rejected": rec.rejected_invalid,  # inference-lab's name: could never run
            "rejected_queue_saturated": rec.rejected_saturated,
            "rejected_invalid": rec.rejected_invalid,
        },
        "preemptions": {"total": core.scheduler.num_preemptions,
                        "per_request_mean": (core.scheduler.num_preemptions / completed
                                             if completed else 0.0)},
        "prefix_cache": prefix_cache([core]),
        "simulation": {
            "simulated_seconds": span,
            "steps": steps,
            "cpu_seconds": cpu_seconds,
            "output_tokens_per_cpu_second": rec.output_tokens / cpu_seconds if cpu_seconds else 0.0,
        },
    }


def _adapters(core: EngineCore, spec: WorkloadSpec) -> list[tuple[object, float]]:
    """The workload's LoRA adapters registered on the core, with their fractions."""
    if not spec.lora_adapters:
        return []
    loras = core.enable_lora(spec.max_loras)
    return [(loras.load(name, "", spec.lora_rank), f) for name, f in spec.lora_adapters]


def run_offline(deployment: Deployment, spec: WorkloadSpec, *, seed: int | None = None,
                on_progress: Callable[[int, int], None] | None = None,
                slowdown: float = 1.0, tokenizer=None) -> dict:
    """Simulate `spec` on a fresh EngineCore and return the summary dict.
    tokenizer: what turns a dataset's prompts into token IDs (default the built-in one).
    on_progress(completed_or_refused, total) is called every few hundred requests.
    slowdown: every step time x this (a throttled replica, as the `slow` fault)."""
    core = EngineCore(deployment)
    core.slowdown = slowdown
    feed = WorkloadFeed(spec, seed=seed, tokenizer=tokenizer)
    rec = RunRecorder()
    total = spec.num_requests  # None: until duration_secs or the dataset's end
    adapters = _adapters(core, spec)
    pick = random.Random((spec.seed if seed is None else seed) ^ 0x10_7A)  # adapter draws
    done = 0
    report_every = max((total or 0) // 200, 100)
    cpu0 = time.process_time()
    steps = 0

    def submit(now: float, prompt_len: int, output_len: int, key: object, tokens: bytes) -> bool:
        rec.arrived(now)
        try:
            core.submit(prompt_len if not tokens else 0, output_len, now, tag=key,
                        token_ids=tokens, lora=draw_adapter(adapters, pick) if adapters else None)
            return True
        except QueueSaturated:
            rec.rejected_saturated += 1
        except SubmitError:
            rec.rejected_invalid += 1
        return False

    done += feed.start(submit)
    while True:
        t_step = core.next_event_time()
        t_feed = feed.next_time()
        if t_feed is not None and (t_step is None or t_feed <= t_step):
            done += feed.take(submit)
            continue
        if t_step is None:
            break
        result = core.step(t_step)
        steps += 1
        rec.step(core, result)
        for req in result.finished:
            rec.finished(req)
            done += 1
            if on_progress and done % report_every == 0:
                on_progress(done, total or rec.total)
        if feed.closed and result.finished:
            for req in result.finished:
                feed.user_free(req.tag)
            done += feed.users_arrive(result.end, submit)
    cpu = time.process_time() - cpu0
    if on_progress:
        on_progress(done, total or rec.total)
    return summarise(rec, core, steps, cpu)


def admissions(core: EngineCore, arrivals: list[tuple[float, int, int | None]]) -> list[bool]:
    """The modelled engine's answer to these arrivals: (sim time, prompt tokens,
    max_tokens) each, in any order; for each, whether the engine admits it (True) or
    refuses it as saturated (False), booked in arrival order with every step in between,
    as `run_offline` books them. Stops once the last arrival is booked (nothing after it
    can change an answer). A request that can never run counts as refused."""
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i][0])
    admitted = [False] * len(arrivals)
    for i in order:
        t, prompt_len, max_tokens = arrivals[i]
        while (t_step := core.next_event_time()) is not None and t_step < t:
            core.step(t_step)
        try:
            core.submit(prompt_len, max_tokens, t)
            admitted[i] = True
        except (QueueSaturated, SubmitError):
            pass
    return admitted

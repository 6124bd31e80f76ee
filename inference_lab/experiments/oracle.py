"""The oracle: what the engine's own model predicts for each phase of a scenario, from the
offline simulator (inference_lab.engine.drivers.offline), so that a controller's result
can be scored against the best it could have done. No guessing, no fitted constants.

For a phase with capacity (max_num_seqs, max_waiting) and a load:
- The sustainable concurrency c* is the most requests the engine runs at once without
  queueing: min(closed-loop users, max_num_seqs); under an open loop of rate r that the
  engine can carry, the concurrency Little's law gives for it (r x mean e2e), which is
  below max_num_seqs.
- The oracle goodput and latency are those of the offline simulation of that phase's
  deployment at c* (a closed loop of c* users), or, for an open loop the engine can
  carry, of the Poisson load itself at rate r. Queueing beyond c* only adds latency, and
  beyond max_num_seqs + max_waiting it only adds 529s: no controller can do better.

The load's prompt structure (shared prefixes, multi-turn conversations, LoRA adapters) is
the offline run's too: its prompts are built by the same code as the experiment's
(common.conversations), so `cache_hit_rate` predicts the run's cached prompt tokens.

A trace's phase is its own requests of that stretch, replayed offline as they came (the
engine queues what it cannot carry at once: the prediction for that load as it was).

Faults: a `slow` fault in force is simulated (every step time x its factor, as the engine
does); under a stall, after a crash or with injected errors the oracle is the fault-free
prediction, so the score shows what the fault cost (`oracle.fault_modelled` says which).

Data-parallel ranks (`[server] data_parallel_size` D): the phase runs on D ranks of the
deployment behind vLLM's balancer (engine.drivers.data_parallel, an MoE model's ranks in
lockstep), whose sustainable concurrency is min(users, D x max_num_seqs).

Knows the offline driver and the deployment configs. Does not know HTTP or the records.
"""

from __future__ import annotations

from dataclasses import replace

from inference_lab.common.workload import WorkloadSpec
from inference_lab.engine.drivers.data_parallel import run_data_parallel
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.config import default_deployments, load_config_dir
from inference_lab.engine.sim.offload import from_flags
from inference_lab.engine.sim.specs import Deployment
from inference_lab.experiments.scenario import Phase, Scenario

__all__ = ["deployment_for", "phase_oracle", "oracles"]

MIN_REQUESTS = 200
MAX_REQUESTS = 6000
REQUESTS_PER_USER = 25


def deployment_for(scenario: Scenario) -> Deployment:
    deps = (load_config_dir(scenario.config, scenario.hardware) if scenario.config is not None
            else default_deployments(scenario.hardware))
    for dep in deps:
        if dep.name == scenario.model:
            if scenario.kv_offloading_size is not None:  # as serve's --kv-offloading-size
                dep.offload = from_flags(scenario.kv_offloading_size)
            return dep
    raise ValueError(f"{scenario.path}: model {scenario.model!r} is not in the server's config "
                     f"(models: {', '.join(d.name for d in deps)})")


def _with_capacity(dep: Deployment, max_num_seqs: int) -> Deployment:
    # the oracle never queues past c*, so never refuses (max_waiting 0)
    sched = replace(dep.scheduler, max_num_seqs=max_num_seqs, max_waiting=0)
    return replace(dep, scheduler=sched)


def _facts(summary: dict, concurrency: float, kind: str) -> dict:
    lat = summary["latency_metrics"]
    thr = summary["throughput_metrics"]
    return {
        "kind": kind,
        "concurrency": concurrency,
        "goodput_tok_s": thr["output_tokens_per_sec"],
        "requests_per_s": thr["requests_per_sec"],
        "e2e_p50_s": lat["e2e_ms"]["p50"] / 1000.0,
        "e2e_p99_s": lat["e2e_ms"]["p99"] / 1000.0,
        "ttft_p50_s": lat["ttft_ms"]["p50"] / 1000.0,
        "ttft_p99_s": lat["ttft_ms"]["p99"] / 1000.0,
        "e2e_mean_s": lat["e2e_ms"]["mean"] / 1000.0,
        "cache_hit_rate": _cached_rate(summary["prefix_cache"]),  # None: caching off
    }


def _cached_rate(cache: dict) -> float | None:
    """The share of prompt tokens served cached, as a reply's cached_tokens counts them:
    the GPU prefix cache's hits plus, with KV offloading, the host tier's."""
    if "host_hits" not in cache:
        return cache.get("hit_rate")
    return (cache["hits"] + cache["host_hits"]) / cache["queries"] if cache["queries"] else 0.0


def _simulate(dep: Deployment, spec: WorkloadSpec, slowdown: float, ranks: int) -> dict:
    """The offline run of `spec`: on one core, or on `ranks` data-parallel ranks."""
    if ranks > 1:
        return run_data_parallel(dep, spec, ranks, slowdown=slowdown)
    return run_offline(dep, spec, slowdown=slowdown)


def _closed(dep: Deployment, spec: WorkloadSpec, users: int, slowdown: float = 1.0,
            ranks: int = 1) -> dict:
    n = max(MIN_REQUESTS, min(MAX_REQUESTS, users * REQUESTS_PER_USER))
    run = _simulate(dep, replace(spec, arrival_pattern="closed_loop", num_concurrent_users=users,
                                 num_requests=n, arrival_rate=None), slowdown, ranks)
    return _facts(run, users, "closed_loop")


def phase_oracle(dep: Deployment, spec: WorkloadSpec, phase: Phase, ranks: int = 1) -> dict:
    """The phase's oracle on one core, or on `ranks` data-parallel ranks."""
    facts = _phase_oracle(dep, spec, phase, ranks)
    facts["fault"] = phase.fault
    facts["fault_modelled"] = phase.fault_modelled
    return facts


def _trace_oracle(dep: Deployment, spec: WorkloadSpec, phase: Phase, ranks: int) -> dict:
    """A trace's phase: its own requests of that stretch, simulated as they came."""
    start, speed = (spec.trace_window or (0.0, 0.0))[0], spec.trace_speed
    window = (start + phase.start * speed, start + phase.end * speed)
    part = replace(spec, trace_window=window, num_requests=None, duration_secs=None)
    if not len(part.trace()):
        return {"kind": "idle", "concurrency": 0, "goodput_tok_s": 0.0, "requests_per_s": 0.0,
                "e2e_p50_s": 0.0, "e2e_p99_s": 0.0, "ttft_p50_s": 0.0, "ttft_p99_s": 0.0,
                "e2e_mean_s": 0.0, "cache_hit_rate": None}
    run = _simulate(dep, part, phase.slowdown, ranks)
    facts = _facts(run, 0.0, "trace")
    facts["concurrency"] = facts["requests_per_s"] * facts["e2e_mean_s"]  # Little's law
    return facts


def _phase_oracle(dep: Deployment, spec: WorkloadSpec, phase: Phase, ranks: int) -> dict:
    dep = _with_capacity(dep, phase.max_num_seqs)
    slow = phase.slowdown
    seats = phase.max_num_seqs * ranks  # running places over the ranks
    if spec.arrival_pattern == "trace":
        return _trace_oracle(dep, spec, phase, ranks)
    if phase.users is not None and spec.arrival_pattern == "closed_loop":
        if phase.users == 0:
            return {"kind": "idle", "concurrency": 0, "goodput_tok_s": 0.0, "requests_per_s": 0.0,
                    "e2e_p50_s": 0.0, "e2e_p99_s": 0.0, "ttft_p50_s": 0.0, "ttft_p99_s": 0.0,
                    "e2e_mean_s": 0.0, "cache_hit_rate": None}
        return _closed(dep, spec, min(phase.users, seats), slow, ranks)
    saturated = _closed(dep, spec, seats, slow, ranks)
    rate = phase.rate or 0.0
    if rate >= 0.98 * saturated["requests_per_s"]:
        saturated["kind"] = "open_loop_overloaded"
        return saturated
    n = max(MIN_REQUESTS, min(MAX_REQUESTS, int(rate * (phase.end - phase.start) * 2)))
    run = _simulate(dep, replace(spec, arrival_pattern="poisson", arrival_rate=rate,
                                 num_requests=n, num_concurrent_users=None), slow, ranks)
    facts = _facts(run, 0.0, "open_loop")
    facts["concurrency"] = rate * facts["e2e_mean_s"]  # Little's law
    return facts


def oracles(scenario: Scenario) -> list[dict]:
    """One oracle per phase, in order (phases with the same capacity and load share one)."""
    dep = deployment_for(scenario)
    cache: dict[tuple, dict] = {}
    out = []
    for phase in scenario.phases():
        key = (phase.max_num_seqs, phase.users, phase.rate, phase.slowdown, phase.fault)
        if key not in cache:
            cache[key] = phase_oracle(dep, scenario.workload, phase, scenario.data_parallel_size)
        out.append(dict(cache[key]))
    return out

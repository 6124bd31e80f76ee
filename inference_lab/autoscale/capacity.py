"""The lab's capacity model for autoscaling: how many requests per second one replica
serves while meeting a latency SLO, from the offline simulation of the engine itself.

- `Slo`: TTFT and/or end-to-end bounds (modelled seconds) and the attainment wanted: the
  share of requests that must get a 200 within both bounds (a refused request misses).
- `outcomes(deployment, arrivals)`: each arrival's (TTFT, e2e) on one replica, or None
  when the engine refuses it (its waiting queue is full) or it can never run.
- `replica_capacity(deployment, lengths, slo)`: the largest Poisson arrival rate whose
  attainment on one replica is at least `slo.attainment`: the replica's saturated
  throughput (a closed loop at max_num_seqs) if it meets it, else halved until it does,
  then bisected between the two, each candidate simulated for `requests` arrivals (at least `horizon`
  seconds of them) with the load's own request lengths. Deterministic for a seed.

The SLO autoscaler scales on it, and the autoscaling oracle counts the replicas each
window's arrivals need with it. It treats the load as stationary within a window and
ignores prefix sharing (prompts are unrelated here), which makes it a little
conservative for traces whose prompts share prefixes.

Knows the engine's core and offline driver. Does not know HTTP or clocks.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from inference_lab.common.workload import LengthDist, WorkloadSpec
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.core import EngineCore, QueueSaturated, SubmitError
from inference_lab.engine.sim.specs import Deployment

__all__ = ["Slo", "outcomes", "attainment", "replica_capacity", "lengths_of", "saturated_rps",
           "with_capacity", "replicas_needed"]

SAMPLE = 2000  # request lengths drawn from the load
BISECTIONS = 5  # 2^-5 of the bracket [top / 2^k, top / 2^(k-1)]: under 2 % of the rate


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float | None = None
    e2e_s: float | None = None
    attainment: float = 0.99  # share of requests that must meet every bound

    def met(self, ttft: float, e2e: float) -> bool:
        return ((self.ttft_s is None or ttft <= self.ttft_s)
                and (self.e2e_s is None or e2e <= self.e2e_s))


def outcomes(deployment: Deployment, arrivals: list[tuple[float, int, int]]
             ) -> list[tuple[float, float] | None]:
    """(TTFT, e2e) of each (time, prompt tokens, output tokens) arrival on a fresh replica,
    in the order given (arrivals sorted by time), None for a refused one."""
    core = EngineCore(deployment)
    out: list[tuple[float, float] | None] = [None] * len(arrivals)
    i, n = 0, len(arrivals)
    while True:
        t_step = core.next_event_time()
        if i < n and (t_step is None or arrivals[i][0] <= t_step):
            t, prompt, output = arrivals[i]
            try:
                core.submit(prompt, output, t, tag=i)
            except (QueueSaturated, SubmitError):
                pass
            i += 1
            continue
        if t_step is None:
            return out
        for req in core.step(t_step).finished:
            out[req.tag] = (req.first_token - req.arrival, req.finish_time - req.arrival)


def attainment(results: list[tuple[float, float] | None], slo: Slo) -> float:
    if not results:
        return 1.0
    return sum(1 for r in results if r is not None and slo.met(*r)) / len(results)


def lengths_of(spec: WorkloadSpec, seed: int = 0, n: int = SAMPLE) -> tuple[tuple[int, int], ...]:
    """`n` (prompt, output) lengths of the load: drawn from its distributions, or a
    uniform sample of a trace's requests."""
    rng = random.Random(seed ^ 0xCA9AC)
    if spec.arrival_pattern == "trace":
        trace = spec.trace()
        idx = [rng.randrange(len(trace)) for _ in range(n)]
        return tuple((trace.inputs[i], trace.outputs[i]) for i in idx)
    return tuple((spec.input_len_dist.sample(rng), spec.output_len_dist.sample(rng)) for _ in range(n))


def _poisson(rate: float, lengths: tuple[tuple[int, int], ...], horizon: float, seed: int):
    rng = random.Random(seed)
    t, i, out = 0.0, 0, []
    while True:
        t += rng.expovariate(rate)
        if t > horizon:
            return out
        prompt, output = lengths[i % len(lengths)]
        out.append((t, prompt, output))
        i += 1


def saturated_rps(deployment: Deployment, lengths: tuple[tuple[int, int], ...]) -> float:
    """Requests per second of one replica kept full (a closed loop of max_num_seqs users)
    with these lengths."""
    prompt = max(1, round(sum(p for p, _ in lengths) / len(lengths)))
    output = max(1, round(sum(o for _, o in lengths) / len(lengths)))
    users = deployment.scheduler.max_num_seqs
    spec = WorkloadSpec("closed_loop", max(400, min(3000, 4 * users)),
                        LengthDist("fixed", value=prompt), LengthDist("fixed", value=output),
                        num_concurrent_users=users)
    return run_offline(deployment, spec)["throughput_metrics"]["requests_per_sec"]


def replica_capacity(deployment: Deployment, lengths: tuple[tuple[int, int], ...], slo: Slo,
                     requests: int = 1000, horizon: float = 30.0, seed: int = 0) -> float:
    """Requests per second one replica serves at `slo.attainment` (0 when not even a
    lone request meets the SLO)."""
    top = saturated_rps(deployment, lengths)
    lo, hi = 0.0, top

    def ok(rate: float) -> bool:
        arrivals = _poisson(rate, lengths, max(horizon, requests / rate), seed)
        return attainment(outcomes(deployment, arrivals), slo) >= slo.attainment

    if ok(hi):
        return hi
    lo = hi / 2
    while not ok(lo):  # at most a few halvings: a replica that meets the SLO at all does soon
        hi, lo = lo, lo / 2
        if lo < top / 1000:
            return 0.0
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def with_capacity(deployment: Deployment, max_num_seqs: int, max_waiting: int) -> Deployment:
    return replace(deployment, scheduler=replace(deployment.scheduler, max_num_seqs=max_num_seqs,
                                                 max_waiting=max_waiting))


def replicas_needed(rate: float, capacity_rps: float) -> int:
    """The fewest replicas that carry `rate` requests/s at `capacity_rps` each."""
    if rate <= 0:
        return 0
    if capacity_rps <= 0:
        return math.inf
    return math.ceil(rate / capacity_rps - 1e-9)

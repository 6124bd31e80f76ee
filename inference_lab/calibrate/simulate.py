"""One measured benchmark point, and what the simulator says about it.

Knows: a `Point` — a deployment, a closed-loop load (concurrency, request count, prompt
and output lengths, fixed or uniform over [ratio x L, L] as `vllm bench serve
--random-range-ratio` draws them) and the measured metrics — and how to run it through
the offline driver exactly as `inference-lab sim` would, with a given [calibration].
Metrics, in milliseconds: `ttft_ms` / `tpot_ms` / `e2e_ms` are means over requests,
`ttft_p50_ms` / `tpot_p50_ms` medians (a benchmark's TTFT mean carries its opening burst
and queueing tails; its median is the steady state).
Does not know how parameters are searched (calibrate.fitting) nor file formats
(calibrate.measurements).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from inference_lab.common.workload import LengthDist, WorkloadSpec
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.specs import Calibration, Deployment

# metric -> (the offline summary's latency key, its statistic)
METRICS: dict[str, tuple[str, str]] = {
    "ttft_ms": ("ttft_ms", "mean"),
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "tpot_ms": ("per_token_ms", "mean"),
    "tpot_p50_ms": ("per_token_ms", "p50"),
    "e2e_ms": ("e2e_ms", "mean"),
}
DEFAULT_MAX_REQUESTS = 1280  # a point's simulated requests at most (10 x 128 clients)


@dataclass(slots=True)
class Point:
    """A measured closed-loop benchmark point and the deployment that produced it."""

    label: str
    deployment: Deployment
    concurrency: int
    input_len: int
    output_len: int
    measured: dict[str, float]  # METRICS key -> ms
    requests: int = 0  # 0: 10 x concurrency (vllm bench's and InferenceMAX's habit)
    range_ratio: float = 1.0  # lengths uniform over [ratio x L, L]; 1 = fixed
    first_wave: bool = True  # the measured means include the opening burst of clients
    holdout: bool = False  # reported, never fitted
    source: str = ""
    seed: int = 1
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return self.requests or 10 * self.concurrency


def _lengths(length: int, ratio: float) -> LengthDist:
    if ratio >= 1.0:
        return LengthDist("fixed", value=length)
    return LengthDist("uniform", min=max(1, int(length * ratio)), max=length)


def _run(dep: Deployment, point: Point, requests: int) -> dict:
    spec = WorkloadSpec("closed_loop", requests, _lengths(point.input_len, point.range_ratio),
                        _lengths(point.output_len, point.range_ratio),
                        num_concurrent_users=point.concurrency, seed=point.seed)
    return run_offline(dep, spec)["latency_metrics"]


def with_calibration(dep: Deployment, calibration: Calibration | None) -> Deployment:
    """`dep` timed by the roofline (None) or by `calibration`."""
    if calibration is None:
        return replace(dep, timing="roofline")
    return replace(dep, hardware=replace(dep.hardware, calibration=calibration), timing="calibrated")


def simulate(point: Point, calibration: Calibration | None,
             max_requests: int = DEFAULT_MAX_REQUESTS) -> dict[str, float]:
    """The point's metrics as simulated (ms). At most `max_requests` requests run (at
    least 4 x the concurrency). When the measured means leave the opening burst out
    (`first_wave` false) and more than one wave runs, the first wave is also run alone
    and taken out of the TTFT mean (its TTFT is the same in both runs: every first
    token of the first wave comes before the first request ends)."""
    dep = with_calibration(point.deployment, calibration)
    c = point.concurrency
    n = min(point.num_requests, max(max_requests, 4 * c))
    lat = _run(dep, point, n)
    out = {key: lat[name][stat] for key, (name, stat) in METRICS.items() if key in point.measured}
    if "ttft_ms" in out and c > 1 and n > c and not point.first_wave:
        first = _run(dep, point, c)["ttft_ms"]["mean"]
        out["ttft_ms"] = (n * out["ttft_ms"] - c * first) / (n - c)
    return out

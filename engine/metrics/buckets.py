"""Histogram bucket boundaries of the vLLM-compatible series.

Knows vLLM's own boundaries (read from vLLM's `vllm/v1/metrics/loggers.py`,
`PrometheusStatLogger`, current main) and the finer grid the lab adds to them. Every list
here is a superset of vLLM's, so a query written against a real vLLM (`le="0.5"`, ...)
finds the same boundaries.

Why finer: Prometheus' `histogram_quantile` interpolates linearly inside the bucket the
quantile falls in. When every request takes about the same time (as in the lab's
reference experiment), vLLM's boundaries put them all in one wide bucket (requests that
all take 0.3 s fall between 0.25 and 0.5 s, which reads p50 = 375 ms). With boundaries a
ratio r apart, a quantile of such a point mass is off by at most (r - 1) (p99) and
(r - 1) / 2 (p50); FINE_PER_DECADE = 48 gives r = 10^(1/48) = 1.049, so both stay within
5 %. The fine grid spans the range the modelled GPUs produce for each quantity; beyond it
vLLM's own boundaries (and a coarser 12-per-decade grid for the per-phase times) remain.
"""

from __future__ import annotations

import math

# vLLM's boundaries, as its PrometheusStatLogger declares them.
VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
             5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_PER_TOKEN = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # inter-token and per-request TPOT
VLLM_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # e2e, queue, phases
VLLM_ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
VLLM_PARAMS_N = (1, 2, 5, 10, 20)
# vllm/v1/metrics/buckets.py: REQUEST_NUM_PREEMPTIONS_BUCKETS and KV_CACHE_RESIDENCY_BUCKETS
VLLM_NUM_PREEMPTIONS = (1, 2, 3, 4, 5, 10, 20)  # a never-preempted request falls in le="1"
VLLM_KV_RESIDENCY = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20,
                     30, 60, 120, 300, 600, 1200, 1800)  # lifetime, idle, reuse gap (s)

FINE_PER_DECADE = 48  # boundaries 4.9 % apart
COARSE_PER_DECADE = 12  # 21 % apart


def grid(lo: float, hi: float, per_decade: int) -> tuple[float, ...]:
    """Boundaries 10^(k / per_decade) from lo to hi, rounded to 4 significant digits."""
    first = math.ceil(math.log10(lo) * per_decade - 1e-9)
    last = math.floor(math.log10(hi) * per_decade + 1e-9)
    return tuple(float(f"{10 ** (k / per_decade):.4g}") for k in range(first, last + 1))


def union(*lists: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(sorted({float(v) for values in lists for v in values}))


def one_two_five(max_value: int) -> tuple[float, ...]:
    """vLLM's token-count boundaries: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


# Each timing series: vLLM's boundaries plus the fine grid over the range the lab's
# modelled GPUs produce (a decode step is 0.3 ms to tens of ms; requests take tens of ms
# to minutes), plus a coarse grid for the per-phase times (no quantile target there).
TTFT = union(VLLM_TTFT, grid(5e-4, 10.0, FINE_PER_DECADE))
PER_TOKEN = union(VLLM_PER_TOKEN, grid(2e-4, 0.2, FINE_PER_DECADE))
E2E = union(VLLM_REQUEST, grid(0.01, 100.0, FINE_PER_DECADE))
PHASE = union(VLLM_REQUEST, grid(1e-4, 7680.0, COARSE_PER_DECADE))

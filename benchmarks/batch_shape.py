"""What shape the measured TPOT has in the batch: which routing skew the public sweeps imply.

    python benchmarks/batch_shape.py [--data DIR] [--model gpt-oss-120b] [--min-points 5]

No simulation, seconds to run. For every public sweep of an MoE model in
`inference_lab/calibrate/data/` (one source's model at one GPU, TP degree and prompt /
output shape, at least --min-points concurrencies) it fits, by least squares,

    TPOT(B) = a + b * B + e * E_s(B)

where B is the number of clients (the decode batch), E_s(B) the experts per layer B
tokens touch when routed with Zipf exponent s (engine.sim.cost.expected_distinct_experts,
the calibrated model's own term) and e the time one touched expert adds. Per skew s it
prints the fit's largest error and e against the time the GPU needs to read one expert's
weights in every MoE layer at its HBM peak, split over the TP GPUs (the roofline's
price). A skew that makes e equal that price explains the sweep's curvature with the
expert reads alone, at the bandwidth the dense weights reach; a larger skew needs the
experts read slower than the dense weights, a smaller one faster. b is what grows
linearly: per-sequence GPU work, the KV read and the prefill a closed loop carries per
step. The summary line gives, per sweep, the skew at which e meets the price.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from inference_lab.calibrate.fit_presets import DATA, load_rows
from inference_lab.calibrate.simulate import Point
from inference_lab.engine.sim.cost import expected_distinct_experts

SKEWS = (0.0, 0.7, 1.05)  # uniform, the sweeps' median, the shipped b200 fit's


def expert_stream(point: Point):
    """(experts, top-k, seconds to read one expert in every MoE layer at the HBM peak over
    the TP group), or None for a dense model."""
    d = point.deployment
    for s in d.model.weight_streams:
        if s.num_experts:
            per_expert = (s.resident_params - s.active_params) / (s.num_experts - s.top_k)
            return s.num_experts, s.top_k, per_expert * s.bytes_per_value / (d.hardware.hbm_bandwidth * d.tp)
    return None


def sweeps(rows: list[Point], min_points: int) -> dict[str, list[Point]]:
    out: dict[str, list[Point]] = {}
    for r in rows:
        if "tpot_ms" not in r.measured or expert_stream(r) is None:
            continue
        d = r.deployment
        key = f"{r.source}: {d.model.name} {d.hardware.name} TP {d.tp} {r.input_len}/{r.output_len}"
        out.setdefault(key, []).append(r)
    return {k: sorted(v, key=lambda p: p.concurrency) for k, v in out.items()
            if len({p.concurrency for p in v}) >= min_points}


def fit(points: list[Point], skew: float) -> tuple[float, float, float, float]:
    """(a ms, b us per client, e us per touched expert, largest |error|) for one skew."""
    experts, k, _ = expert_stream(points[0])
    batch = np.array([p.concurrency for p in points], float)
    tpot = np.array([p.measured["tpot_ms"] for p in points])
    touched = np.array([expected_distinct_experts(experts, k, int(b), skew) for b in batch])
    x = np.c_[np.ones_like(batch), batch, touched]
    coef, *_ = np.linalg.lstsq(x, tpot, rcond=None)
    worst = float(np.max(np.abs(x @ coef / tpot - 1.0)))
    return float(coef[0]), float(coef[1]) * 1e3, float(coef[2]) * 1e3, worst


def matching_skew(points: list[Point], price_us: float) -> float | None:
    """The skew in [0, 2] at which the fitted e equals the roofline's price (bisection;
    e grows with the skew), or None when no skew there reaches it."""
    lo, hi = 0.0, 2.0
    if not fit(points, lo)[2] <= price_us <= fit(points, hi)[2]:
        return None
    for _ in range(30):
        mid = (lo + hi) / 2
        if fit(points, mid)[2] < price_us:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--model", action="append", default=None,
                        help="only this model's sweeps (repeatable; default every MoE model)")
    parser.add_argument("--min-points", type=int, default=5,
                        help="concurrencies a sweep needs to be fitted (default 5: three "
                             "coefficients and room to miss)")
    args = parser.parse_args()
    rows = [r for r in load_rows(args.data)
            if args.model is None or r.deployment.model.name in args.model]
    found = sweeps(rows, args.min_points)
    if not found:
        print("no sweep of an MoE model with enough concurrencies", file=sys.stderr)
        return 2
    print("| sweep | expert read at peak (us) | " + " | ".join(f"s={s:g}: e us / b us / max err"
                                                         for s in SKEWS) + " | s where e = read |")
    print("|---|---|" + "---|" * len(SKEWS) + "---|")
    matched = []
    for label, points in found.items():
        price = expert_stream(points[0])[2] * 1e6
        cells = []
        for s in SKEWS:
            _, b, e, worst = fit(points, s)
            cells.append(f"{e:.0f} / {b:.0f} / {worst:.1%}")
        s_match = matching_skew(points, price)
        if s_match is not None:
            matched.append(s_match)
        print(f"| {label} | {price:.1f} | " + " | ".join(cells)
              + f" | {'-' if s_match is None else f'{s_match:.2f}'} |")
    if matched:
        matched.sort()
        print(f"\nskew at which the expert reads alone explain the curvature: median "
              f"{matched[len(matched) // 2]:.2f} over {len(matched)} sweeps "
              f"(range {matched[0]:.2f} to {matched[-1]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

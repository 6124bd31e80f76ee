"""Fit the `calibrated` timing model to public measurements and print the error table.

    python calibration/fit.py [--data calibration/data] [--sweeps 4] [--jobs N] [--hardware h200]

Reads every `calibration/data/*.toml` (a [source] with its provenance, [[deployments]]
naming a bundled model and hardware preset with tp and scheduler limits, [[rows]] of
measured TTFT / TPOT / end-to-end ms at a concurrency and fixed input / output lengths;
`holdout = true` rows are never seen by the fit), then per hardware:
1. simulates every row with the roofline (no calibration) for reference;
2. fits the hardware's [calibration] parameters to its non-held-out rows by coordinate
   descent over a grid from three starting points, minimising the mean absolute
   relative error;
3. prints, per row and metric: measured, roofline, calibrated, error; then the median and
   largest absolute error on the fit rows and on the held-out rows separately;
4. prints the [calibration] table to put in the hardware preset.
Each row is run through the offline driver with closed-loop clients (`concurrency` of
them, `requests` in all, default 6 x concurrency; the first wave's TTFT is taken out), exactly as `inference-lab sim` would.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from inference_lab.common.workload import LengthDist, WorkloadSpec
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim import catalog
from inference_lab.engine.sim.specs import Calibration, Deployment, SchedulerConfig

METRICS = (("ttft_ms", "ttft_ms"), ("tpot_ms", "per_token_ms"), ("e2e_ms", "e2e_ms"))
# The grid each parameter is searched over (coordinate descent keeps the others fixed).
GRID = {
    "bandwidth_efficiency": [0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7,
                             0.75, 0.8, 0.85, 0.9, 1.0],
    "flops_efficiency": [0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
    "moe_flops_efficiency": [0.0, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6],
    "flops_half_tokens": [0.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0],
    "step_overhead": [0.0, 0.25e-3, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 6e-3, 10e-3, 15e-3, 20e-3],
    "request_overhead": [0.0, 2e-3, 5e-3, 10e-3, 20e-3, 40e-3, 100e-3, 200e-3],
    "comm_efficiency": [0.1, 0.2, 0.3, 0.5, 0.7, 1.0],
    "layer_overhead": [0.0, 5e-6, 10e-6, 20e-6, 40e-6, 60e-6, 80e-6, 120e-6, 160e-6, 240e-6, 320e-6],
    "expert_overhead": [0.0, 0.5e-6, 1e-6, 1.5e-6, 2e-6, 2.5e-6, 3e-6, 4e-6, 6e-6, 8e-6, 12e-6],
    "mla_layer_overhead": [0.0, 20e-6, 40e-6, 80e-6, 120e-6, 160e-6, 200e-6, 240e-6, 280e-6,
                           320e-6, 400e-6],
    "sequence_overhead": [0.0, 10e-6, 25e-6, 50e-6, 100e-6, 200e-6],
}


@dataclass
class Row:
    source: str
    label: str
    deployment: Deployment
    input: int
    output: int
    concurrency: int
    requests: int
    measured: dict[str, float]
    holdout: bool
    first_wave: bool = False  # True: the measured means include the opening burst


def load_rows(data_dir: Path) -> list[Row]:
    rows = []
    for path in sorted(data_dir.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        deployments = {}
        for d in data["deployments"]:
            sched = SchedulerConfig(max_num_seqs=d.get("max_num_seqs", 256),
                                    max_num_batched_tokens=d.get("max_num_batched_tokens", 8192),
                                    block_size=d.get("block_size", 16),
                                    enable_chunked_prefill=d.get("enable_chunked_prefill", True),
                                    enable_prefix_caching=d.get("enable_prefix_caching", True),
                                    max_model_len=d.get("max_model_len"))
            deployments[d["name"]] = Deployment(
                name=d["name"], model=catalog.load_model(d["model"]),
                hardware=catalog.load_hardware(d["hardware"]), tp=d.get("tp", 1), scheduler=sched)
        only = next(iter(deployments)) if len(deployments) == 1 else None
        first_wave = data["source"].get("first_wave") == "included"
        for r in data["rows"]:
            dep = deployments[r.get("deployment", only)]
            measured = {key: r[key] for key, _ in METRICS if key in r}
            rows.append(Row(path.stem, f"{dep.name} {r['input']}/{r['output']} c={r['concurrency']}",
                            dep, r["input"], r["output"], r["concurrency"],
                            r.get("requests", 6 * r["concurrency"]), measured, r.get("holdout", False),
                            first_wave))
    return rows


MAX_REQUESTS = 64  # per simulated row, at least 4 x concurrency (--max-requests)


def _run(dep: Deployment, row: Row, requests: int) -> dict:
    spec = WorkloadSpec("closed_loop", requests, LengthDist("fixed", value=row.input),
                        LengthDist("fixed", value=row.output), num_concurrent_users=row.concurrency)
    return run_offline(replace(dep, scheduler=replace(dep.scheduler)), spec)["latency_metrics"]


def simulate(row: Row, calibration: Calibration | None) -> dict[str, float]:
    """The row's metrics as simulated. A closed loop starts with all its clients at once,
    which a benchmark's steady state does not see: unless the source says its means
    include that first wave, for a concurrency above 1 the first wave is run alone too and
    taken out of the TTFT mean (its TTFT is the same in both runs: every first token comes
    before the first request ends)."""
    dep = row.deployment
    if calibration is not None:
        dep = replace(dep, hardware=replace(dep.hardware, calibration=calibration), timing="calibrated")
    lat = _run(dep, row, min(row.requests, max(MAX_REQUESTS, 4 * row.concurrency)))
    out = {key: lat[name]["mean"] for key, name in METRICS if key in row.measured}
    c, n = row.concurrency, min(row.requests, max(MAX_REQUESTS, 4 * row.concurrency))
    if "ttft_ms" in out and c > 1 and n > c and not row.first_wave:
        first = _run(dep, row, c)["ttft_ms"]["mean"]
        out["ttft_ms"] = (n * out["ttft_ms"] - c * first) / (n - c)
    return out


_MEMO: dict[tuple[int, Calibration], dict[str, float]] = {}  # a descent revisits points


def errors(rows: list[Row], calibration: Calibration | None) -> list[float]:
    out = []
    for row in rows:
        key = (id(row), calibration)
        sim = _MEMO.get(key) if calibration is not None else None
        if sim is None:
            sim = simulate(row, calibration)
            if calibration is not None:
                _MEMO[key] = sim
        out += [sim[k] / v - 1.0 for k, v in row.measured.items()]
    return out


STARTS = (  # coordinate descent from each; the best end wins
    Calibration(flops_efficiency=0.7, flops_half_tokens=64.0, bandwidth_efficiency=0.7,
                comm_efficiency=0.5, step_overhead=1e-3, request_overhead=5e-3),
    Calibration(flops_efficiency=0.5, flops_half_tokens=256.0, bandwidth_efficiency=0.6,
                comm_efficiency=0.5, step_overhead=0.5e-3, request_overhead=10e-3),
    Calibration(flops_efficiency=0.9, flops_half_tokens=16.0, bandwidth_efficiency=0.5,
                comm_efficiency=0.3, step_overhead=2e-3, request_overhead=0.0),
)


def _score(rows: list[Row], calibration: Calibration) -> float:
    return statistics.mean(abs(e) for e in errors(rows, calibration))


def fit(rows: list[Row], sweeps: int) -> tuple[Calibration, float]:
    multi_gpu = any(r.deployment.tp > 1 for r in rows)
    moe = any(s.num_experts for r in rows for s in r.deployment.model.weight_streams)
    mla = any(c.kind == "mla" for r in rows for c in r.deployment.model.layer_classes)
    unused = ({"comm_efficiency"} if not multi_gpu else set()) | (
        {"moe_flops_efficiency", "expert_overhead"} if not moe else set()) | (
        {"mla_layer_overhead"} if not mla else set())  # no row could tell: left at the start
    results = []
    for best in STARTS:
        score = _score(rows, best)
        for _ in range(sweeps):
            moved = False
            for name, grid in GRID.items():
                if name in unused:
                    continue
                for value in grid:
                    candidate = replace(best, **{name: value})
                    s = _score(rows, candidate)
                    if s < score - 1e-9:
                        best, score, moved = candidate, s, True
            if not moved:
                break
        results.append((score, best))
    score, best = min(results, key=lambda r: r[0])
    return best, score


def _fit_one(job: tuple[str, list[Row], int, int]) -> tuple[str, Calibration, float]:
    global MAX_REQUESTS
    hw, rows, sweeps, max_requests = job
    MAX_REQUESTS = max_requests
    fitted, score = fit([r for r in rows if not r.holdout], sweeps)
    return hw, fitted, score


def main() -> int:
    global MAX_REQUESTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parent / "data")
    parser.add_argument("--sweeps", type=int, default=4)
    parser.add_argument("--max-requests", type=int, default=MAX_REQUESTS,
                        help="simulate at most this many requests per row (at least 4 x its "
                             "concurrency): a benchmark of 500 requests at concurrency 4 is "
                             "125 sequential waves, close to steady state after a few dozen")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="hardware fitted in parallel processes (default: the CPU count)")
    parser.add_argument("--hardware", action="append", default=None,
                        help="fit only this hardware preset (repeatable)")
    args = parser.parse_args()
    MAX_REQUESTS = args.max_requests
    rows = [r for r in load_rows(args.data)
            if args.hardware is None or r.deployment.hardware.name in args.hardware]
    by_hw: dict[str, list[Row]] = {}
    for row in rows:
        by_hw.setdefault(row.deployment.hardware.name, []).append(row)
    summary = {"fit": {}, "held-out": {}}
    jobs = [(hw, hw_rows, args.sweeps, MAX_REQUESTS) for hw, hw_rows in sorted(by_hw.items())]
    workers = max(1, min(args.jobs, len(jobs)))
    if workers > 1:  # one hardware per process: the fits are independent
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            fits = {hw: (fitted, score) for hw, fitted, score in pool.imap_unordered(_fit_one, jobs)}
    else:
        fits = {hw: (fitted, score) for hw, fitted, score in map(_fit_one, jobs)}
    for hw, hw_rows in sorted(by_hw.items()):
        fitted, score = fits[hw]
        print(f"\n== {hw}: fitted on {sum(not r.holdout for r in hw_rows)} rows, "
              f"held out {sum(r.holdout for r in hw_rows)}; mean |error| on the fit rows {score:.1%}")
        print(f"{'row':44s} {'metric':8s} {'measured':>9s} {'roofline':>9s} {'calibr.':>9s} {'error':>7s}  set")
        for row in hw_rows:
            roof, cal = simulate(row, None), simulate(row, fitted)
            part = "held-out" if row.holdout else "fit"
            for key, measured in row.measured.items():
                err = cal[key] / measured - 1.0
                summary[part].setdefault(key, []).append(abs(err))
                print(f"{row.label:44s} {key:8s} {measured:9.2f} {roof[key]:9.2f} {cal[key]:9.2f} "
                      f"{err:+7.1%}  {part}")
        print(f"[calibration]   # {hw}: calibration/fit.py on calibration/data "
              f"({', '.join(sorted({r.source for r in hw_rows}))})")
        for name in GRID:
            print(f"{name} = {getattr(fitted, name):g}")
    print("\n== |error| by set and metric: median / max (count)")
    for part, by_metric in summary.items():
        for key, errs in sorted(by_metric.items()):
            print(f"{part:9s} {key:8s} {statistics.median(errs):6.1%} / {max(errs):6.1%} ({len(errs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

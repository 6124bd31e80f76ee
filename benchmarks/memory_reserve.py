"""The memory a calibrated preset keeps outside the weights and the KV pool, from the public sweeps whose pool binds.

vLLM sizes its KV pool as gpu_memory_utilization x HBM less the weights and what its memory
profile sets aside (the activation peak of its largest step and the sampler's,
communication buffers, kernel workspaces). A sweep shows that reserve only where the pool
binds: past some concurrency its TPOT stops growing, because the extra clients queue. This
script takes each hardware's sweeps with such a plateau (a deployment whose rows at the
pool's arithmetic would hold fewer sequences than the clients), re-simulates their rows at a
range of reserves with the shipped calibration otherwise, and prints each row's TPOT error;
the reserve with the smallest mean error on the fit rows is the one to ship (held-out rows
only reported). Where a source reports the server's own pool (a deployment's
`num_gpu_blocks`, from vLLM's cache_config_info), the reserve is measured instead: the
lab's arithmetic less that pool.

    python benchmarks/memory_reserve.py --hardware b200 --jobs 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_error import add_row_arguments, calibration_of  # noqa: E402

from inference_lab.calibrate.fit_presets import load_rows  # noqa: E402
from inference_lab.calibrate.fitting import Evaluator  # noqa: E402
from inference_lab.calibrate.simulate import Point  # noqa: E402
from inference_lab.engine.sim import kv  # noqa: E402


def binds(row: Point) -> bool:
    """Would the row's clients need more KV than the pool holds with no reserve (each at
    its mean prompt and output lengths)?"""
    dep = replace(row.deployment, timing="roofline")
    per_seq = (row.input_len + row.output_len) * (1 + row.range_ratio) / 2
    return row.concurrency * per_seq > kv.total_blocks(dep) * dep.scheduler.block_size


def scan(cal, pts: list[Point], reserves: list[float], args: argparse.Namespace) -> None:
    """Print the TPOT error of each row in `pts` at each reserve, `cal` otherwise."""
    print(f"\nfit of vLLM {cal.vllm_version or '(unstated)'}: {len(pts)} rows")
    ev = Evaluator(pts, args.max_requests, args.jobs)
    sims = ev.sims([replace(cal, memory_reserve=r) for r in reserves])
    print("\n| deployment | clients | rows | measured TPOT ms | "
          + " | ".join(f"{r / 1e9:g} GB" for r in reserves) + " |")
    print("|---|---|---|---|" + "---|" * len(reserves))
    errs: list[list[float]] = [[] for _ in reserves]
    for i, p in enumerate(pts):
        meas = p.measured["tpot_ms"]
        cells = []
        for j, sim in enumerate(sims):
            e = sim[i]["tpot_ms"] / meas - 1
            cells.append(f"{e:+.1%}")
            if not p.holdout:
                errs[j].append(abs(e))
        print(f"| {p.deployment.name} | {p.concurrency} | {'held out' if p.holdout else 'fit'} "
              f"| {meas:.2f} | " + " | ".join(cells) + " |")
    means = [statistics.fmean(e) for e in errs]
    best = min(range(len(reserves)), key=means.__getitem__)
    print("\nmean abs. TPOT error on the fit rows: "
          + ", ".join(f"{r / 1e9:g} GB {m:.1%}" for r, m in zip(reserves, means)))
    print(f"smallest: {reserves[best] / 1e9:g} GB per GPU (shipped: {cal.memory_reserve / 1e9:g} GB)")


def reported_pools(data_dir: Path, rows: list[Point]) -> None:
    """Print the reserve each source's reported num_gpu_blocks implies."""
    deps = {r.deployment.name: r.deployment for r in rows}
    for path in sorted(data_dir.glob("*.toml")):
        for d in tomllib.loads(path.read_text()).get("deployments", []):
            if "num_gpu_blocks" not in d:
                continue
            dep = replace(deps[d["name"]], timing="roofline")
            block = kv.bytes_per_token(dep) * dep.scheduler.block_size
            real = d["num_gpu_blocks"] * block
            lab = kv.kv_capacity_bytes(dep)
            print(f"{d['name']} ({dep.hardware.name}): the server reports {d['num_gpu_blocks']} blocks "
                  f"= {real / 1e9:.2f} GB of pool per GPU; the lab's arithmetic gives {lab / 1e9:.2f} GB: "
                  f"reserve {(lab - real) / 1e9:.2f} GB per GPU")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser, max_requests=640)
    parser.add_argument("--reserves", default="0,4,8,10,11,12,13,14,16",
                        help="GB per GPU to try, comma-separated (default %(default)s)")
    args = parser.parse_args()
    reserves = [float(x) * 1e9 for x in args.reserves.split(",")]
    rows = load_rows(args.data)
    reported_pools(args.data, rows)
    for gpu in args.hardware or ["b200", "h200", "h100"]:
        hw_rows = [r for r in rows if r.deployment.hardware.name == gpu and "tpot_ms" in r.measured]
        bound = {r.deployment.name for r in hw_rows if binds(r)}
        print(f"\n### {gpu}: {len(bound)} deployments whose pool binds "
              f"({', '.join(sorted(bound)) or 'none'})")
        groups: dict = {}
        for r in hw_rows:
            if r.deployment.name in bound and calibration_of(r) is not None:
                groups.setdefault(calibration_of(r), []).append(r)
        for cal, pts in groups.items():
            scan(cal, pts, reserves, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

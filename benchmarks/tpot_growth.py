"""How the calibrated TPOT grows with the clients along one public sweep, against the measured growth.

Re-simulates every row of one deployment of `inference_lab/calibrate/data/` under its
shipped fit (as `timing_error.py` times it), optionally with another KV cache dtype than
the source served (`--kv-cache-dtype fp8`: the sweep as an fp8-cache server would run
it, where only the lab's side can be shown), and prints each concurrency's measured and
simulated TPOT and the growth from the one before.

    python benchmarks/tpot_growth.py gpt-oss-120b-b200-tp1-8k1k --kv-cache-dtype fp8 --jobs 2
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_error import add_row_arguments, shipped_sims  # noqa: E402

from inference_lab.calibrate.fit_presets import load_rows  # noqa: E402
from inference_lab.calibrate.fitting import Evaluator  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("deployment", help="a deployment name of the data files")
    parser.add_argument("--kv-cache-dtype", default=None,
                        help="simulate with this KV cache dtype (default: as the source served)")
    add_row_arguments(parser)
    args = parser.parse_args()
    rows = sorted((r for r in load_rows(args.data)
                   if r.deployment.name == args.deployment and "tpot_ms" in r.measured),
                  key=lambda r: r.concurrency)
    if not rows:
        print(f"no rows with a TPOT for deployment {args.deployment!r}", file=sys.stderr)
        return 2
    if args.kv_cache_dtype:
        rows = [replace(r, deployment=replace(r.deployment, scheduler=replace(
            r.deployment.scheduler, kv_cache_dtype=args.kv_cache_dtype))) for r in rows]
    sims = shipped_sims(Evaluator(rows, args.max_requests, args.jobs))
    cache = args.kv_cache_dtype or rows[0].deployment.scheduler.kv_cache_dtype
    print(f"{args.deployment} (KV cache {cache}; measured with the source's)\n")
    print("| clients | measured TPOT ms | growth | simulated TPOT ms | growth |")
    print("|---|---|---|---|---|")
    prev = None
    for r, s in zip(rows, sims):
        m, t = r.measured["tpot_ms"], s["tpot_ms"]
        grow = (f"{m / prev[0]:.2f}x", f"{t / prev[1]:.2f}x") if prev else ("-", "-")
        print(f"| {r.concurrency} | {m:.2f} | {grow[0]} | {t:.2f} | {grow[1]} |")
        prev = (m, t)
    return 0


if __name__ == "__main__":
    sys.exit(main())

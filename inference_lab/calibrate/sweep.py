"""A closed-loop concurrency sweep as the simulator sees it, in both timing models.

    python -m inference_lab.calibrate.sweep --model gpt-oss-120b --hardware b200 --kv-cache-dtype fp8 \\
        --max-num-seqs 512 --input 8192 --output 1024 --range-ratio 0.8 \\
        --concurrency 4,8,16,32,64,128 [--measured-tpot 4:3.7,128:23]

Prints, per concurrency, the median TTFT and the mean TPOT of 10 x concurrency requests
(as vllm bench serve and InferenceMAX run them: every client starts at once, lengths
uniform over [ratio x L, L]) under the roofline and the preset's calibrated timing, and
each model's batch scaling: TPOT at the highest concurrency over TPOT at the lowest.
With --measured-tpot, also each TPOT's error against those values.
"""

from __future__ import annotations

import argparse
import sys

from inference_lab.calibrate.simulate import Point, simulate
from inference_lab.engine.sim import catalog
from inference_lab.engine.sim.specs import Deployment, SchedulerConfig


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m inference_lab.calibrate.sweep",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--hardware", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--input", type=int, required=True)
    p.add_argument("--output", type=int, required=True)
    p.add_argument("--range-ratio", type=float, default=1.0)
    p.add_argument("--concurrency", default="4,8,16,32,64,128")
    p.add_argument("--measured-tpot", default="", help="concurrency:ms,... to compare with")
    args = p.parse_args()
    sched = SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                            kv_cache_dtype=args.kv_cache_dtype, enable_prefix_caching=args.prefix_caching)
    hw = catalog.load_hardware(args.hardware)
    dep = Deployment(name=args.model, model=catalog.load_model(args.model), hardware=hw, tp=args.tp,
                     scheduler=sched)
    measured = {int(c): float(v) for c, v in (kv.split(":") for kv in args.measured_tpot.split(",") if kv)}
    concs = [int(c) for c in args.concurrency.split(",")]
    print(f"{args.model} on {args.tp} x {args.hardware}, {args.input}/{args.output} (range {args.range_ratio}), "
          f"kv {args.kv_cache_dtype}, max_num_seqs {args.max_num_seqs}; calibration: "
          f"{hw.calibration.fit if hw.calibration else 'none'}")
    print(f"{'conc':>5s} {'TTFT p50 roof':>14s} {'TTFT p50 cal':>13s} {'TPOT roof':>10s} {'TPOT cal':>9s}"
          + ("   measured  err roof  err cal" if measured else ""))
    tpots: dict[str, list[float]] = {"roofline": [], "calibrated": []}
    for c in concs:
        point = Point(f"c={c}", dep, c, args.input, args.output, {"ttft_p50_ms": 1.0, "tpot_ms": 1.0},
                      range_ratio=args.range_ratio)
        roof = simulate(point, None)
        cal = simulate(point, hw.calibration) if hw.calibration else {"ttft_p50_ms": 0.0, "tpot_ms": 0.0}
        tpots["roofline"].append(roof["tpot_ms"])
        tpots["calibrated"].append(cal["tpot_ms"])
        line = (f"{c:5d} {roof['ttft_p50_ms']:14.1f} {cal['ttft_p50_ms']:13.1f} {roof['tpot_ms']:10.2f} "
                f"{cal['tpot_ms']:9.2f}")
        if c in measured:
            m = measured[c]
            line += f"   {m:8.2f} {roof['tpot_ms'] / m - 1:+8.1%} {cal['tpot_ms'] / m - 1:+8.1%}"
        print(line, flush=True)
    for name, values in tpots.items():
        if values[0]:
            print(f"batch scaling ({name}): TPOT at {concs[-1]} / at {concs[0]} = {values[-1] / values[0]:.1f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Offline simulator speed: simulated output tokens per CPU-second.

Runs the closed-loop-256 chat workload (100,000 requests by default) on gpt-oss-20b /
B200 through the offline driver and prints the figures. No pass/fail: a benchmark.

    python benchmarks/sim_speed.py [--requests N] [--workload FILE] [--config FILE]
        [--hardware NAME] [--timing roofline|calibrated] [--pd P:D [--kv-link LINK]]
        [--data-parallel-size D] [--kv-offloading-size GIB] [--json FILE]

--pd runs the workload disaggregated (P prefill and D decode replicas, engine.drivers.disagg);
--data-parallel-size on D data-parallel ranks (engine.drivers.data_parallel).
Besides output tokens, the figures count all simulated tokens (prompt + output).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

from inference_lab.engine.sim.config import load_deployment
from inference_lab.engine.sim.profiles import apply as apply_profile
from inference_lab.engine.drivers.data_parallel import run_data_parallel
from inference_lab.engine.drivers.disagg import run_disaggregated
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.kv_transfer import PdLayout, parse_pools
from inference_lab.common.workload import load_workload

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=ROOT / "configs" / "gpt-oss-20b.toml", type=Path)
    parser.add_argument("--hardware", default="b200")
    parser.add_argument("--workload", type=Path,
                        default=ROOT / "configs" / "workloads" / "chat-closed-loop-256.toml")
    parser.add_argument("--requests", type=int, help="override num_requests")
    parser.add_argument("--timing", choices=("roofline", "calibrated"), help="timing model")
    parser.add_argument("--pd", metavar="P:D", help="disaggregated: P prefill, D decode replicas")
    parser.add_argument("--kv-link", default="rdma", help="with --pd: nvlink | rdma | GBPS[@MS]")
    parser.add_argument("--data-parallel-size", type=int, default=1, metavar="D",
                        help="D data-parallel ranks (an MoE model's in lockstep)")
    parser.add_argument("--engine", choices=("vllm", "sglang"), default="vllm",
                        help="the engine profile simulated (engine.sim.profiles)")
    parser.add_argument("--kv-offloading-size", type=float, metavar="GIB",
                        help="KV offloading to a host tier of this many GiB (default: off)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    deployment = apply_profile(load_deployment(args.config, args.hardware, timing=args.timing),
                               args.engine)
    if args.kv_offloading_size:
        from inference_lab.engine.sim.offload import from_flags

        deployment.offload = from_flags(args.kv_offloading_size)
    spec = load_workload(args.workload)
    if args.requests:
        spec = dataclasses.replace(spec, num_requests=args.requests)
    wall0 = time.perf_counter()
    if args.pd:
        summary = run_disaggregated(deployment, spec, PdLayout(*parse_pools(args.pd), args.kv_link))
    elif args.data_parallel_size > 1:
        summary = run_data_parallel(deployment, spec, args.data_parallel_size)
    else:
        summary = run_offline(deployment, spec)
    wall = time.perf_counter() - wall0
    sim = summary["simulation"]
    out_tokens = summary["throughput_metrics"]["output_tokens_per_sec"] * sim["simulated_seconds"]
    in_tokens = summary["throughput_metrics"]["input_tokens_per_sec"] * sim["simulated_seconds"]
    all_per_cpu = (in_tokens + out_tokens) / sim["cpu_seconds"] if sim["cpu_seconds"] else 0.0
    layout = (f", disaggregated {args.pd} over {args.kv_link}" if args.pd else
              f", {args.data_parallel_size} data-parallel ranks" if args.data_parallel_size > 1 else "")
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print(f"workload: {args.workload.name}, {spec.num_requests:,} requests, "
          f"{spec.num_concurrent_users} users, {deployment.name} on {deployment.hardware.name}, "
          f"{deployment.timing} timing, engine {args.engine}{layout}"
          + (f", KV offloading {args.kv_offloading_size:g} GiB" if args.kv_offloading_size else ""))
    print(f"simulated: {sim['simulated_seconds']:.1f} s, {sim['steps']:,} steps, "
          f"{out_tokens:,.0f} output tokens, mean batch {out_tokens / max(sim['steps'], 1):.1f}")
    print(f"cpu: {sim['cpu_seconds']:.2f} s (wall {wall:.2f} s)")
    print(f"simulated output tokens per CPU-second: {sim['output_tokens_per_cpu_second']:,.0f}")
    print(f"simulated tokens (prompt + output) per CPU-second: {all_per_cpu:,.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": args.workload.name, "requests": spec.num_requests,
                       "model": deployment.name, "hardware": deployment.hardware.name,
                       "timing": deployment.timing, "simulated_seconds": sim["simulated_seconds"],
                       "steps": sim["steps"], "output_tokens": out_tokens,
                       "cpu_seconds": sim["cpu_seconds"], "wall_seconds": wall,
                       "output_tokens_per_cpu_second": sim["output_tokens_per_cpu_second"],
                       "tokens_per_cpu_second": all_per_cpu, "pd": args.pd,
                       "kv_link": args.kv_link if args.pd else None,
                       "data_parallel_size": args.data_parallel_size},
                      f, indent=1)


if __name__ == "__main__":
    main()

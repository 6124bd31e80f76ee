"""KV offloading: the same load with and without a host (CPU) tier, side by side.

    python benchmarks/kv_offload.py [--json FILE]           # multi-turn-offload, offline
    python benchmarks/kv_offload.py --llm-d [--json FILE]    # the llm-d CPU guide's shape
    python benchmarks/kv_offload.py --virtual | --served [--seconds 30]   # the scenario's arms

The default runs configs/workloads/multi-turn-offload.toml (128 long-context agents,
histories 3.5x the GPU's KV cache) on configs/llama-3.1-8b.toml, H100, on the offline
driver, without offloading and with `--kv-offloading-size 256`. `--llm-d` runs the shape
of the llm-d tiered-prefix-cache CPU guide (Qwen3-32B, H100 TP 2, 45 x 30,000-token system
prompts, 45 in flight): its 8 engines as 8 data-parallel ranks behind vLLM's balancer, and
one engine's share of a prefix-affine router (6 users on 6 of the prompts), without
offloading and with `--kv-offloading-size 160`, next to the guide's published figures
(docs/kv-offload.md). Per arm: TTFT mean / p50 / p90, the share of prompt tokens the GPU
prefix cache and the host tier served, the prompt tokens computed, throughput, and
GPU-seconds (simulated seconds x GPUs). `--virtual` and `--served` run
configs/experiments/kv-offload.toml and the same scenario without its
`kv_offloading_size` through `inference-lab experiment` (in virtual time, or on a private
`serve`, cut to `--seconds` modelled seconds each, at `--time-scale`), and print TTFT p50 /
p99, the cached share of prompt tokens (a reply's cached_tokens: GPU and host) and
goodput per arm. Prints figures, no pass/fail.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as C

from inference_lab.common.workload import load_workload
from inference_lab.engine.drivers.data_parallel import run_data_parallel
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.config import load_deployment
from inference_lab.engine.sim.offload import from_flags

ROOT = Path(__file__).resolve().parents[1]
# The llm-d guide's memory-bound table (llm-d/llm-d guides/tiered-prefix-cache/cpu/README.md
# @ 35b5cfb8aa554f190674ca3c372353032c3270ce): mean TTFT s, P90 TTFT s, tokens/s.
PUBLISHED = {"off": (9.0, 20.9, 38534.8), "on": (6.7, 15.9, 46662.5)}


def arm(config: str, hardware: str, workload, size: float | None, ranks: int = 1) -> dict:
    dep = load_deployment(ROOT / config, hardware)
    dep.offload = from_flags(size)
    cpu0 = time.process_time()
    out = (run_data_parallel(dep, workload, ranks) if ranks > 1 else run_offline(dep, workload))
    cache, ttft = out["prefix_cache"], out["latency_metrics"]["ttft_ms"]
    thr = out["throughput_metrics"]
    queries, device, host = cache["queries"], cache["hits"], cache.get("host_hits", 0)
    seconds = out["simulation"]["simulated_seconds"]
    return {"kv_offloading_size_gib": size, "ttft_mean_s": ttft["mean"] / 1e3,
            "ttft_p50_s": ttft["p50"] / 1e3, "ttft_p90_s": ttft["p90"] / 1e3,
            "prompt_tokens": queries, "device_hit": device / queries, "host_hit": host / queries,
            "computed_tokens": queries - device - host,
            "tokens_per_s": thr["input_tokens_per_sec"] + thr["output_tokens_per_sec"],
            "gpu_seconds": seconds * dep.tp * ranks, "cpu_s": time.process_time() - cpu0}


def table(title: str, arms: dict[str, dict]) -> None:
    print(title)
    print(f"{'':>22} {'TTFT mean':>10} {'p50':>8} {'p90':>8} {'GPU hit':>8} {'host hit':>9} "
          f"{'computed':>12} {'tok/s':>9} {'GPU-s':>8}")
    for name, a in arms.items():
        print(f"{name:>22} {a['ttft_mean_s']:>9.2f}s {a['ttft_p50_s']:>7.2f}s {a['ttft_p90_s']:>7.2f}s "
              f"{a['device_hit']:>7.1%} {a['host_hit']:>8.1%} {a['computed_tokens']:>12,} "
              f"{a['tokens_per_s']:>9,.0f} {a['gpu_seconds']:>8.0f}")
    off, on = arms.values()
    print(f"{'change':>22} {on['ttft_mean_s'] / off['ttft_mean_s'] - 1:>+10.1%} "
          f"{on['ttft_p50_s'] / off['ttft_p50_s'] - 1:>+8.1%} {on['ttft_p90_s'] / off['ttft_p90_s'] - 1:>+8.1%}"
          f"{'':>19} {on['computed_tokens'] / off['computed_tokens'] - 1:>+12.1%} "
          f"{on['tokens_per_s'] / off['tokens_per_s'] - 1:>+9.1%} {on['gpu_seconds'] / off['gpu_seconds'] - 1:>+8.1%}")


def multi_turn(args) -> dict:
    workload = load_workload(ROOT / "configs/workloads/multi-turn-offload.toml")
    arms = {"off": arm("configs/llama-3.1-8b.toml", "h100", workload, None),
            "256 GiB": arm("configs/llama-3.1-8b.toml", "h100", workload, 256.0)}
    table("multi-turn-offload: llama-3.1-8b, H100, 128 agents x 8 turns (offline)", arms)
    return arms


def llm_d(args) -> dict:
    fleet = load_workload(ROOT / "configs/workloads/shared-prefix-30k.toml")
    share = dataclasses.replace(fleet, num_concurrent_users=6, num_shared_prefixes=6, num_requests=60)
    figures = {}
    for name, workload, ranks in (("8 engines, vLLM's balancer", fleet, 8),
                                  ("1 engine, prefix-affine share", share, 1)):
        arms = {"off": arm("configs/qwen3-32b.toml", "h100", workload, None, ranks),
                "160 GiB": arm("configs/qwen3-32b.toml", "h100", workload, 160.0, ranks)}
        table(f"qwen3-32b, H100 TP 2, 30,000-token prompts: {name}", arms)
        figures[name] = arms
    (m0, p0, t0), (m1, p1, t1) = PUBLISHED["off"], PUBLISHED["on"]
    print(f"published (llm-d guide, 8 engines, llm-d's prefix-aware router): TTFT mean {m0} -> {m1} s "
          f"({m1 / m0 - 1:+.1%}), P90 {p0} -> {p1} s ({p1 / p0 - 1:+.1%}), "
          f"throughput {t0:,.0f} -> {t1:,.0f} tok/s ({t1 / t0 - 1:+.1%})")
    figures["published"] = PUBLISHED
    return figures


def scenario_arms(args) -> dict:
    """Both arms of the kv-offload scenario through `inference-lab experiment`."""
    mode = ["--serve", "--time-scale", repr(args.time_scale)] if args.served else ["--virtual"]
    text = (ROOT / "configs/experiments/kv-offload.toml").read_text().replace(
        'config = "../llama-3.1-8b.toml"', f'config = "{ROOT / "configs/llama-3.1-8b.toml"}"')
    if args.served:
        text = text.replace("duration = 120", f"duration = {args.seconds:g}")
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, body in (("off", text.replace("kv_offloading_size = 256\n", "")), ("256 GiB", text)):
            path = Path(tmp) / f"{name.split()[0]}.toml"
            path.write_text(body)
            out = Path(tmp) / f"run-{name.split()[0]}"
            subprocess.run([sys.executable, "-P", "-m", "inference_lab", "--log-level", "WARNING",
                            "experiment", str(path), *mode, "--out", str(out)],
                           check=True, capture_output=True, text=True)
            whole = json.loads((out / "summary.json").read_text())["phases"][0]["whole"]
            figures[name] = {k: whole[k] for k in ("requests", "ttft_p50_s", "ttft_p99_s",
                                                   "cached_frac", "goodput_tok_s")}
    print(f"kv-offload scenario, {'served at --time-scale ' + repr(args.time_scale) if args.served else 'virtual time'}"
          f" ({args.seconds if args.served else 120:g} modelled s per arm)")
    print(f"{'':>10} {'requests':>9} {'TTFT p50':>9} {'p99':>8} {'cached':>7} {'goodput':>12}")
    for name, f in figures.items():
        print(f"{name:>10} {f['requests']:>9} {f['ttft_p50_s']:>8.2f}s {f['ttft_p99_s']:>7.2f}s "
              f"{f['cached_frac']:>7.1%} {f['goodput_tok_s']:>8,.0f} tok/s")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm-d", action="store_true", help="the llm-d CPU guide's shape and its figures")
    parser.add_argument("--virtual", action="store_true", help="the kv-offload scenario's two arms in virtual time")
    parser.add_argument("--served", action="store_true", help="the kv-offload scenario's two arms on a private serve")
    parser.add_argument("--seconds", type=float, default=30.0, help="--served: modelled seconds per arm (default 30)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="--served: the server's --time-scale (default 1)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    run = scenario_arms if args.virtual or args.served else llm_d if args.llm_d else multi_turn
    C.write_json(args.json, run(args))


if __name__ == "__main__":
    main()

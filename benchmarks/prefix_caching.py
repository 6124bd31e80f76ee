"""Prefix caching: what it buys (modelled TTFT, hit rate) and what it costs (engine CPU).

    python benchmarks/prefix_caching.py offline [--json FILE]   # multi-turn TTFT with/without, hit rate
    python benchmarks/prefix_caching.py cpu [--clients 256] [--seconds 10] [--json FILE]

`offline` runs configs/workloads/multi-turn-chat.toml on the offline driver (gpt-oss-20b,
B200) with prefix caching on and off. `cpu` starts `inference-lab engine` as a child
process and streams `--clients` closed-loop requests over one Session, each prompt a
2,000-token shared prefix plus 16 tokens of its own, 200-token replies, in two runs:
today's path (prefix caching off, the prompt given as a length only) and the full one
(token IDs sent, hashed, looked up, KV events published to a ZMQ endpoint). It prints the
engine's CPU seconds per finished request in each. Prints figures, no pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import tempfile
import time
from pathlib import Path

import _common as C
from inference_lab.testing.launch import engine_process
import grpc
from engine_stream import run_session

from inference_lab.common.workload import load_workload
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.config import default_deployments
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """model = "gpt-oss-20b"
[scheduler]
max_num_seqs = 256
max_num_batched_tokens = 8192
block_size = 64
enable_prefix_caching = {caching}
[hardware.b200]
tp = 1
"""


def offline(args) -> None:
    workload = load_workload(ROOT / "configs/workloads/multi-turn-chat.toml")
    print(f"workload: multi-turn-chat.toml ({workload.num_concurrent_users} users, "
          f"{workload.num_turns} turns, {workload.shared_prefix_len}-token system prompt)")
    figures = {}
    for caching in (False, True):
        (deployment,) = default_deployments("b200")
        deployment.scheduler = dataclasses.replace(deployment.scheduler,
                                                   enable_prefix_caching=caching)
        out = run_offline(deployment, workload)
        ttft = out["latency_metrics"]["ttft_ms"]
        cache = out["prefix_cache"]
        rate = f"{100 * cache['hit_rate']:.1f} %" if cache["enabled"] else "-"
        print(f"prefix caching {'on ' if caching else 'off'}: TTFT mean {ttft['mean']:.1f} ms, "
              f"p50 {ttft['p50']:.1f}, p90 {ttft['p90']:.1f}, p99 {ttft['p99']:.1f}; "
              f"e2e mean {out['latency_metrics']['e2e_ms']['mean']:.0f} ms; "
              f"hit rate {rate}; {out['throughput_metrics']['requests_per_sec']:.1f} req/s")
        figures[caching] = {"ttft_ms": ttft, "e2e_mean_ms": out["latency_metrics"]["e2e_ms"]["mean"],
                            "hit_rate": cache["hit_rate"] if cache["enabled"] else None,
                            "requests_per_s": out["throughput_metrics"]["requests_per_sec"]}
    C.write_json(args.json, {"off": figures[False], "on": figures[True]})


async def _drive(stub, clients: int, seconds: float, with_ids: bool) -> int:
    rng = random.Random(1)
    prefix = rng.randbytes(4 * 2000)

    def request() -> pb.SubmitRequest:
        if with_ids:
            return pb.SubmitRequest(prompt_token_ids=prefix + rng.randbytes(64), max_tokens=200)
        return pb.SubmitRequest(prompt_tokens=2016, max_tokens=200)

    _, _, finished = await run_session(stub, clients, seconds, 200, request)
    return finished


async def _one_run(args, caching: bool) -> tuple[float, int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gpt-oss-20b.toml"
        config.write_text(CONFIG.format(caching="true" if caching else "false"))
        argv = ["--config", str(config)]
        if caching:
            argv += ["--kv-events-config", json.dumps({
                "enable_kv_cache_events": True,
                "endpoint": f"tcp://127.0.0.1:{C.free_port()}"})]
        with engine_process(*argv, log_level="WARNING") as engine:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}") as channel:
                stub = engine_pb2_grpc.EngineStub(channel)
                await _drive(stub, args.clients, 1.5, caching)  # warm-up
                cpu0, wall0 = C.proc_cpu(engine.pid), time.perf_counter()
                finished = await _drive(stub, args.clients, args.seconds, caching)
                wall = time.perf_counter() - wall0
                cpu = C.proc_cpu(engine.pid) - cpu0
    return cpu, finished, wall


async def cpu(args) -> None:
    print(f"{args.clients} concurrent requests, 2,000-token shared prefix + 16 tokens, "
          f"200-token replies, {args.seconds:.0f} s per run (load average {os.getloadavg()[0]:.2f})")
    per, figures = {}, {}
    for caching in (False, True):
        used, finished, wall = await _one_run(args, caching)
        per[caching] = used / max(finished, 1)
        figures["with" if caching else "without"] = {
            "requests": finished, "seconds": wall, "engine_cores": used / wall,
            "cpu_ms_per_request": 1e3 * per[caching]}
        label = ("prefix caching + KV events + token IDs" if caching
                 else "today's path (no token IDs, caching off)")
        print(f"{label}: {finished:,} requests in {wall:.1f} s, engine CPU {used / wall:.2f} cores, "
              f"{1e3 * per[caching]:.3f} CPU ms per request")
    print(f"CPU per request, with / without: {per[True] / per[False]:.3f}")
    C.write_json(args.json, {**figures, "clients": args.clients, "ratio": per[True] / per[False]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("offline")
    p.add_argument("--json", help="write the figures to this file")
    p = sub.add_parser("cpu")
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    if args.what == "offline":
        offline(args)
    else:
        asyncio.run(cpu(args))


if __name__ == "__main__":
    main()

"""vllm-router's load-aware and KV-aware policies in front of `serve --replicas 3`.

    python benchmarks/routers.py power_of_two [--runs 3]
    python benchmarks/routers.py kv_aware [--runs 3] [--per-port]

power_of_two: 8 endless streams sent straight to replica 0, then (once the router has
polled replica 0's GET /get_load since) 24 chat requests of 64 tokens through the router,
6 at a time: how many of the 24 replica 0 served (target: at most 4).
kv_aware: 3 groups of 8 chat requests, each group's sharing a system prompt of ~1,500
tokens, 6 at a time through the router: the fleet's prefix-cache hit rate (vLLM's
counters over the three replicas; target: at least 0.75) and the replicas each group was
served on (target: the groups on two replicas or more). The router runs in its DP-aware
mode (`--intra-node-data-parallel-size 3` on the base port, which honours
X-data-parallel-rank, and every replica's publisher given with --kv-event-source), the
layout in which it credits every replica; --per-port points it at the three ports instead
(discovery by GET /get_server_info and /kv_event_sources), where it credits replica 0 only
(docs/routers.md).

Each run starts a fresh lab and router. Bounded: 24 requests a run, 60 s timeouts. Prints
figures, no pass/fail; the machine is shared, so the load average is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import Counter

import aiohttp

import _common as C

from inference_lab.common.ports import free_port_run
from inference_lab.testing.routers import loaded_replica, prefix_groups, vllm_router


def kv_config(kv: int) -> str:
    return json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{kv}",
                       "replay_endpoint": f"tcp://127.0.0.1:{kv + 1}"})


def dp_flags(base: str, kv: int, replicas: int = 3) -> list[str]:
    """vllm-router's DP-aware mode over the base port, every replica's publisher static
    (ports kv + 2k, replays kv + 1 + 2k: the stride of ports one apart)."""
    pubs = ",".join(f"tcp://127.0.0.1:{kv + 2 * k}" for k in range(replicas))
    replays = ",".join(f"tcp://127.0.0.1:{kv + 1 + 2 * k}" for k in range(replicas))
    return ["--intra-node-data-parallel-size", str(replicas),
            "--kv-event-source", f"{base}={pubs}", "--kv-event-replay-source", f"{base}={replays}",
            "--kv-event-block-size", "64", "--kv-event-model", "gpt-oss-20b"]


async def one_run(policy: str, per_port: bool) -> dict:
    kv = free_port_run(6)
    with C.serve("--replicas", "3", "--kv-events-config", kv_config(kv), ports=3) as served:
        replicas = [f"http://127.0.0.1:{served.port + i}" for i in range(3)]
        if policy == "kv_aware" and not per_port:
            workers, extra = [replicas[0]], dp_flags(replicas[0], kv)
        else:
            workers, extra = replicas, []
        with vllm_router(workers, policy, *extra) as router:
            url = f"http://127.0.0.1:{router.port}"
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
                if policy == "power_of_two":
                    served_by = await loaded_replica(http, replicas, url)
                    return {"to_replica_0": served_by.count("0"),
                            "by_replica": dict(sorted(Counter(served_by).items()))}
                placements, hit_rate = await prefix_groups(http, replicas, url)
                return {"hit_rate": round(hit_rate, 3),
                        "groups": {g: dict(sorted(Counter(p).items()))
                                   for g, p in placements.items()},
                        "replicas_used": len({r for p in placements.values() for r in p})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("policy", choices=("power_of_two", "kv_aware"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-port", action="store_true",
                        help="kv_aware: one worker per replica port (discovery) instead of "
                             "the DP-aware mode")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, "
          f"commit {C.commit()}", flush=True)
    for run in range(args.runs):
        result = asyncio.run(one_run(args.policy, args.per_port))
        print(f"run {run + 1}: {json.dumps(result)}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

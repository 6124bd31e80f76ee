"""Scaling the lab over processes: API servers x data-parallel ranks, per core.

Two parts, each against a fresh `inference-lab serve`:

1. `--layouts`: for each A x D (`--api-server-count A --data-parallel-size D`) a closed
   loop of streaming chat requests (stream_fidelity.run_one: 200 tokens each) with the
   whole lab pinned to the cores `--lab-cores` and the load generators to `--load-cores`
   (sched_setaffinity: the lab's processes inherit it), so that what the lab costs is
   read apart from what drives it. Prints the lab's CPU-seconds per 1,000 delivered
   tokens (every engine and API server process, and serve itself) against 1 x 1's, SSE
   events per write, the client's e2e p50 against the modelled one, and the client's
   inter-event gap against the modelled step (ITL).
2. `--burst`: one burst of N non-streaming requests at once over D ranks, each rank with
   `max_num_seqs` S and `--max-waiting` W, no rank named: where each was sent (the
   x-inference-lab-replica header names the rank, 529s included) and what each rank
   admitted. With vLLM's balancer every front end deals its picks out one rank after
   another until the coordinator's next publication (100 ms), and a publication of
   equally loaded ranks keeps it so: each rank gets ~N / D and admits exactly S + W of
   them, in arrival order, and refuses the rest with its own 529.

No pass/fail: it prints figures.

    python benchmarks/scale.py --layouts 1x1,1x2,2x1,2x2 --clients 32 [--duration 5]
        [--lab-cores 0] [--load-cores 1]
    python benchmarks/scale.py --burst 1000 --ranks 4 --max-waiting 16 --max-num-seqs 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import Counter

import aiohttp

import _common as C
import stream_fidelity


def cores(text: str) -> set[int]:
    return {int(c) for c in text.split(",") if c}


def run_layout(api: int, dp: int, args: argparse.Namespace) -> dict:
    flags = f"--api-server-count {api} --data-parallel-size {dp}"
    fidelity = argparse.Namespace(
        serve_args=flags, max_num_seqs=None, loadgen_procs=1, warmup=args.warmup,
        duration=args.duration, max_tokens=args.max_tokens, tail=args.tail, stagger=0.5,
        profile=None, dashboard_feed=0)
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, args.lab_cores)  # serve and its children inherit it
    try:
        original = C.start_loadgens

        def pinned(configs):  # the load generators on their own cores
            os.sched_setaffinity(0, args.load_cores)
            try:
                return original(configs)
            finally:
                os.sched_setaffinity(0, args.lab_cores)

        C.start_loadgens = pinned
        try:
            return stream_fidelity.run_one(args.clients, fidelity)
        finally:
            C.start_loadgens = original
    finally:
        os.sched_setaffinity(0, mine)


def report_layouts(rows: list[tuple[str, dict]]) -> None:
    base = None
    print("\nA x D  tok/s    lab CPU-s/1k tok (vs 1x1)  eng / gw          events/write  "
          "e2e p50 c/m          gap p50 / step (ms)")
    for name, r in rows:
        lab = r["engine_cpu_per_1k_tokens"] + r["gateway_cpu_per_1k_tokens"]
        base = lab if base is None else base
        gap, step = r["gap_p50"], r["step_model_mean"]
        print(f"{name:5}  {r['delivered_tokens_per_s']:>7,.0f}  {lab:.4f} ({100 * (lab / base - 1):+5.1f} %)"
              f"        {r['engine_cpu_per_1k_tokens']:.4f} / {r['gateway_cpu_per_1k_tokens']:.4f}"
              f"   {r['events_per_write']:>5.2f}        "
              f"{stream_fidelity.pct(r['e2e_client_p50'], r['e2e_model_p50']):>8}"
              f"            {stream_fidelity.ms(gap)} / {stream_fidelity.ms(step)}"
              f" (x{gap / step:.2f})")


async def burst(port: int, n: int, max_tokens: int) -> tuple[Counter, Counter]:
    """`n` requests at once; (sent per rank, admitted per rank)."""
    sent: Counter = Counter()
    admitted: Counter = Counter()
    body = {"model": "gpt-oss-20b", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Tell me a long story."}]}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=600)) as http:
        async def one() -> None:
            async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 json=body) as resp:
                rank = resp.headers.get("x-inference-lab-replica", "?")
                sent[rank] += 1
                if resp.status == 200:
                    admitted[rank] += 1
                else:
                    assert resp.status == 529, (resp.status, await resp.text())
                await resp.read()

        await asyncio.gather(*(one() for _ in range(n)))
    return sent, admitted


def run_burst(args: argparse.Namespace) -> None:
    with C.serve("--data-parallel-size", str(args.ranks), "--max-waiting",
                 str(args.max_waiting)) as served:
        served.capacity({"max_num_seqs": args.max_num_seqs})
        started = time.monotonic()
        sent, admitted = asyncio.run(burst(served.port, args.burst, args.burst_tokens))
        wall = time.monotonic() - started
        text = served.engine_metrics()
    refused: Counter = Counter()
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "inference_lab_rejections_total" and s.labels.get("reason") == "QUEUE_SATURATED":
                refused[s.labels["engine"]] += int(s.value)
    per_rank = args.max_num_seqs + args.max_waiting
    print(f"\nburst of {args.burst} over {args.ranks} ranks (max_num_seqs {args.max_num_seqs}, "
          f"max_waiting {args.max_waiting}: {per_rank} places a rank), answered in {wall:.1f} s")
    print("rank  sent  admitted  refused (engine's count)")
    for rank in sorted(sent, key=lambda r: (len(r), r)):
        print(f"{rank:>4}  {sent[rank]:>4}  {admitted[rank]:>8}  {sent[rank] - admitted[rank]:>7}"
              f" ({refused.get(rank, 0)})")
    print(f"all   {sum(sent.values()):>4}  {sum(admitted.values()):>8}  "
          f"{sum(sent.values()) - sum(admitted.values()):>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="", help="A x D pairs, e.g. 1x1,1x2,2x1,2x2")
    parser.add_argument("--clients", type=int, default=32, help="streams in the closed loop")
    C.add_window_arguments(parser, warmup=2.0, duration=5.0)
    parser.add_argument("--tail", type=float, default=30.0)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--lab-cores", type=cores, default={0})
    parser.add_argument("--load-cores", type=cores, default={1})
    parser.add_argument("--burst", type=int, default=0, help="requests in one burst")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--max-waiting", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--burst-tokens", type=int, default=2000,
                        help="max_tokens of each burst request (long: none ends during the burst)")
    args = parser.parse_args()
    print(f"machine: {C.machine()}")
    rows = []
    for pair in [p for p in args.layouts.split(",") if p]:
        api, dp = (int(x) for x in pair.lower().split("x"))
        C.print_load(f"{api} API server(s) x {dp} rank(s), {args.clients} streams")
        r = run_layout(api, dp, args)
        stream_fidelity.report(r, None)
        rows.append((pair, r))
    if rows:
        report_layouts(rows)
    if args.burst:
        run_burst(args)


if __name__ == "__main__":
    main()

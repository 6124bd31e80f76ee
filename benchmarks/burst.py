"""Bursts: N streaming requests at once against an idle lab, admitted vs the modelled engine.

An `inference-lab serve --max-waiting W` (gpt-oss-20b on a modelled B200, max_num_seqs
256 by default) is idle; a client process (`_burst_client.py`) writes N chat requests at
once (`stream`, long replies: none finishes during the burst), on N new connections or on
N kept-alive connections that have each served a GET /health first, and reads every
stream to its end. Per run it prints:

- how many the lab admitted (200) and refused (529), and anything else it answered;
- the modelled engine's answer to the same arrivals: the requests' write instants (on
  loopback within microseconds of the kernel's receive stamp the gateway books) replayed
  through the engine's own core offline (`engine.drivers.offline.admissions`), and how
  many requests the lab judged otherwise than the model;
- whether every admitted stream ended whole (usage.completion_tokens = max_tokens, then
  [DONE]);
- TTFT of the admitted (client write -> first token event) p50 / p99 / max, and when the
  last answer's first byte came;
- the engine's arrivals booked late (`inference_lab_arrival_booked_late_seconds`: how
  many, the worst bucket) over the run;
- CPU seconds of the gateway and the engine over the burst and its streams, and of the
  client process over its whole life (connecting and warming included).

    python benchmarks/burst.py [--n 1000] [--runs 10] [--mode both|new|kept]
        [--max-waiting 64] [--max-tokens 4000] [--time-scale 1]

No pass/fail: the figures go to BENCHMARKS.md with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request

import _common as C

from inference_lab.testing.poll import wait_until
from inference_lab.engine.drivers.offline import admissions
from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.sim.core import EngineCore

CLIENT = C.HERE / "_burst_client.py"
MODEL = "gpt-oss-20b"


def body(max_tokens: int) -> dict:
    return {"model": MODEL, "stream": True, "max_tokens": max_tokens,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Tell me a long story."}]}


def prompt_tokens(base: str) -> int:
    """The prompt length the gateway gives the request (one non-streamed call)."""
    data = json.dumps({**body(1), "stream": False}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=data,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["usage"]["prompt_tokens"]


def booked_late(text: str) -> tuple[float, float]:
    """(count, the upper bound of the highest non-empty bucket) of the booked-late histogram."""
    buckets, count, _ = C.histogram(text, "inference_lab_arrival_booked_late_seconds")
    worst, below = 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative > below:
            worst = le
        below = cumulative
    return count, worst


def idle(served: C.Served, timeout: float = 120.0) -> None:
    wait_until(lambda: all(m["waiting"] == 0 and m["running"] == 0
                           for m in served.capacity()), timeout=timeout, interval=0.2)


def run_once(served: C.Served, args, mode: str, prompt: int, core_args) -> dict:
    idle(served)
    late0 = booked_late(served.engine_metrics())
    fd, out = tempfile.mkstemp(suffix=".burst.json")
    os.close(fd)
    t0 = time.monotonic() + (2.0 if mode == "new" else 2.0 + args.n / 2000)
    cfg = {"host": "127.0.0.1", "port": served.port, "path": "/v1/chat/completions",
           "body": body(args.max_tokens), "n": args.n, "mode": mode, "t0": t0,
           "t_hard": t0 + args.timeout, "out": out}
    pids = {"gateway": [served.gateway_pid], "engine": [served.engine_pid]}
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = subprocess.Popen([sys.executable, str(CLIENT), json.dumps(cfg)],
                              stdin=subprocess.DEVNULL)
    while time.monotonic() < t0 - 0.2 and client.poll() is None:
        time.sleep(0.05)
    cpu0 = C.cpu_snapshot(pids)
    client.wait(timeout=args.timeout + 60)
    cpu1 = C.cpu_snapshot(pids)
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # (the client, reaped: all of it)
    cpu1["client"] = (children1.ru_utime + children1.ru_stime
                      - children0.ru_utime - children0.ru_stime)
    cpu0["client"] = 0.0
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    records = result["records"]
    late1 = booked_late(served.engine_metrics())
    statuses: dict[int, int] = {}
    for r in records:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    admitted = [r for r in records if r["status"] == 200]
    whole = sum(1 for r in admitted if r["ended"] and r["completion_tokens"] == args.max_tokens)
    # The model's answer to the same arrivals (a fresh core, the same deployment).
    start = min(r["t_write"] for r in records if r["t_write"])
    arrivals = [((r["t_write"] - start) * args.time_scale, prompt, args.max_tokens)
                for r in records]
    model = admissions(EngineCore(*core_args), arrivals)
    differ = sum(1 for r, m in zip(records, model) if (r["status"] == 200) != m)
    ttft = sorted(r["t_first_token"] - r["t_write"] for r in admitted if r["t_first_token"])
    answered = [r["t_first_byte"] - start for r in records if r["t_first_byte"]]
    return {
        "mode": mode, "statuses": statuses, "admitted": len(admitted), "model": sum(model),
        "differ": differ, "whole": whole,
        "send_span_ms": (max(r["t_write"] for r in records) - start) * 1e3,
        "ttft_ms": [C.quantile(ttft, 0.5) * 1e3, C.quantile(ttft, 0.99) * 1e3,
                    (ttft[-1] if ttft else 0.0) * 1e3],
        "last_answer_ms": max(answered, default=0.0) * 1e3,
        "booked_late": late1[0] - late0[0], "booked_late_worst_s": late1[1],
        "cpu_s": {k: cpu1[k] - cpu0[k] for k in ("gateway", "engine", "client")},
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="requests per burst (default 1000)")
    parser.add_argument("--runs", type=int, default=10, help="bursts per mode (default 10)")
    parser.add_argument("--mode", choices=("both", "new", "kept"), default="both",
                        help="new connections, kept-alive ones, or alternating (default)")
    parser.add_argument("--max-waiting", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=4000,
                        help="reply length of every request (long: none ends in the burst)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="serve --time-scale (modelled seconds per wall second)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a burst may take to be read whole")
    parser.add_argument("--json", help="write every run's figures here")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * args.n + 256:  # (the client's sockets and the gateway's, when run here)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * args.n + 1024), hard))
    print(f"machine: {C.machine()}")
    C.print_load(f"bursts of {args.n}")
    modes = ["new", "kept"] if args.mode == "both" else [args.mode]
    deployment = default_deployments("b200", args.max_waiting)[0]
    rows = []
    with C.serve("--max-waiting", str(args.max_waiting),
                 "--time-scale", str(args.time_scale)) as served:
        prompt = prompt_tokens(served.base)
        print(f"serve --max-waiting {args.max_waiting} (max_num_seqs "
              f"{deployment.scheduler.max_num_seqs}); prompt {prompt} tokens, "
              f"max_tokens {args.max_tokens}")
        print("run mode  admitted model differ whole statuses            send_ms  "
              "TTFT p50/p99/max ms        last_ms late(worst) cpu gw/eng/client s")
        for run in range(args.runs):
            for mode in modes:
                row = run_once(served, args, mode, prompt, (deployment,))
                rows.append(row)
                ttft = "/".join(f"{v:.0f}" for v in row["ttft_ms"])
                cpu = "/".join(f"{v:.2f}" for v in row["cpu_s"].values())
                print(f"{run:>3} {mode:<5} {row['admitted']:>8} {row['model']:>5} "
                      f"{row['differ']:>6} {row['whole']:>5} {json.dumps(row['statuses']):<20} "
                      f"{row['send_span_ms']:>7.1f}  {ttft:<25} {row['last_answer_ms']:>7.0f} "
                      f"{row['booked_late']:>4.0f}({row['booked_late_worst_s'] * 1e3:.1f}ms) "
                      f"{cpu}", flush=True)
    C.write_json(args.json, {"n": args.n, "max_waiting": args.max_waiting,
                             "max_tokens": args.max_tokens, "runs": rows})
    return rows


if __name__ == "__main__":
    main()

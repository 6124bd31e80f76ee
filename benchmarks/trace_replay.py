"""Trace replay on the wall clock: every request of a trace issued (counted) at its own
instant, and how late: the send delay (from each request's instant in the trace to its
write) p50/p99/max, and the runner's CPU per request.

    python benchmarks/trace_replay.py [--rate 200] [--seconds 20] [--format burstgpt]
    python benchmarks/trace_replay.py --serve   # against a real `inference-lab serve`

The trace is synthetic (Poisson arrivals at --rate for --seconds, BurstGPT's or Azure's
or Mooncake's columns), written to a temporary directory and replayed by the experiment
runner (`arrival_pattern = "trace"`) in this process. By default the server is the stub
of experiment_loadgen.py (a child process answering every request at once), so the
figures are the replay's own; --serve drives a real lab instead (gpt-oss-20b on a
modelled B200, 1-token replies). Prints figures, no pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as C
import experiment_loadgen as L
import numpy as np


def write_trace(where: Path, fmt: str, rate: float, seconds: float, seed: int = 7) -> tuple[Path, int]:
    rng, t, rows = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            break
        rows.append(t)
    if fmt == "mooncake":
        path = where / "trace.jsonl"
        path.write_text("".join(json.dumps({"timestamp": round(x * 1000, 3), "input_length": 16,
                                            "output_length": 1, "hash_ids": [i]}) + "\n"
                                for i, x in enumerate(rows)))
    elif fmt == "azure":
        path = where / "trace.csv"
        day = 36000.0  # 10:00:00 on the trace's day
        lines = []
        for x in rows:
            s = day + x
            lines.append(f"2024-05-10 {int(s // 3600):02d}:{int(s % 3600 // 60):02d}:{s % 60:010.7f},16,1")
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(lines) + "\n")
    else:
        path = where / "trace.csv"
        path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                        + "".join(f"{x:.6f},ChatGPT,16,1,17,API log\n" for x in rows))
    return path, len(rows)


def scenario(where: Path, trace: Path, fmt: str, seconds: float) -> Path:
    path = where / "replay.toml"
    path.write_text(f"""
name = "trace-replay"
duration = {seconds + 1}
model = "gpt-oss-20b"
[load]
arrival_pattern = "trace"
trace_path = "{trace}"
trace_format = "{fmt}"
""")
    return path


async def replay(path: Path, url: str, metrics_url: str | None):
    from inference_lab.experiments.scenario import load_scenario

    return await L.run(load_scenario(path), url, metrics_url)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=200.0, help="requests per second of the trace")
    ap.add_argument("--seconds", type=float, default=20.0, help="the trace's length (at most 120)")
    ap.add_argument("--format", choices=("burstgpt", "azure", "mooncake"), default="burstgpt")
    ap.add_argument("--serve", action="store_true", help="a real `inference-lab serve`, not the stub")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    seconds = min(max(args.seconds, 1.0), 120.0)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        trace, rows = write_trace(where, args.format, args.rate, seconds)
        path = scenario(where, trace, args.format, seconds)
        if args.serve:
            with C.serve(max_waiting=0) as served:
                req, cpu, wall, _ = asyncio.run(replay(path, served.base, None))
        else:
            stub = subprocess.Popen([sys.executable, "-c", L.STUB], stdout=subprocess.PIPE, text=True)
            try:
                port = int(stub.stdout.readline())
                req, cpu, wall, _ = asyncio.run(replay(path, f"http://127.0.0.1:{port}", None))
            finally:
                stub.terminate()
                stub.wait(10)
    delays = np.array(req["send_delay_ms"])
    status = np.array(req["status"])
    figures = {
        "format": args.format, "rate": args.rate, "seconds": seconds, "trace_rows": rows,
        "issued": int(delays.size), "ok": int(np.count_nonzero(status == 200)),
        "send_delay_p50_ms": float(np.percentile(delays, 50)),
        "send_delay_p99_ms": float(np.percentile(delays, 99)),
        "send_delay_max_ms": float(delays.max()),
        "cpu_us_per_request": cpu / max(delays.size, 1) * 1e6, "server": "serve" if args.serve else "stub",
        "load_average": C.load_average(), "commit": L.commit(),
        "measured_at": time.strftime("%Y-%m-%d"),
    }
    C.write_json(args.json, figures)
    print(f"trace of {rows} requests at {args.rate:g}/s for {seconds:g} s ({args.format}): "
          f"{figures['issued']} issued, {figures['ok']} answered 200")
    print(f"send delay p50 {figures['send_delay_p50_ms']:.3f} ms, p99 {figures['send_delay_p99_ms']:.3f} ms, "
          f"max {figures['send_delay_max_ms']:.3f} ms; runner CPU {figures['cpu_us_per_request']:.0f} us/request "
          f"(load average {' '.join(figures['load_average'])})")


if __name__ == "__main__":
    main()

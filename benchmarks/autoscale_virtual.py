"""A day of traffic in virtual time: a diurnal trace (Poisson arrivals whose rate follows
a sine over 24 hours, `--mean-rate` on average) through Kubernetes' HPA on up to 16
replicas of Llama 3.1 70B on H100s (4 per replica), run with `experiment --virtual`;
how fast: modelled seconds per wall second and per CPU second (one core), engine steps,
and what the day cost (SLO attainment, GPU-hours, cold starts, cost against the oracle).

    python benchmarks/autoscale_virtual.py                      # the whole day
    python benchmarks/autoscale_virtual.py --start-hour 11 --hours 1   # one hour of it

The trace is written in BurstGPT's columns to a temporary directory (a day at 25
requests/s is 2.2 million rows); `--start-hour` / `--hours` replay a window of it
(`trace_window`), so a slice of the day is measured without the rest. Prints figures, no
pass/fail.
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time
from pathlib import Path

import _common as C

DAY = 86_400.0


def write_day(path: Path, mean_rate: float, swing: float, seed: int = 24) -> int:
    """Arrivals of a day by thinning at the peak: rate(t) = mean x (1 - swing x cos(2 pi t / day)),
    lowest at midnight, highest at noon; lengths lognormal (prompt ~930, reply ~235 tokens)."""
    rng = random.Random(seed)
    peak = mean_rate * (1 + swing)
    t, n = 0.0, 0
    with open(path, "w") as f:
        f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        while True:
            t += rng.expovariate(peak)
            if t >= DAY:
                return n
            if rng.random() * peak > mean_rate * (1 - swing * math.cos(2 * math.pi * t / DAY)):
                continue
            prompt = max(1, round(rng.lognormvariate(6.5, 0.8)))
            reply = max(1, round(rng.lognormvariate(5.3, 0.6)))
            f.write(f"{t:.3f},ChatGPT,{prompt},{reply},{prompt + reply},Conversation log\n")
            n += 1


def scenario(where: Path, trace: Path, start: float, hours: float) -> Path:
    path = where / "day.toml"
    window = f"trace_window = [{start}, {start + hours * 3600}]" if hours < 24 else ""
    path.write_text(f"""
name = "autoscaling-day-trace"
duration = {hours * 3600}
model = "llama-3.1-70b"
window = 300
scrape_interval = 60
{C.llama70b_server()}
[load]
arrival_pattern = "trace"
trace_path = "{trace}"
trace_format = "burstgpt"
{window}
[fleet]
replicas = 2
max_replicas = 16
startup_delay = "auto"
[autoscaler]
name = "hpa"
params = {{ metric = "vllm:num_requests_running", target = 32 }}
[slo]
ttft_s = 2.0
e2e_s = 30.0
window = 300
""")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mean-rate", type=float, default=25.0, help="requests/s over the day (>= 20)")
    ap.add_argument("--swing", type=float, default=0.8, help="the rate goes from mean x (1 - swing) to mean x (1 + swing)")
    ap.add_argument("--start-hour", type=float, default=0.0)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--out", type=Path, help="keep the run directory here")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    hours = min(max(args.hours, 0.01), 24.0 - args.start_hour)
    from inference_lab.experiments.experiment import run_virtual
    from inference_lab.experiments.scenario import load_scenario

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        t0 = time.perf_counter()
        rows = write_day(where / "day.csv", args.mean_rate, args.swing)
        written = time.perf_counter() - t0
        sc = load_scenario(scenario(where, where / "day.csv", args.start_hour * 3600, hours))
        out = args.out or where / "run"
        summary = run_virtual(sc, out, lambda line: print(f"  {line}", flush=True))
    run, auto = summary["virtual_run"], summary["autoscaling"]
    figures = {
        "trace_rows_day": rows, "mean_rate": args.mean_rate, "start_hour": args.start_hour,
        "hours": hours, "requests": auto["requests"], "wall_s": run["wall_s"], "cpu_s": run["cpu_s"],
        "speed_wall": run["speed"], "speed_cpu": sc.duration / run["cpu_s"],
        "engine_steps": run["engine_steps"], "attainment": auto["attainment"],
        "gpu_hours": auto["gpu_hours"], "cold_starts": auto["cold_starts"],
        "peak_replicas": auto["peak_replicas"], "cost_vs_oracle": auto["cost_vs_oracle"],
        "trace_written_s": written, "load_average": C.load_average(),
    }
    print(f"{hours:g} h from hour {args.start_hour:g} of a {rows:,}-request day "
          f"({args.mean_rate:g}/s mean): {auto['requests']:,} requests in {run['wall_s']:.0f} s wall, "
          f"{run['cpu_s']:.0f} s CPU: {figures['speed_wall']:,.0f} x real time on the wall, "
          f"{figures['speed_cpu']:,.0f} x per CPU second; {run['engine_steps']:,} engine steps")
    print(f"attainment {100 * (auto['attainment'] or 0):.2f} %, {auto['gpu_hours']:.1f} GPU-hours, "
          f"{auto['cold_starts']} cold starts, peak {auto['peak_replicas']} replicas, cost vs oracle "
          f"{auto['cost_vs_oracle'] or 0:.2f} x (load average {' '.join(figures['load_average'])})")
    C.write_json(args.json, figures)


if __name__ == "__main__":
    main()

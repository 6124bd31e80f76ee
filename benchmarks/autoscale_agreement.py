"""Virtual time against the wall clock: one scenario (ten minutes: a spike from 8 to 30
requests/s and back, Llama 3.1 70B on H100s behind Kubernetes' HPA) run with `experiment
--virtual` and with `--serve --time-scale K` (a minute on the wall at K = 10); how well
they agree: the replica timeline (each scaling decision's time and target), SLO
attainment and GPU-hours.

    python benchmarks/autoscale_agreement.py [--minutes 10] [--time-scale 10]

Prints both runs' figures and the differences (the issue's bar: each decision within one
sync period, attainment within 5 points, GPU-hours within 5 %), no pass/fail.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import _common as C
import pyarrow.parquet as pq



def scenario(where: Path, minutes: float) -> Path:
    d = minutes * 60
    a, b = 0.3 * d, 0.6 * d
    path = where / "agreement.toml"
    path.write_text(f"""
name = "autoscaling-agreement"
duration = {d}
model = "llama-3.1-70b"
window = 10
scrape_interval = 5
{C.llama70b_server()}
[load]
arrival_pattern = "poisson"
rate_schedule = {{ type = "trace", points = [[0, 8], [{a}, 8], [{a + 0.001}, 30], [{b}, 30], [{b + 0.001}, 8], [{d}, 8]] }}
input_len_dist = {{ type = "lognormal", mean = 6.5, std_dev = 0.8 }}
output_len_dist = {{ type = "lognormal", mean = 5.3, std_dev = 0.6 }}
seed = 21
[fleet]
replicas = 1
max_replicas = 8
startup_delay = "auto"
[autoscaler]
name = "hpa"
params = {{ metric = "vllm:num_requests_running", target = 32, scale_down = {{ stabilizationWindowSeconds = 60 }} }}
[slo]
ttft_s = 2.0
e2e_s = 30.0
window = 60
""")
    return path


def run(path: Path, out: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-P", "-m", "inference_lab", "experiment", str(path),
                           *args, "--out", str(out)], capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise SystemExit(done.stdout + done.stderr)
    summary = json.loads((out / "summary.json").read_text())
    scaling = pq.read_table(out / "scaling.parquet").to_pydict()
    return {"attainment": summary["autoscaling"]["attainment"],
            "gpu_hours": summary["autoscaling"]["gpu_hours"],
            "requests": summary["autoscaling"]["requests"],
            "decisions": list(zip(scaling["t"], scaling["to"]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        path = scenario(where, min(max(args.minutes, 1.0), 30.0))
        virtual = run(path, where / "virtual", "--virtual")
        served = run(path, where / "served", "--serve", "--time-scale", repr(args.time_scale))
    pairs = list(zip(virtual["decisions"], served["decisions"]))
    figures = {
        "virtual": virtual, "served": served, "time_scale": args.time_scale,
        "same_targets": [v[1] for v in virtual["decisions"]] == [s[1] for s in served["decisions"]],
        "max_decision_gap_s": max((abs(v[0] - s[0]) for v, s in pairs), default=0.0),
        "attainment_points": 100 * abs(virtual["attainment"] - served["attainment"]),
        "gpu_hours_rel": abs(virtual["gpu_hours"] - served["gpu_hours"]) / served["gpu_hours"],
        "load_average": C.load_average(),
    }
    for name in ("virtual", "served"):
        r = figures[name]
        print(f"{name:8s}: {r['requests']} requests, attainment {100 * r['attainment']:.2f} %, "
              f"{r['gpu_hours']:.3f} GPU-hours, decisions " +
              " ".join(f"{t:.1f}s->{n}" for t, n in r["decisions"]))
    print(f"same targets in order: {figures['same_targets']}; largest gap between paired decisions "
          f"{figures['max_decision_gap_s']:.2f} s; attainment differs by {figures['attainment_points']:.2f} "
          f"points; GPU-hours by {100 * figures['gpu_hours_rel']:.2f} % (load average "
          f"{' '.join(figures['load_average'])})")
    C.write_json(args.json, figures)


if __name__ == "__main__":
    main()

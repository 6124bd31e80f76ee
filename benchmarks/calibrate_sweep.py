"""`inference-lab calibrate` on three rows of a public sweep, checked on the others.

    python benchmarks/calibrate_sweep.py [--fit-at 4,32,128] [--start generic|preset]
                                         [--max-iter 10] [--jobs 2] [--keep DIR]

Takes one closed-loop concurrency sweep of real vLLM (default: InferenceMAX's gpt-oss-120b
on one B200, vLLM 0.11, 8192 / 1024 tokens, range ratio 0.8, max_num_seqs 512, prefix
caching off: inference_lab/calibrate/data/inferencemax-gpt-oss-120b-b200.toml), writes the rows at the
--fit-at concurrencies as a calibrate CSV and the others as a --check CSV, runs the real
`inference-lab calibrate` on them, and prints each held-out row's TPOT and TTFT error and
whether it is within 15 % (TPOT) and 30 % (TTFT).

--start generic (the default) fits from the generic start, a copy of the b200 preset
without its [calibration] in a user catalog: the shipped b200 calibration was fitted on
rows of this very sweep, so starting from it would not be a fair test. --start preset
starts from the shipped b200 calibration, as a user of a B200 would.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "inference_lab" / "calibrate" / "data" / "inferencemax-gpt-oss-120b-b200.toml"
DEPLOYMENT = "gpt-oss-120b-b200-tp1-8k1k"
TARGETS = {"tpot_ms": 0.15, "ttft_p50_ms": 0.30}


def sweep_rows() -> list[dict]:
    data = tomllib.loads(DATA.read_text())
    return sorted((r for r in data["rows"] if r["deployment"] == DEPLOYMENT),
                  key=lambda r: r["concurrency"])


def write_csv(path: Path, rows: list[dict]) -> None:
    lines = ["concurrency,input_len,output_len,ttft_ms,tpot_ms,num_prompts,ttft_p50_ms"]
    for r in rows:
        mean = (1 + r["range_ratio"]) / 2  # uniform over [ratio L, L]
        lines.append(f"{r['concurrency']},{r['input'] * mean:g},{r['output'] * mean:g},{r['ttft_ms']},"
                     f"{r['tpot_ms']},{r['requests']},{r['ttft_p50_ms']}")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit-at", default="4,32,128", help="concurrencies to fit (comma-separated)")
    parser.add_argument("--start", choices=("generic", "preset"), default="generic")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--max-iter", type=int, default=10, help="calibrate's --max-iter")
    parser.add_argument("--keep", type=Path, help="keep the CSVs and the written preset here")
    args = parser.parse_args()
    fit_at = {int(c) for c in args.fit_at.split(",")}
    rows = sweep_rows()
    fitted = [r for r in rows if r["concurrency"] in fit_at]
    checked = [r for r in rows if r["concurrency"] not in fit_at]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        write_csv(work / "fit.csv", fitted)
        write_csv(work / "check.csv", checked)
        catalog = work / "catalog"
        hw = "b200"
        if args.start == "generic":
            text = (ROOT / "engine" / "sim" / "presets" / "hardware" / "b200.toml").read_text()
            (catalog / "hardware").mkdir(parents=True, exist_ok=True)
            (catalog / "hardware" / "b200-uncalibrated.toml").write_text(text.split("\n[calibration]")[0] + "\n")
            hw = "b200-uncalibrated"
        cmd = [sys.executable, "-m", "inference_lab", "calibrate", str(work / "fit.csv"),
               "--check", str(work / "check.csv"), "--model", "gpt-oss-120b", "--hardware", hw,
               "--max-num-seqs", "512", "--max-num-batched-tokens", "8192", "--max-model-len", "9416",
               "--no-prefix-caching", "--range-ratio", "0.8", "--name", "sweep-b200",
               "-o", str(catalog), "--jobs", str(args.jobs), "--max-iter", str(args.max_iter)]
        if args.start == "generic":
            cmd[4:4] = ["--catalog", str(catalog)]
        print("$ inference-lab " + " ".join(cmd[3:]), flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        print(proc.stdout)
        if proc.returncode:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
    held = proc.stdout.split("held out (--check, not fitted):")[1]
    worst = {k: 0.0 for k in TARGETS}
    print(f"fitted at concurrency {sorted(fit_at)}; predicted:")
    for line in held.splitlines():
        m = re.match(r"c=(\d+) \S+\s+(\w+)\s+([\d.]+)\s+([\d.]+)\s+([+-][\d.]+)%", line.strip())
        if m and m.group(2) in TARGETS:
            err = float(m.group(5)) / 100
            worst[m.group(2)] = max(worst[m.group(2)], abs(err))
            ok = "within" if abs(err) <= TARGETS[m.group(2)] else "OUTSIDE"
            print(f"  c={m.group(1):>4s} {m.group(2):12s} measured {float(m.group(3)):8.2f} "
                  f"predicted {float(m.group(4)):8.2f} error {err:+6.1%} ({ok} "
                  f"{TARGETS[m.group(2)]:.0%})")
    print("largest: " + ", ".join(f"{k} {v:.1%} (target {TARGETS[k]:.0%})" for k, v in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

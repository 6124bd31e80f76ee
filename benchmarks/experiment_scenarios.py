"""The shipped experiment scenarios as benchmarks: the reference page's experiment (fixed
controller; the page says ~293 ms, then ~646 ms p50 end to end) and the capacity step
(AIMD: seconds after each capacity change until its limit is, and stays for 90 % of the
rest of the phase, between max_num_seqs and max_num_seqs + max_waiting); the multi-turn
chat (the prompt tokens the server's prefix cache served beside the oracle's hit rate);
and the slow replica (goodput and e2e p50 per phase against the oracle, which models the
slowdown and not the errors or the stall).

    python benchmarks/experiment_scenarios.py [--only reference|step|multi-turn|faults]
                                              [--time-scale 1] [--out DIR] [--json FILE]

Runs `inference-lab experiment SCENARIO --serve` (a private server on free ports) and
reads its summary.json. Prints figures, no pass/fail. 60 modelled seconds each, so
60 / K wall seconds plus start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE_MS = (293.0, 646.0)


def run(scenario: str, out: Path, scale: float) -> dict:
    cmd = [sys.executable, "-P", "-m", "inference_lab", "experiment",
           str(ROOT / "configs" / "experiments" / f"{scenario}.toml"), "--serve",
           "--time-scale", str(scale), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=tuple(SCENARIOS))
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--out", type=Path, help="keep the run directories here")
    ap.add_argument("--json", help="write every scenario's phases to this file")
    args = ap.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="experiment-bench-"))
    print(f"time scale {args.time_scale:g}, load average {os.getloadavg()[0]:.2f}, runs in {base}")
    phases = {}
    for key, (scenario, line) in SCENARIOS.items():
        if args.only in (None, key):
            summary = run(scenario, base / scenario, args.time_scale)
            phases[key] = summary["phases"]
            for i, phase in enumerate(summary["phases"]):
                print(f"{scenario:<14} {line(i, phase)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"time_scale": args.time_scale, "page_ms": PAGE_MS, "phases": phases}, f,
                      indent=1, default=str)


def _reference(i: int, phase: dict) -> str:
    st, page = phase["steady"], PAGE_MS[i]
    p50 = st["e2e_p50_s"] * 1000
    return (f"{phase['action']:>22}: e2e p50 {p50:6.1f} ms (page {page:.0f}, "
            f"{100 * (p50 / page - 1):+.1f} %), modelled p50 {st['modelled_e2e_p50_s'] * 1000:.1f} ms, "
            f"goodput {st['goodput_tok_s']:,.0f} tok/s (oracle {phase['oracle']['goodput_tok_s']:,.0f})")


def _step(i: int, phase: dict) -> str:
    st, sc = phase["steady"], phase["scores"]
    settle = sc["band_settle_s"]
    return (f"{phase['action']:>22}: AIMD into [{phase['band'][0]}, {phase['band'][1]}] after "
            f"{'never' if settle is None else f'{settle:.2f} s'}, limit p50 {st['limit_p50']:.0f}, "
            f"in band {100 * (phase['limit_in_band'] or 0):.0f} % of the second half, "
            f"529 {100 * st['frac_529']:.1f} %, goodput score {sc['goodput']:.2f}; "
            f"529 round trip p50/p99 {_ms(st['refusal_rtt_p50_s'])}/{_ms(st['refusal_rtt_p99_s'])} ms, "
            f"delivery lag p99 {_ms(st['delivery_lag_p99_s'])} ms")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _multi_turn(i: int, phase: dict) -> str:
    st, o = phase["steady"], phase["oracle"]
    return (f"{phase['action']:>22}: cached {100 * st['cached_frac']:.1f} % of "
            f"prompt tokens (oracle {100 * o['cache_hit_rate']:.1f} %), mean prompt "
            f"{st['prompt_tokens_mean']:.0f} tokens, e2e p50 {st['e2e_p50_s'] * 1000:.0f} ms "
            f"(oracle {o['e2e_p50_s'] * 1000:.0f}), goodput score {phase['scores']['goodput']:.2f}")


def _faults(i: int, phase: dict) -> str:
    st, o = phase["steady"], phase["oracle"]
    e2e = "-" if st["e2e_p50_s"] is None else f"{st['e2e_p50_s'] * 1000:.0f}"
    return (f"{phase['action']:>34}: fault [{phase['fault'] or '-'}], "
            f"limit p50 {st['limit_p50']:.0f}, goodput score {phase['scores']['goodput']:.2f}, "
            f"e2e p50 {e2e} ms (oracle {o['e2e_p50_s'] * 1000:.0f}"
            f"{'' if o['fault_modelled'] else ', fault-free'}), 529 {100 * st['frac_529']:.1f} %")


# --only key: (the shipped scenario, its line per phase)
SCENARIOS = {"reference": ("reference-page", _reference), "step": ("capacity-step", _step),
             "multi-turn": ("multi-turn", _multi_turn), "faults": ("slow-replica", _faults)}

if __name__ == "__main__":
    main()

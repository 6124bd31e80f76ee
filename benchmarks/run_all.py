"""Every benchmark in sequence, then one summary table (figures next to the issue's targets).

    python benchmarks/run_all.py [--clients 24,256,1024] [--duration 10] [--rate 2000]
        [--sim-requests N] [--json FILE]

Order: the bare SSE ceiling first (d: sse_ceiling.py), so that stream fidelity (a:
stream_fidelity.py) is compared with a ceiling measured in the same run; then the refusal
path (b: refusal_path.py) and the offline simulator (c: sim_speed.py). Each prints its own
report as it goes. No pass/fail: the last column says whether a figure meets the target.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys

import _common as C
import refusal_path
import sse_ceiling
import stream_fidelity


def sim_speed(requests: int | None) -> float:
    cmd = [sys.executable, str(C.HERE / "sim_speed.py")]
    if requests:
        cmd += ["--requests", str(requests)]
    out = subprocess.run(cmd, cwd=C.ROOT, text=True, capture_output=True, timeout=1800)
    print(out.stdout, end="", flush=True)
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        return float("nan")
    m = re.search(r"simulated output tokens per CPU-second: ([\d,]+)", out.stdout)
    return float(m.group(1).replace(",", "")) if m else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="24,256,1024")
    parser.add_argument("--duration", type=float, default=10.0, help="stream fidelity window")
    parser.add_argument("--rate", type=float, default=2000.0, help="refusal path rate")
    parser.add_argument("--sim-requests", type=int, help="sim_speed --requests")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()
    print(f"machine: {C.machine()}\n", flush=True)

    print("== d. bare aiohttp SSE ceiling (sse_ceiling.py)", flush=True)
    ceil = sse_ceiling.main([])
    ceiling = ceil[0]["events_per_cpu_s"]

    print("\n== a. stream fidelity (stream_fidelity.py)", flush=True)
    fid = stream_fidelity.main(["--clients", args.clients, "--duration", str(args.duration),
                                "--ceiling", str(ceiling)])

    print("\n== b. refusal path (refusal_path.py)", flush=True)
    ref = refusal_path.main(["--rate", str(args.rate)])

    print("\n== c. offline simulator (sim_speed.py)", flush=True)
    C.print_load("sim_speed")
    sim = sim_speed(args.sim_requests)

    rows: list[tuple[str, str, str, str]] = []

    def row(name: str, value: str, target: str, ok: bool | None) -> None:
        rows.append((name, value, target, "n/a" if ok is None else "yes" if ok else "NO"))

    def within(a: float, b: float, tol: float) -> bool | None:
        if not b or math.isnan(a) or math.isnan(b):
            return None
        return abs(a / b - 1) <= tol

    for r in fid["results"]:
        n = r["clients"]
        row(f"{n} streams: delivered tokens/s", f"{r['delivered_tokens_per_s']:,.0f}",
            f"(engine {r['engine_tokens_per_s']:,.0f}/s)", None)
        row(f"{n} streams: TTFT p50 client / modelled",
            f"{r['ttft_client_p50'] * 1e3:.1f} / {r['ttft_model_p50'] * 1e3:.1f} ms "
            f"(median ratio {r['ttft_ratio_median']:.2f})", "within 5 %",
            within(r["ttft_client_p50"], r["ttft_model_p50"], 0.05) if n >= 256 else None)
        row(f"{n} streams: e2e p50 client / modelled",
            f"{r['e2e_client_p50'] * 1e3:.0f} / {r['e2e_model_p50'] * 1e3:.0f} ms "
            f"(median ratio {r['e2e_ratio_median']:.3f})", "within 5 %",
            within(r["e2e_client_p50"], r["e2e_model_p50"], 0.05) if n >= 256 else None)
        row(f"{n} streams: client inter-event gap p50 / p90 / p99 vs modelled step",
            f"{r['gap_p50'] * 1e3:.2f} / {r['gap_p90'] * 1e3:.2f} / {r['gap_p99'] * 1e3:.2f} ms "
            f"vs {r['step_model_mean'] * 1e3:.2f} ms", "p50 within 10 % (<= 64 streams)",
            within(r["gap_p50"], r["step_model_mean"], 0.10) if n <= 64 else None)
        row(f"{n} streams: SSE events per write", f"{r['events_per_write']:.2f}",
            "<= 1.05 (<= 64 streams)", r["events_per_write"] <= 1.05 if n <= 64 else None)
        row(f"{n} streams: TTFT client - modelled p50", f"{r['ttft_over_model_p50'] * 1e3:.2f} ms",
            "<= 0.7 ms at 24, <= 3 ms at 256",
            r["ttft_over_model_p50"] <= (0.0007 if n <= 24 else 0.003) if n in (24, 256) else None)
        row(f"{n} streams: TTFT / e2e p99 client", f"{r['ttft_client_p99'] * 1e3:.1f} / "
            f"{r['e2e_client_p99'] * 1e3:.0f} ms", "", None)
        row(f"{n} streams: pacing lag p99",
            f"{'>' if r['lag_p99_overflow'] else ''}{r['lag_p99'] * 1e3:.2f} ms", "< 10 ms",
            (r["lag_p99"] < 0.010 and not r["lag_p99_overflow"]) if n >= 256 else None)
        row(f"{n} streams: CPU-s per 1k tokens engine / gateway",
            f"{r['engine_cpu_per_1k_tokens']:.4f} / {r['gateway_cpu_per_1k_tokens']:.4f}",
            f"(cores {r['cpu_frac']['engine']:.2f} / {r['cpu_frac']['gateway']:.2f}, "
            f"loadgen {r['cpu_frac']['loadgen']:.2f})", None)
        row(f"{n} streams: gateway SSE events per CPU-s",
            f"{r['gateway_events_per_cpu_s']:,.0f} "
            f"({100 * r['gateway_events_per_cpu_s'] / ceiling:.0f} % of {ceiling:,.0f})",
            ">= 50 % of ceiling", r["gateway_events_per_cpu_s"] >= 0.5 * ceiling)
    for c in ceil:
        row(f"bare aiohttp ceiling, {sse_ceiling.label(c)}",
            f"{c['events_per_cpu_s']:,.0f} events/CPU-s", "", None)
    row("529 latency p50 / p99 (client)",
        f"{ref['lat_p50'] * 1e3:.2f} / {ref['lat_p99'] * 1e3:.2f} ms", "p99 < 2 ms",
        ref["lat_p99"] < 0.002)
    if ref.get("floor"):
        fl = ref["floor"]
        row("bare aiohttp 529 floor p50 / p99 (same run)",
            f"{fl['p50'] * 1e3:.2f} / {fl['p99'] * 1e3:.2f} ms "
            f"({fl['server_us_per_request']:.0f} CPU-us per request)", "", None)
    row("refusals achieved", f"{ref['completed_529_rate']:,.0f}/s (sent {ref['sent_rate']:,.0f}/s)",
        f"{args.rate:,.0f}/s", ref["completed_529_rate"] >= 0.98 * args.rate)
    row("refusal CPU cores gateway / engine / loadgen",
        f"{ref['cpu_frac']['gateway']:.2f} / {ref['cpu_frac']['engine']:.2f} / "
        f"{ref['cpu_frac']['loadgen']:.2f}", "", None)
    row("offline simulator", f"{sim:,.0f} output tok/CPU-s", ">= 2,000,000",
        None if math.isnan(sim) else sim >= 2_000_000)

    w = [max(len(r[i]) for r in rows + [("figure", "value", "target", "met")]) for i in range(4)]
    print(f"\n== summary ({C.machine()})")
    line = lambda r: "  ".join(x.ljust(w[i]) for i, x in enumerate(r))  # noqa: E731
    print(line(("figure", "value", "target", "met")))
    print("  ".join("-" * x for x in w))
    for r in rows:
        print(line(r))
    C.write_json(args.json, {"machine": C.machine(), "ceiling": ceil, "stream_fidelity": fid,
                             "refusal_path": ref, "sim_speed": sim, "summary": rows})


if __name__ == "__main__":
    main()

"""Run the benchmarks of BENCHMARKS.md and refresh its tables.

    python benchmarks/run_all.py --list
    python benchmarks/run_all.py [--only NAME[,NAME]] [--write] [--quick] [--file PATH] [--json FILE]

Each benchmark in REGISTRY is one or more commands of a script in this folder; each is run
as its own process with `--json FILE` (its report still prints as it goes), and the
figures it wrote become the rows of one table: what, figure, target, met. Without
`--write` the tables are printed; with it, each benchmark's table in BENCHMARKS.md (between
`<!-- bench:NAME -->` and `<!-- /bench:NAME -->`) is replaced as soon as that benchmark
has run, with the command, the commit (`+dirty` when tracked files other than
BENCHMARKS.md differ from it) and the machine. Text outside the markers is kept as is; a
missing marker stops the run before anything is measured. `--quick` runs every command
with short durations to check that the scripts and the parsing work: its figures are not
results, so it writes only to another file (`--file`). The figures mean most on a quiet
machine: each script prints the load average and the CPU other processes took.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import _common as C
from _tables import MarkerError, Row, block_names, render, replace_block

RESULTS = C.ROOT / "BENCHMARKS.md"
Argv = tuple[str, ...]


@dataclass(frozen=True)
class Bench:
    name: str  # the marker name in BENCHMARKS.md
    measures: str  # one line, for --list
    commands: tuple[Argv, ...]  # arguments of `python`, each run with --json FILE appended
    rows: Callable[[list[dict]], list[Row]]  # the figures, from each command's JSON in order
    quick: tuple[Argv, ...] = ()  # the same commands with short durations (default: as is)
    minutes: float = 1.0  # about how long the commands take together


# ---- formatting ----------------------------------------------------------------------------------
def ms(seconds: float, digits: int = 1) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.{digits}f}"


def pct(a: float, b: float) -> str:
    return "n/a" if not b or math.isnan(a) or math.isnan(b) else f"{100 * (a / b - 1):+.1f} %"


def span(values: list[float], fmt: str = "{:,.0f}") -> str:
    """"a" when every value formats the same, else "least–greatest"."""
    if not values:
        return "n/a"
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


def within(a: float, b: float, tolerance: float) -> bool | None:
    if not b or math.isnan(a) or math.isnan(b):
        return None
    return abs(a / b - 1) <= tolerance


# ---- rows of each benchmark ----------------------------------------------------------------------
def stream_rows(res: list[dict]) -> list[Row]:
    rows = []
    for r in res[0]["results"]:
        n = r["clients"]
        over = r["ttft_over_model_p50"]
        ttft_target = {24: 0.0007, 256: 0.003}.get(n)
        rows.append(Row(f"{n} streams: TTFT client − modelled, p50", f"{ms(over)} ms",
                        f"≤ {ttft_target * 1e3:g} ms" if ttft_target else "none",
                        over <= ttft_target if ttft_target else None))
        few = n <= 64
        rows.append(Row(f"{n} streams: SSE events per write", f"{r['events_per_write']:.2f}",
                        "≤ 1.05" if few else "none", r["events_per_write"] <= 1.05 if few else None))
        rows.append(Row(f"{n} streams: inter-event gap p50 / p90 / p99 (modelled step)",
                        f"{ms(r['gap_p50'])} / {ms(r['gap_p90'])} / {ms(r['gap_p99'])} ms "
                        f"({ms(r['step_model_mean'])} ms)",
                        "p50 within 10 % of the step" if few else "none",
                        within(r["gap_p50"], r["step_model_mean"], 0.10) if few else None))
        many = n >= 256
        rows.append(Row(f"{n} streams: e2e p50 client / modelled",
                        f"{ms(r['e2e_client_p50'])} / {ms(r['e2e_model_p50'])} ms "
                        f"({pct(r['e2e_client_p50'], r['e2e_model_p50'])})",
                        "within 3 %" if many else "none",
                        within(r["e2e_client_p50"], r["e2e_model_p50"], 0.03) if many else None))
        rows.append(Row(f"{n} streams: TTFT p50 client / modelled",
                        f"{ms(r['ttft_client_p50'])} / {ms(r['ttft_model_p50'])} ms"))
        rows.append(Row(f"{n} streams: delivered tokens/s (the engine's)",
                        f"{r['delivered_tokens_per_s']:,.0f} ({r['engine_tokens_per_s']:,.0f})"))
        lag = r["lag_p99"]
        rows.append(Row(f"{n} streams: pacing lag p99",
                        f"{'>' if r['lag_p99_overflow'] else ''}{ms(lag)} ms",
                        "< 10 ms" if many else "none",
                        (lag < 0.010 and not r["lag_p99_overflow"]) if many else None))
        cf = r["cpu_frac"]
        rows.append(Row(f"{n} streams: CPU-s per 1,000 tokens engine / gateway (cores)",
                        f"{r['engine_cpu_per_1k_tokens']:.4f} / {r['gateway_cpu_per_1k_tokens']:.4f} "
                        f"({cf['engine']:.2f} / {cf['gateway']:.2f}; other processes "
                        f"{cf['others']:.2f})"))
    return rows


def ceiling_rows(res: list[dict]) -> list[Row]:
    rows = []
    for c in res[0]["results"]:
        t = c["interval_s"]
        how = ("back to back" if t < 0 else "paced, one task wake-up per write" if t == 0
               else f"paced every {t * 1e3:g} ms")
        rows.append(Row(f"bare aiohttp SSE server, {c['per_write']} event(s) per write, {how}",
                        f"{c['events_per_cpu_s']:,.0f} events per server CPU-s (runs: "
                        f"{', '.join(f'{x:,.0f}' for x in c.get('runs', []))})"))
    return rows


def refusal_rows(res: list[dict]) -> list[Row]:
    r = res[0]["result"]
    f = r.get("floor")
    rows = [Row("529 latency p50 / p99 (write → response)",
                f"{ms(r['lat_p50'], 2)} / {ms(r['lat_p99'], 2)} ms",
                "p50 ≤ floor p50 + 0.15 ms, p99 ≤ 2 × floor p99",
                (r["lat_p50"] <= f["p50"] + 0.00015 and r["lat_p99"] <= 2 * f["p99"]) if f else None)]
    if f:
        rows.append(Row("the floor, same run: bare aiohttp answering the same 529 "
                        "(`refusal_floor.py`) p50 / p99",
                        f"{ms(f['p50'], 2)} / {ms(f['p99'], 2)} ms, "
                        f"{f['server_us_per_request']:.0f} server CPU-µs per request"))
    rate = r["target_rate"]
    rows.append(Row(f"529s completed per second at {rate:,.0f} offered",
                    f"{r['completed_529_rate']:,.0f}/s (statuses "
                    f"{', '.join(f'{k}: {v:,}' for k, v in sorted(r['statuses'].items()))})",
                    f"{rate:,.0f}/s", r["completed_529_rate"] >= 0.98 * rate))
    rows.append(Row("CPU-µs per refusal: gateway (net of the held streams) / engine",
                    f"{r['cpu_us_per_refusal']['gateway']:.0f} "
                    f"({r['net_cpu_us_per_refusal']['gateway']:.0f}) / "
                    f"{r['cpu_us_per_refusal']['engine']:.0f}"))
    return rows


def burst_rows(res: list[dict]) -> list[Row]:
    out = res[0]
    runs = out["runs"]
    admitted = [r["admitted"] for r in runs]
    model = [r["model"] for r in runs]
    close = sum(1 for r in runs if abs(r["admitted"] - r["model"]) <= 2)
    modes = {m: sum(1 for r in runs if r["mode"] == m) for m in ("new", "kept")}
    statuses = sorted({int(s) for r in runs for s in r["statuses"]})
    whole, served = sum(r["whole"] for r in runs), sum(admitted)
    cpu = {k: [r["cpu_s"][k] for r in runs] for k in ("gateway", "engine", "client")}
    return [
        Row(f"admitted of {out['n']:,} sent at once (idle, max_waiting {out['max_waiting']})",
            f"{span(admitted)}; the modelled engine's answer {span(model)}; within ± 2 of it in "
            f"{close} of {len(runs)} runs ({modes['new']} new-connection, {modes['kept']} "
            "kept-alive)",
            "the model's answer (320) ± 2 in every run, new and kept-alive alike",
            close == len(runs)),
        Row("requests the lab judged otherwise than the model, per run",
            span([r["differ"] for r in runs])),
        Row("admitted streams complete (usage = max_tokens, then [DONE])",
            f"{whole:,} of {served:,} ({out['max_tokens']:,} tokens each)", "every one",
            whole == served),
        Row("statuses answered", ", ".join(map(str, statuses)), "only 200 and 529",
            set(statuses) <= {200, 529}),
        Row("TTFT p50 of the admitted, per run", f"{span([r['ttft_ms'][0] for r in runs])} ms"),
        Row("host CPU per run: gateway / engine / client",
            " / ".join(span(v, "{:.1f}") for v in cpu.values()) + " CPU-s"),
        Row("arrivals booked late per run (`inference_lab_arrival_booked_late_seconds`)",
            span([r["booked_late"] for r in runs])),
    ]


def cadence_rows(res: list[dict]) -> list[Row]:
    out, cfg = res[0], res[0]["config"]
    what = {"spike": f"a spike ({cfg['high']} → {cfg['low']} streams)",
            "stall": f"a {cfg['stall']:g} s engine stall (SIGSTOP, {cfg['low']} streams)"}
    rows = []
    for scenario in ("spike", "stall"):
        if scenario in out:
            back = out[scenario]["back_after_s"]
            rows.append(Row(f"one token per write again (≤ 1.05 events per write) after "
                            f"{what[scenario]} ends",
                            "not within the run" if back is None else f"{back:.2f} s",
                            "within 1 s", back is not None and back <= 1.0))
    return rows


def sim_rows(res: list[dict]) -> list[Row]:
    return [Row(f"{r['model']} on {r['hardware']}, {r['timing']} timing, {r['workload']}, "
                f"{r['requests']:,} requests: simulated output tokens per CPU-s",
                f"{r['output_tokens_per_cpu_second']:,.0f}", "≥ 2,000,000",
                r["output_tokens_per_cpu_second"] >= 2_000_000) for r in res]


ROUTE_NAMES = {"chat": "chat", "chat-tool": "chat, forced tool call", "messages": "Messages",
               "messages-tool": "Messages, forced tool_use", "responses": "Responses",
               "responses-tool": "Responses, forced function_call", "chat-n4": "chat, n = 4"}


def protocol_rows(res: list[dict]) -> list[Row]:
    return [Row(f"{ROUTE_NAMES.get(r['route'], r['route'])}: tokens/s; e2e p50 client / "
                "modelled; gateway CPU-s per 1,000 tokens",
                f"{r['delivered_tokens_per_s']:,.0f}; {ms(r['e2e_client_p50'])} / "
                f"{ms(r['e2e_model_p50'])} ms; {r['gateway_cpu_per_1k_tokens']:.4f}"
                + (f" ({r['short_responses']} short)" if r["short_responses"] else ""))
            for r in res[0]["results"]]


def tool_call_rows(res: list[dict]) -> list[Row]:
    r = res[0]
    rows = [Row("`synthesize` of the tool's schema", f"{r['synthesize_us']:.1f} µs")]
    for api, f in r["apis"].items():
        rows.append(Row(f"{api}: text / forced tool call, per request of {r['tokens']} tokens",
                        f"{f['text_us']:.1f} / {f['tool_us']:.1f} µs "
                        f"({f['tool_us'] - f['text_us']:+.0f})"))
    return rows


def batch_rows(res: list[dict]) -> list[Row]:
    rows = []
    for r in res:
        for form, f in r["forms"].items():
            rows.append(Row(f"{r['prompts']} prompts, {form}: wall per round; gateway / engine "
                            "CPU per prompt; modelled TTFT least, greatest",
                            f"{f['wall_ms']:.1f} ms; {f['gateway_us_per_prompt']:.0f} / "
                            f"{f['engine_us_per_prompt']:.0f} µs; {f['ttft_least_ms']:.2f}, "
                            f"{f['ttft_greatest_ms']:.2f} ms"))
    return rows


def prefix_offline_rows(res: list[dict]) -> list[Row]:
    rows = []
    for key in ("off", "on"):
        f = res[0][key]
        t = f["ttft_ms"]
        hit = "-" if f["hit_rate"] is None else f"{100 * f['hit_rate']:.1f} %"
        rows.append(Row(f"prefix caching {key}: TTFT mean / p50 / p90 / p99; e2e mean; hit "
                        "rate; requests/s",
                        f"{t['mean']:.1f} / {t['p50']:.1f} / {t['p90']:.1f} / {t['p99']:.1f} ms; "
                        f"{f['e2e_mean_ms']:.0f} ms; {hit}; {f['requests_per_s']:.1f}"))
    return rows


def prefix_cpu_rows(res: list[dict]) -> list[Row]:
    r = res[0]
    return [Row(f"engine CPU per request at {r['clients']} streams, without / with (token IDs "
                "hashed and looked up, KV events published)",
                f"{r['without']['cpu_ms_per_request']:.3f} / {r['with']['cpu_ms_per_request']:.3f} ms"),
            Row("CPU per request, with / without", f"{r['ratio']:.2f}", "≤ 1.20",
                r["ratio"] <= 1.20)]


def metrics_rows(res: list[dict]) -> list[Row]:
    return [Row(f"{r['models']} model(s), {r['lines']:,} lines, {r['bytes'] / 1024:.0f} KiB: "
                "render after a change / unchanged / prometheus-client generate_latest",
                f"{r['render_changed_ms']:.2f} / {r['render_cached_ms']:.3f} / "
                f"{r['generate_latest_ms']:.2f} ms") for r in res]


def fleet_idle_rows(res: list[dict]) -> list[Row]:
    r = res[0]
    return [Row(f"{r['replicas']} idle replicas in one engine: engine CPU",
                f"{r['cores']:.4f} cores (CPU time counts in {r['tick_s'] * 1e3:.0f} ms ticks)",
                "< 0.02 cores", r["cores"] < 0.02)]


def fleet_fidelity_rows(res: list[dict]) -> list[Row]:
    r = res[0]
    off = [p["e2e_p50"] / p["modelled_e2e_p50"] - 1 for p in r["per_replica"]]
    c = r["cores"]
    return [Row(f"{r['replicas']} replicas × {r['streams']} streams: client e2e p50 vs modelled, "
                "every replica", f"{100 * min(off):+.2f} to {100 * max(off):+.2f} %",
                "within 3 % on every replica", max(abs(x) for x in off) <= 0.03),
            Row("pacing lag p99", f"{ms(r['lag_p99'], 2)} ms", "< 10 ms", r["lag_p99"] < 0.010),
            Row("cores: gateway / engine / the machine",
                f"{c['gateway']:.2f} / {c['engine']:.2f} / {c['machine']:.2f}")]


def fleet_scrape_rows(res: list[dict]) -> list[Row]:
    r = res[0]
    rows = []
    for t in r["targets"]:
        replica = t["label"].endswith("of replica 0")
        rows.append(Row(f"{t['label']} (~{t['bytes'] / 1024:.0f} KiB): p50 / p99",
                        f"{ms(t['p50'], 2)} / {ms(t['p99'], 2)} ms (waiting for a core p99 "
                        f"{ms(t['wait_p99'], 2)}; the rest p99 {ms(t['rest_p99'], 2)})",
                        "p99 < 5 ms" if replica else "none (the machine's floor)",
                        t["p99"] < 0.005 if replica else None))
    if r.get("copy_waits"):
        waits, served = r["copy_waits"]
        rows.append(Row("scrapes that waited for the engine's copy", f"{waits:.0f} of {served:.0f}"))
    return rows


def engine_stream_rows(res: list[dict]) -> list[Row]:
    how = {"lane": "the Session lane", "session": "the gRPC Session", "submit": "Submit streams"}
    return [Row(f"{r['clients']} stream(s) over {how[r['mode']]}: engine cores; CPU-s per 1,000 "
                "tokens; pacing lag p99",
                f"{r['engine_cores']:.2f}; {r['engine_cpu_per_1k_tokens']:.3f}; "
                f"{ms(r['lag_p99'], 2)} ms") for r in res]


def soak_rows(res: list[dict]) -> list[Row]:
    r = res[0]
    c, growth = r["counts"], r["rss_growth_after_warmup_pct"]
    return [Row("completed streams with exact token counts", f"{c['exact']:,} of {c['completed']:,}",
                "every one", c["exact"] == c["completed"]),
            Row("refusals (529) / early hang-ups / errors",
                f"{c['refused_529']:,} / {c['disconnected']:,} / {c['errors']}", "0 errors",
                c["errors"] == 0),
            Row("RSS growth after warm-up", ", ".join(f"{k} {v:+.2f} %" for k, v in growth.items())),
            Row("waiting / running after the clients stopped",
                f"{r['after']['waiting']} / {r['after']['running']}", "0 / 0",
                (r["after"]["waiting"], r["after"]["running"]) == (0, 0))]


def scenario_rows(res: list[dict]) -> list[Row]:
    phases, page = res[0]["phases"], res[0]["page_ms"]
    rows = []
    for i, p in enumerate(phases.get("reference", [])):
        st = p["steady"]
        rows.append(Row(f"reference page, {p['action']}: e2e p50 (the page: {page[i]:.0f} ms)",
                        f"{ms(st['e2e_p50_s'])} ms ({pct(st['e2e_p50_s'] * 1e3, page[i])}); "
                        f"modelled {ms(st['modelled_e2e_p50_s'])} ms; goodput / oracle "
                        f"{st['goodput_tok_s'] / p['oracle']['goodput_tok_s']:.2f}",
                        "within 5 % of the page", within(st["e2e_p50_s"] * 1e3, page[i], 0.05)))
    for p in phases.get("step", []):
        settle, held = p["scores"]["band_settle_s"], p["limit_in_band"] or 0
        band = f"[{p['band'][0]}, {p['band'][1]}]"
        rows.append(Row(f"capacity step, {p['action']}: AIMD into {band}",
                        f"{'never' if settle is None else f'after {settle:.2f} s'}; in it "
                        f"{100 * held:.0f} % of the second half; limit p50 "
                        f"{p['steady']['limit_p50']:.0f}",
                        "≤ 10 s, then held ≥ 90 %",
                        settle is not None and settle <= 10 and held >= 0.9))
    for p in phases.get("multi-turn", []):
        rows.append(Row(f"multi-turn chat, {p['action']}: prompt tokens served from the prefix "
                        "cache / the oracle's hit rate",
                        f"{100 * p['steady']['cached_frac']:.1f} % / "
                        f"{100 * p['oracle']['cache_hit_rate']:.1f} %", "near the oracle"))
    for p in phases.get("faults", []):
        st, o = p["steady"], p["oracle"]
        e2e = "-" if st["e2e_p50_s"] is None else f"{ms(st['e2e_p50_s'], 0)} ms"
        rows.append(Row(f"slow replica, {p['action']}: goodput score; e2e p50 (oracle)",
                        f"{p['scores']['goodput']:.2f}; {e2e} ({ms(o['e2e_p50_s'], 0)} ms"
                        f"{'' if o['fault_modelled'] else ', fault-free'})"))
    return rows


def time_scale_rows(res: list[dict]) -> list[Row]:
    rows = []
    for r in res:
        phases, page = r["phases"]["reference"], r["page_ms"]
        e2e = [p["steady"]["e2e_p50_s"] * 1e3 for p in phases]
        rows.append(Row(f"K = {r['time_scale']:g}: reference page e2e p50 before / after",
                        " / ".join(f"{v:.1f} ms ({pct(v, page[i])})" for i, v in enumerate(e2e)),
                        "none"))
    return rows


def loadgen_rows(res: list[dict]) -> list[Row]:
    r = res[0]
    rows = [Row(f"CPU per request at {r['rate']:,.0f} requests/s (controller {r['controller']})",
                f"{r['cpu_us_per_request']:.1f} µs (controller {r['controller_us_per_request']:.1f})",
                "≤ 50 µs", r["cpu_us_per_request"] <= 50),
            Row("send delay p50 / p99 (from the scheduled instant)",
                f"{r['send_delay_p50_ms']:.3f} / {r['send_delay_p99_ms']:.3f} ms", "p99 ≤ 1 ms",
                r["send_delay_p99_ms"] <= 1.0)]
    if r.get("floor"):
        rows.append(Row("the floor: the same schedule, timer and pool, nothing else",
                        f"{r['floor']['cpu_us_per_request']:.1f} µs, send delay p99 "
                        f"{r['floor']['send_delay_p99_ms']:.2f} ms"))
    return rows


FLOOR_NAMES = {"asyncio": "asyncio (uvloop, timerfd, Protocol callbacks)",
               "select": "a thread, `select()` with a µs timeout",
               "epoll": "a thread, epoll (whole-ms timeout)",
               "one_wakeup": "a thread, one wake-up per arrival, kernel receive stamps"}


def floor_rows(res: list[dict]) -> list[Row]:
    r = res[0]
    rows = [Row(FLOOR_NAMES[k], f"{r[k]['cpu_us_per_request']:.1f} CPU-µs per request, send "
                                f"delay p99 {r[k]['send_delay_p99_ms']:.2f} ms")
            for k in FLOOR_NAMES]
    rows.append(Row("parts: one 0.8 ms sleep / one request-response on a hot connection",
                    f"{r['sleep_us']:.1f} / {r['hot_us']:.1f} CPU-µs"))
    return rows


# ---- the registry ---------------------------------------------------------------------------------
def py(*args: str) -> Argv:
    return args


SIM_MODELS = (
    ("configs/deepseek-v3.toml", "b200", None),
    ("configs/deepseek-v3.toml", "h200", "calibrated"),
    ("configs/llama-3.1-8b.toml", "h100", "calibrated"),
    ("configs/qwen3.5-35b-a3b.toml", "b200", None),
)


def sim_models(requests: int) -> tuple[Argv, ...]:
    return tuple(py("benchmarks/sim_speed.py", "--config", config, "--hardware", hardware,
                    *(("--timing", timing) if timing else ()), "--requests", str(requests))
                 for config, hardware, timing in SIM_MODELS)


REGISTRY: tuple[Bench, ...] = (
    Bench("stream-24-64", "24 and 64 closed-loop streams: per-token cadence, TTFT over the model",
          (py("benchmarks/stream_fidelity.py", "--clients", "24,64", "--duration", "5",
              "--warmup", "2", "--ceiling", "0"),), stream_rows,
          (py("benchmarks/stream_fidelity.py", "--clients", "24", "--duration", "1",
              "--warmup", "0.5", "--ceiling", "0"),), minutes=0.5),
    Bench("stream-256-1024", "256 and 1,024 closed-loop streams: fidelity at the modelled rate",
          (py("benchmarks/stream_fidelity.py", "--clients", "256,1024", "--duration", "5",
              "--warmup", "2", "--ceiling", "0"),), stream_rows,
          (py("benchmarks/stream_fidelity.py", "--clients", "64", "--duration", "1",
              "--warmup", "0.5", "--ceiling", "0"),), minutes=1),
    Bench("sse-ceiling", "a bare aiohttp SSE server's events per CPU-second",
          (py("benchmarks/sse_ceiling.py"),), ceiling_rows,
          (py("benchmarks/sse_ceiling.py", "--clients", "16", "--variants", "1",
              "--repeat", "1", "--warmup", "0.5", "--duration", "1"),), minutes=1.5),
    Bench("refusal-path", "a saturated model's 529 under 2,000 requests/s, beside a bare floor",
          (py("benchmarks/refusal_path.py", "--duration", "4"),), refusal_rows,
          (py("benchmarks/refusal_path.py", "--duration", "0.5", "--rate", "200",
              "--baseline", "0.5"),), minutes=0.5),
    Bench("burst-1000", "1,000 streaming requests at once: admitted against the modelled engine",
          (py("benchmarks/burst.py", "--n", "1000", "--runs", "10"),), burst_rows,
          (py("benchmarks/burst.py", "--n", "400", "--runs", "1", "--max-tokens", "300"),),
          minutes=7),
    Bench("burst-4096", "4,096 streaming requests at once",
          (py("benchmarks/burst.py", "--n", "4096", "--runs", "5"),), burst_rows,
          (py("benchmarks/burst.py", "--n", "500", "--runs", "1", "--mode", "kept",
              "--max-tokens", "300"),), minutes=4),
    Bench("cadence-recovery", "how soon one token per write returns after a spike and a stall",
          (py("benchmarks/cadence_recovery.py"),), cadence_rows,
          (py("benchmarks/cadence_recovery.py", "--high", "32", "--low", "8",
              "--high-seconds", "2", "--low-seconds", "2", "--stall", "1"),), minutes=1.2),
    Bench("sim-speed", "the offline simulator: simulated output tokens per CPU-second",
          (py("benchmarks/sim_speed.py"),), sim_rows,
          (py("benchmarks/sim_speed.py", "--requests", "2000"),), minutes=0.3),
    Bench("sim-speed-models", "the offline simulator on MLA/MoE, calibrated and linear-attention models",
          sim_models(30000), sim_rows, sim_models(1000), minutes=0.5),
    Bench("protocol-cost", "the same paced load through every generation route",
          (py("benchmarks/protocol_cost.py", "--duration", "6", "--routes",
              "chat,chat-tool,messages,messages-tool,responses,responses-tool,chat-n4"),),
          protocol_rows,
          (py("benchmarks/protocol_cost.py", "--clients", "4", "--duration", "1", "--warmup",
              "0.5", "--routes", "chat,chat-tool"),), minutes=1.3),
    Bench("tool-call-cost", "a forced tool call's per-request gateway cost, no sockets",
          (py("benchmarks/tool_call_cost.py"),), tool_call_rows,
          (py("benchmarks/tool_call_cost.py", "--repeat", "20"),), minutes=0.3),
    Bench("completion-batches", "one completions request of N prompts against N requests",
          (py("benchmarks/completion_batches.py"),
           py("benchmarks/completion_batches.py", "--prompts", "32", "--rounds", "40")), batch_rows,
          (py("benchmarks/completion_batches.py", "--prompts", "8", "--rounds", "2"),
           py("benchmarks/completion_batches.py", "--prompts", "4", "--rounds", "2")), minutes=0.7),
    Bench("prefix-caching-offline", "modelled TTFT of a multi-turn chat with prefix caching off and on",
          (py("benchmarks/prefix_caching.py", "offline"),), prefix_offline_rows, minutes=0.2),
    Bench("prefix-caching-cpu", "the engine's CPU per request with token IDs and prefix caching",
          (py("benchmarks/prefix_caching.py", "cpu", "--seconds", "6"),), prefix_cpu_rows,
          (py("benchmarks/prefix_caching.py", "cpu", "--clients", "16", "--seconds", "1"),),
          minutes=0.5),
    Bench("metrics-render", "one scrape's render of the engine's vLLM metrics, no sockets",
          (py("benchmarks/metrics_render.py"), py("benchmarks/metrics_render.py", "--models", "5")),
          metrics_rows,
          (py("benchmarks/metrics_render.py", "--repeat", "5"),
           py("benchmarks/metrics_render.py", "--models", "2", "--repeat", "5")), minutes=0.3),
    Bench("fleet-idle", "idle replicas' engine CPU",
          (py("benchmarks/fleet.py", "idle", "--replicas", "64", "--seconds", "10"),),
          fleet_idle_rows,
          (py("benchmarks/fleet.py", "idle", "--replicas", "4", "--seconds", "1"),), minutes=0.3),
    Bench("fleet-fidelity", "8 replicas × 24 streams: client e2e against the model per replica",
          (py("benchmarks/fleet.py", "fidelity", "--replicas", "8", "--streams", "24",
              "--seconds", "15"),), fleet_fidelity_rows,
          (py("benchmarks/fleet.py", "fidelity", "--replicas", "2", "--streams", "4",
              "--seconds", "1", "--warmup", "1"),), minutes=0.5),
    Bench("fleet-scrape", "a replica's /metrics while 8 are scraped every 50 ms and 64 streams run",
          (py("benchmarks/fleet.py", "scrape", "--replicas", "8", "--streams", "64",
              "--seconds", "10", "--bare", "asyncio"),), fleet_scrape_rows,
          (py("benchmarks/fleet.py", "scrape", "--replicas", "2", "--streams", "4",
              "--seconds", "1", "--bare", "asyncio"),), minutes=0.4),
    Bench("engine-stream", "the engine alone, one stream: the Session lane against gRPC",
          (py("benchmarks/engine_stream.py", "--clients", "1", "--seconds", "5", "--mode", "lane"),
           py("benchmarks/engine_stream.py", "--clients", "1", "--seconds", "5", "--mode",
              "session")), engine_stream_rows,
          (py("benchmarks/engine_stream.py", "--clients", "1", "--seconds", "1", "--mode", "lane"),
           py("benchmarks/engine_stream.py", "--clients", "1", "--seconds", "1", "--mode",
              "session")), minutes=0.4),
    Bench("soak", "serve held at saturation for minutes: exact streams, memory",
          (py("benchmarks/soak.py", "--duration", "150", "--warmup", "15"),), soak_rows,
          (py("benchmarks/soak.py", "--duration", "6", "--warmup", "2"),), minutes=3),
    Bench("experiment-scenarios", "the shipped experiment scenarios through `experiment --serve`",
          (py("benchmarks/experiment_scenarios.py"),), scenario_rows,
          (py("benchmarks/experiment_scenarios.py", "--only", "reference", "--time-scale", "8"),),
          minutes=4.5),
    Bench("experiment-time-scale", "the reference page's experiment at time scales 1 to 8",
          tuple(py("benchmarks/experiment_scenarios.py", "--only", "reference", "--time-scale", k)
                for k in ("1", "2", "4", "8")), time_scale_rows,
          (py("benchmarks/experiment_scenarios.py", "--only", "reference", "--time-scale", "8"),),
          minutes=2.5),
    Bench("experiment-loadgen", "the experiment runner's load generator + AIMD: CPU per request",
          (py("benchmarks/experiment_loadgen.py", "--seconds", "5"),), loadgen_rows,
          (py("benchmarks/experiment_loadgen.py", "--seconds", "1", "--rate", "200"),),
          minutes=0.3),
    Bench("loadgen-floors", "what one timed request costs this machine, whatever the generator",
          (py("benchmarks/loadgen_floors.py", "--seconds", "5"),), floor_rows,
          (py("benchmarks/loadgen_floors.py", "--seconds", "1", "--rate", "200"),), minutes=0.5),
)


# ---- running -------------------------------------------------------------------------------------
def shown(argv: Argv) -> str:
    return shlex.join(("python", *argv))


def run_command(argv: Argv) -> dict | None:
    """Run one command with its JSON written to a temporary file; its figures, or None."""
    fd, path = tempfile.mkstemp(suffix=".bench.json")
    os.close(fd)
    try:
        print(f"\n$ {shown(argv)}", flush=True)
        done = subprocess.run([sys.executable, *argv, "--json", path], cwd=C.ROOT)
        if done.returncode != 0:
            print(f"(exited with {done.returncode})", flush=True)
            return None
        with open(path) as f:
            text = f.read()
        return json.loads(text) if text.strip() else None
    finally:
        os.unlink(path)


def select(only: str | None) -> list[Bench]:
    if not only:
        return list(REGISTRY)
    by_name = {b.name: b for b in REGISTRY}
    wanted = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        sys.exit(f"unknown benchmark(s): {', '.join(unknown)} (see --list)")
    return [by_name[n] for n in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--only", metavar="NAME[,NAME]", help="run these benchmarks only")
    parser.add_argument("--write", action="store_true",
                        help="replace each benchmark's table in the results file")
    parser.add_argument("--quick", action="store_true",
                        help="short durations, to check the scripts (not results)")
    parser.add_argument("--file", type=Path, default=RESULTS,
                        help="the results file (default BENCHMARKS.md)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure here")
    args = parser.parse_args(argv)
    benches = select(args.only)
    if args.list:
        for b in benches:
            print(f"{b.name:<24} ~{b.minutes:g} min  {b.measures}")
            for c in b.commands:
                print(f"{'':<24}   {shown(c)}")
        print(f"\nabout {sum(b.minutes for b in benches):.0f} minutes in all")
        return 0
    if args.write:
        if args.quick and args.file.resolve() == RESULTS.resolve():
            sys.exit("--quick figures are not results: write them to another file (--file)")
        try:
            present = block_names(args.file.read_text())
        except (OSError, MarkerError) as e:
            sys.exit(f"{args.file}: {e}")
        missing = [b.name for b in benches if present.count(b.name) != 1]
        if missing:
            sys.exit(f"{args.file}: no single <!-- bench:NAME --> block for {', '.join(missing)}")
    commit, machine = C.commit(), C.host()
    print(f"machine: {machine}; code at {commit}", flush=True)
    everything, failed = {}, []
    for b in benches:
        C.print_load(b.name)
        started = time.monotonic()
        commands = b.quick if args.quick and b.quick else b.commands
        results = []
        for argv_ in commands:
            result = run_command(argv_)
            if result is None:
                break
            results.append(result)
        if len(results) != len(commands):
            failed.append(b.name)
            continue
        try:
            rows = b.rows(results)
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:
            print(f"{b.name}: its figures could not be read ({type(e).__name__}: {e})")
            failed.append(b.name)
            continue
        body = render(rows, commands=[shown(c) for c in commands], commit=commit,
                      machine=machine)
        everything[b.name] = results
        print(f"\n== {b.name} ({time.monotonic() - started:.0f} s)\n{body}\n", flush=True)
        if args.write:
            args.file.write_text(replace_block(args.file.read_text(), b.name, body))
            print(f"(written to {args.file})", flush=True)
    C.write_json(args.json, {"machine": machine, "commit": commit, "results": everything})
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The rows of BENCHMARKS.md's other tables, read from each script's JSON: the offline
simulator, prefix caching, the metrics' render, the fleet, the experiment scenarios and
time scales, and the load generators with their floors. One function per table, as in
`_rows_serving.py`.
"""

from __future__ import annotations

from _tables import Row, ms, pct, within


def sim_rows(res: list[dict]) -> list[Row]:
    return [Row(f"{r['model']} on {r['hardware']}, {r['timing']} timing, {r['workload']}, "
                f"{r['requests']:,} requests: simulated output tokens per CPU-s",
                f"{r['output_tokens_per_cpu_second']:,.0f}", "≥ 2,000,000",
                r["output_tokens_per_cpu_second"] >= 2_000_000) for r in res]


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
    def row(r: dict) -> Row:
        page = r["page_ms"]
        e2e = [p["steady"]["e2e_p50_s"] * 1e3 for p in r["phases"]["reference"]]
        return Row(f"K = {r['time_scale']:g}: reference page e2e p50 before / after",
                   " / ".join(f"{v:.1f} ms ({pct(v, page[i])})" for i, v in enumerate(e2e)), "none")
    return [row(r) for r in res]


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

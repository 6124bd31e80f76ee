"""The rows of BENCHMARKS.md's serving-path tables, read from each script's JSON: streams
(`stream_fidelity.py`), the bare SSE ceiling, refusals, bursts, the cadence's recovery, the
generation routes, forced tool calls, completion batches, the engine's stream alone and
the soak. One function per table, `X_rows(results) -> list[Row]`, `results` holding each
of the benchmark's commands' JSON in order (benchmarks/_registry.py pairs them).
"""

from __future__ import annotations

from _tables import Row, ms, pct, span, within


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
    return [Row(f"{r['prompts']} prompts, {form}: wall per round; gateway / engine CPU per "
                "prompt; modelled TTFT least, greatest",
                f"{f['wall_ms']:.1f} ms; {f['gateway_us_per_prompt']:.0f} / "
                f"{f['engine_us_per_prompt']:.0f} µs; {f['ttft_least_ms']:.2f}, "
                f"{f['ttft_greatest_ms']:.2f} ms")
            for r in res for form, f in r["forms"].items()]


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


def engine_stream_rows(res: list[dict]) -> list[Row]:
    how = {"lane": "the Session lane", "session": "the gRPC Session", "submit": "Submit streams"}
    return [Row(f"{r['clients']} stream(s) over {how[r['mode']]}: engine cores; CPU-s per 1,000 "
                "tokens; pacing lag p99",
                f"{r['engine_cores']:.2f}; {r['engine_cpu_per_1k_tokens']:.3f}; "
                f"{ms(r['lag_p99'], 2)} ms") for r in res]

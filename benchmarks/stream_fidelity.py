"""Stream fidelity: N concurrent streaming clients against a fresh `inference-lab serve`.

For each client count (default 24, 256, 1024) a fresh `serve` (gpt-oss-20b on b200,
max_num_seqs 256 unless --max-num-seqs) is loaded by a closed loop of streaming chat
requests (short prompt, max_tokens 200). Clients start spread over --stagger seconds,
warm up for --warmup seconds, then a --duration window is measured:

- delivered tokens/s: SSE frames the clients received in the window x 200/203 (each
  response is 203 frames: role chunk, 200 tokens, final chunk, [DONE]); the engine's own
  count (vllm:generation_tokens) over the same window next to it;
- client-observed TTFT (request write -> first SSE frame) and end-to-end (write -> end of
  the chunked body), p50 and p99, next to the engine's modelled values from the
  "inference_lab" field of the same responses, and the median per-request ratio
  client/modelled; requests sent in the window count (clients keep the load up until
  they have all finished);
- cadence: the client-measured inter-event gap (_loadgen.py: time since the stream's
  previous read for the first event of a read, 0 for the others) p50/p90/p99 next to the
  modelled step time (mean of vllm:inter_token_latency_seconds over the window, i.e. the
  gap a client would see with every step delivered on time), SSE events per write, and
  the median per-request client - modelled TTFT;
- pacing lag p50/p99 of the engine: inference_lab_pacing_lag_seconds, difference of two
  scrapes (window start/end), linear within the bucket like histogram_quantile;
- CPU seconds per 1,000 delivered tokens of the engine and the gateway (the serve process)
  and the load generator's CPU (utime+stime from /proc/<pid>/stat over the window);
- the gateway's SSE events per CPU-second as a fraction of the bare aiohttp ceiling
  (sse_ceiling.py, one write per event, back to back: median of 3 measured first unless
  --ceiling).

No pass/fail: it prints figures.

    python benchmarks/stream_fidelity.py [--clients 24,256,1024] [--duration 10]
        [--warmup 2] [--max-num-seqs N] [--loadgen-procs K] [--ceiling EVENTS_PER_CPU_S]
        [--profile DIR]   # also py-spy the engine and the gateway during the window
        [--dashboard-feed HZ]  # a dashboard open beside them: its feed read HZ times a second
"""

from __future__ import annotations

import argparse
import http.client
import math
import threading
import time

import _common as C
import sse_ceiling
from _loadgen import GAP_BUCKET

FRAMES_PER_RESPONSE_EXTRA = 3  # role chunk, final chunk, [DONE]


class FeedReader(threading.Thread):
    """A dashboard open beside the streams: GET /dashboard/feed `rate` times a second on
    one kept-alive connection, as the page polls it, until monotonic `until`."""

    def __init__(self, port: int, rate: float, until: float) -> None:
        super().__init__(daemon=True)
        self.port, self.every, self.until = port, 1.0 / rate, until
        self.reads = 0
        self.start()

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        next_at = time.monotonic()
        while next_at < self.until:
            conn.request("GET", "/dashboard/feed")
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200, resp.status
            self.reads += 1
            next_at += self.every
            time.sleep(max(0.0, next_at - time.monotonic()))
        conn.close()


def run_one(clients: int, args: argparse.Namespace) -> dict:
    tokens = args.max_tokens
    loadgens = []
    with C.serve(*args.serve_args.split()) as served:
        if args.max_num_seqs:
            served.capacity({"max_num_seqs": args.max_num_seqs})
        cap = served.capacity()[0]
        procs = args.loadgen_procs or (1 if clients <= 256 else 2)
        t0 = time.monotonic() + 1.0 + clients / 1000
        t_warm = t0 + args.warmup
        t_end = t_warm + args.duration
        base = {"mode": "closed", "host": "127.0.0.1", "port": served.port,
                "path": "/v1/chat/completions",
                "body": {"model": "gpt-oss-20b", "stream": True, "max_tokens": tokens,
                         "messages": [{"role": "user", "content": "Say hello."}]},
                "t0": t0, "t_warm": t_warm, "t_end": t_end, "t_hard": t_end + args.tail,
                "stagger": args.stagger}
        reader = FeedReader(served.port, args.dashboard_feed, t_end) if args.dashboard_feed else None
        try:
            loadgens = C.start_loadgens([{**base, "clients": n}
                                         for n in C.split(clients, procs) if n])
            cpu, m0, m1, wall, results, profiles = C.measure_window(
                served, loadgens, t_warm, t_end, profile=args.profile, duration=args.duration,
                suffix=f"{clients}", collect_timeout=args.tail + 60)
        finally:
            C.stop_all(loadgens)
            if reader is not None:
                reader.join()

    frames = sum(r["win_frames"] for r in results)
    writes = sum(r["win_writes"] for r in results)
    delivered = frames * tokens / (tokens + FRAMES_PER_RESPONSE_EXTRA)
    engine_tokens = (C.counter(m1, "vllm:generation_tokens") - C.counter(m0, "vllm:generation_tokens"))
    lag = C.histogram_delta(C.histogram(m0, "inference_lab_pacing_lag_seconds"),
                            C.histogram(m1, "inference_lab_pacing_lag_seconds"))
    lag_p50, _ = C.histogram_quantile(lag[0], 0.50)
    lag_p99, lag_over = C.histogram_quantile(lag[0], 0.99)
    itl = C.histogram_delta(C.histogram(m0, "vllm:inter_token_latency_seconds"),
                            C.histogram(m1, "vllm:inter_token_latency_seconds"))
    gaps = [sum(col) for col in zip(*(res["gaps"] for res in results))]
    records = [r for res in results for r in res["records"]]
    ttft_c = [(rec[1] - rec[0]) for rec in records if rec[1]]
    e2e_c = [(rec[2] - rec[0]) for rec in records]
    with_m = [rec for rec in records if rec[5] and rec[1]]
    ttft_m = [rec[5][1] for rec in with_m]
    e2e_m = [rec[5][2] for rec in with_m]
    queue_m = [rec[5][0] for rec in with_m]
    ttft_ratio = [(rec[1] - rec[0]) / rec[5][1] for rec in with_m if rec[5][1] > 0]
    ttft_over = [(rec[1] - rec[0]) - rec[5][1] for rec in with_m]
    e2e_ratio = [(rec[2] - rec[0]) / rec[5][2] for rec in with_m if rec[5][2] > 0]
    short = [rec for rec in records if rec[3] != tokens + FRAMES_PER_RESPONSE_EXTRA]
    errors: dict[str, int] = {}
    for res in results:
        for k, v in res["errors"].items():
            errors[k] = errors.get(k, 0) + v
    gw_events_per_cpu = frames / cpu["gateway"] if cpu["gateway"] > 0 else float("nan")
    return {
        "clients": clients, "max_num_seqs": cap["max_num_seqs"], "loadgen_procs": procs,
        "window_s": wall, "requests": len(records), "unfinished": sum(r["unfinished"] for r in results),
        "short_responses": len(short), "errors": errors,
        "sse_events_per_s": frames / wall, "writes_per_s": writes / wall,
        "events_per_write": frames / writes if writes else float("nan"),
        "delivered_tokens_per_s": delivered / wall, "engine_tokens_per_s": engine_tokens / wall,
        "ttft_client_p50": C.quantile(ttft_c, 0.5), "ttft_client_p99": C.quantile(ttft_c, 0.99),
        "ttft_model_p50": C.quantile(ttft_m, 0.5), "ttft_model_p99": C.quantile(ttft_m, 0.99),
        "e2e_client_p50": C.quantile(e2e_c, 0.5), "e2e_client_p99": C.quantile(e2e_c, 0.99),
        "e2e_model_p50": C.quantile(e2e_m, 0.5), "e2e_model_p99": C.quantile(e2e_m, 0.99),
        "queue_model_p50": C.quantile(queue_m, 0.5),
        "queue_model_negative": sum(1 for q in queue_m if q < 0),
        "queue_model_min": min(queue_m) if queue_m else float("nan"),
        "ttft_ratio_median": C.quantile(ttft_ratio, 0.5),
        "ttft_over_model_p50": C.quantile(ttft_over, 0.5),
        "gap_p50": gap_quantile(gaps, 0.5), "gap_p90": gap_quantile(gaps, 0.9),
        "gap_p99": gap_quantile(gaps, 0.99), "gap_events": sum(gaps),
        "step_model_mean": itl[2] / itl[1] if itl[1] else float("nan"),
        "e2e_ratio_median": C.quantile(e2e_ratio, 0.5),
        "lag_wakeups": lag[1], "lag_p50": lag_p50, "lag_p99": lag_p99, "lag_p99_overflow": lag_over,
        "lag_mean": lag[2] / lag[1] if lag[1] else float("nan"),
        "cpu_s": cpu,
        "cpu_frac": {k: v / wall for k, v in cpu.items()},
        "engine_cpu_per_1k_tokens": 1000 * cpu["engine"] / delivered if delivered else float("nan"),
        "gateway_cpu_per_1k_tokens": 1000 * cpu["gateway"] / delivered if delivered else float("nan"),
        "loadgen_cpu_per_1k_tokens": 1000 * cpu["loadgen"] / delivered if delivered else float("nan"),
        "gateway_events_per_cpu_s": gw_events_per_cpu,
        "profiles": profiles,
    }


def gap_quantile(counts: list[int], q: float) -> float:
    """The q-quantile of the loadgens' gap histogram (middle of its bucket; the last
    bucket, 100 ms and over, reads as its lower bound)."""
    total = sum(counts)
    if not total:
        return float("nan")
    rank, run = q * total, 0
    for i, c in enumerate(counts):
        run += c
        if run >= rank:
            return (i + 0.5) * GAP_BUCKET if i < len(counts) - 1 else i * GAP_BUCKET
    return float("nan")


def ms(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x * 1e3:.1f}"


def pct(a: float, b: float) -> str:
    if not b or math.isnan(a) or math.isnan(b):
        return "n/a"
    return f"{100 * (a / b - 1):+.1f} %"


def report(r: dict, ceiling: float | None) -> None:
    cf = r["cpu_frac"]
    print(f"  window {r['window_s']:.1f} s, max_num_seqs {r['max_num_seqs']}, "
          f"{r['loadgen_procs']} loadgen proc(s); {r['requests']} requests measured"
          f"{', %d unfinished' % r['unfinished'] if r['unfinished'] else ''}"
          f"{', %d short' % r['short_responses'] if r['short_responses'] else ''}"
          f"{', errors %s' % r['errors'] if r['errors'] else ''}")
    print(f"  delivered {r['delivered_tokens_per_s']:,.0f} tokens/s (engine generated "
          f"{r['engine_tokens_per_s']:,.0f}/s); {r['sse_events_per_s']:,.0f} SSE events/s in "
          f"{r['writes_per_s']:,.0f} writes/s ({r['events_per_write']:.2f} events/write)")
    print(f"  TTFT ms    client p50 {ms(r['ttft_client_p50'])} p99 {ms(r['ttft_client_p99'])} | "
          f"modelled p50 {ms(r['ttft_model_p50'])} p99 {ms(r['ttft_model_p99'])} | "
          f"p50 {pct(r['ttft_client_p50'], r['ttft_model_p50'])}, "
          f"median ratio {r['ttft_ratio_median']:.3f}")
    print(f"  e2e ms     client p50 {ms(r['e2e_client_p50'])} p99 {ms(r['e2e_client_p99'])} | "
          f"modelled p50 {ms(r['e2e_model_p50'])} p99 {ms(r['e2e_model_p99'])} | "
          f"p50 {pct(r['e2e_client_p50'], r['e2e_model_p50'])}, "
          f"median ratio {r['e2e_ratio_median']:.3f}")
    print(f"  cadence    client inter-event gap ms p50 {ms(r['gap_p50'])} p90 {ms(r['gap_p90'])} "
          f"p99 {ms(r['gap_p99'])} ({r['gap_events']:,} events) | modelled step "
          f"{ms(r['step_model_mean'])} (mean ITL) | {r['events_per_write']:.2f} events/write | "
          f"TTFT client - modelled p50 {ms(r['ttft_over_model_p50'])}")
    print(f"  modelled queue time ms p50 {ms(r['queue_model_p50'])}, min {ms(r['queue_model_min'])}; "
          f"{r['queue_model_negative']} of {r['requests']} negative (a step booked to start "
          f"before the request arrived)")
    print(f"  pacing lag ms p50 {ms(r['lag_p50'])} p99 {'>' if r['lag_p99_overflow'] else ''}"
          f"{ms(r['lag_p99'])} mean {ms(r['lag_mean'])} over {r['lag_wakeups']:,.0f} wake-ups")
    print(f"  CPU cores  engine {cf['engine']:.2f}, gateway {cf['gateway']:.2f}, loadgen "
          f"{cf['loadgen']:.2f}, other processes {cf['others']:.2f};  CPU-s per 1,000 tokens: engine "
          f"{r['engine_cpu_per_1k_tokens']:.4f}, gateway {r['gateway_cpu_per_1k_tokens']:.4f}, "
          f"loadgen {r['loadgen_cpu_per_1k_tokens']:.4f}")
    line = f"  gateway   {r['gateway_events_per_cpu_s']:,.0f} SSE events per CPU-second"
    if ceiling:
        line += f" = {100 * r['gateway_events_per_cpu_s'] / ceiling:.0f} % of the bare ceiling ({ceiling:,.0f})"
    print(line, flush=True)
    if r["profiles"]:
        print("  (py-spy was attached during this window: the figures above are perturbed)")
    for name, path in r["profiles"].items():
        print(f"  py-spy {name} ({path}):\n{C.summarize_profile(path)}", flush=True)


def summary(rows: list[dict], ceiling: float | None) -> None:
    print("\nclients  tok/s     TTFT p50 c/m (ms)   e2e p50 c/m (ms)     ratio ttft/e2e  "
          "lag p99  eng/gw/lg cores   CPU-s/1k tok eng/gw  gw ev/CPU-s")
    for r in rows:
        cf = r["cpu_frac"]
        ceil = f" ({100 * r['gateway_events_per_cpu_s'] / ceiling:.0f} %)" if ceiling else ""
        print(f"{r['clients']:>7}  {r['delivered_tokens_per_s']:>7,.0f}  "
              f"{ms(r['ttft_client_p50']):>7}/{ms(r['ttft_model_p50']):<7}  "
              f"{ms(r['e2e_client_p50']):>8}/{ms(r['e2e_model_p50']):<8}  "
              f"{r['ttft_ratio_median']:>6.2f}/{r['e2e_ratio_median']:<5.3f}  "
              f"{'>' if r['lag_p99_overflow'] else ''}{ms(r['lag_p99']):>6}  "
              f"{cf['engine']:.2f}/{cf['gateway']:.2f}/{cf['loadgen']:.2f}    "
              f"{r['engine_cpu_per_1k_tokens']:.4f}/{r['gateway_cpu_per_1k_tokens']:.4f}  "
              f"{r['gateway_events_per_cpu_s']:>8,.0f}{ceil}")
    print("\nclients  gap p50/p90/p99 (ms)    modelled step (ms)  events/write  "
          "TTFT client-modelled p50 (ms)")
    for r in rows:
        print(f"{r['clients']:>7}  {ms(r['gap_p50']):>5}/{ms(r['gap_p90']):>5}/{ms(r['gap_p99']):<6}"
              f"      {ms(r['step_model_mean']):>6}          {r['events_per_write']:>6.2f}        "
              f"{ms(r['ttft_over_model_p50']):>6}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="24,256,1024", help="comma-separated client counts")
    parser.add_argument("--duration", type=float, default=10.0, help="measured window, seconds")
    parser.add_argument("--warmup", type=float, default=2.0, help="load before the window, seconds")
    parser.add_argument("--stagger", type=float, default=0.5,
                        help="client start times spread over this many seconds")
    parser.add_argument("--tail", type=float, default=30.0,
                        help="at most this long after the window for measured requests to finish")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--max-num-seqs", type=int, help="POST /control/capacity before the run")
    parser.add_argument("--serve-args", default="",
                        help="extra flags for `inference-lab serve`, e.g. '--max-update-rate 20000'")
    parser.add_argument("--loadgen-procs", type=int, default=0,
                        help="load generator processes (default: 1, 2 above 256 clients)")
    parser.add_argument("--ceiling", type=float,
                        help="bare aiohttp SSE events per CPU-second from sse_ceiling.py "
                             "(default: measure it first; 0 = skip)")
    parser.add_argument("--profile", metavar="DIR",
                        help="py-spy record engine and gateway during each window into DIR")
    parser.add_argument("--dashboard-feed", type=float, default=0.0, metavar="HZ",
                        help="a dashboard open beside the streams: GET /dashboard/feed HZ times "
                        "a second during the run (the page polls at 2)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    print(f"machine: {C.machine()}")
    ceiling = args.ceiling
    if ceiling is None:
        runs = []
        for _ in range(3):
            C.print_load("sse ceiling (256 clients, 1 event/write, back to back)")
            c = sse_ceiling.measure(256, 1)
            sse_ceiling.report(c)
            runs.append(c["events_per_cpu_s"])
        ceiling = sorted(runs)[1]
        print(f"  -> ceiling (median of 3): {ceiling:,.0f} events per server CPU-second")
    rows = []
    for n in [int(x) for x in args.clients.split(",") if x]:
        C.print_load(f"{n} streaming clients")
        load = C.loadavg()
        print(f"{n} clients:", flush=True)
        r = run_one(n, args)
        r["load_before"] = load
        report(r, ceiling or None)
        rows.append(r)
    summary(rows, ceiling or None)
    out = {"machine": C.machine(), "ceiling_events_per_cpu_s": ceiling, "results": rows}
    C.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()

"""Bare aiohttp SSE ceiling: SSE events per CPU-second of a minimal aiohttp server.

Same process layout as the lab (one server process, load generator in other processes):
benchmarks/_sse_server.py streams pre-encoded OpenAI-shaped chat chunks (200 tokens per
request, framed exactly like the gateway: role chunk with the first token, final chunk
and [DONE] with the last) to N closed-loop streaming clients. Events are SSE frames
counted by the clients in the measuring window; CPU is utime+stime of the server process
over the same window. No pass/fail.

Variants (`--variants`, comma-separated): `K` = K events per write, written back to back
by each handler (no task switch between writes: the bare ceiling); `K@T` = K events per
write paced by one shared ticker every T seconds (0 = every loop turn), so every write
costs a task wake-up as in the gateway, whose handlers wake on each engine message. The
first variant (default `1`: one write per event, back to back) is "the ceiling" that
stream_fidelity.py compares the gateway with.

    python benchmarks/sse_ceiling.py [--clients 256] [--variants 1,8,1@0] [--duration 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import _common as C


def measure(clients: int = 256, per_write: int = 1, *, tokens: int = 200, interval: float = -1.0,
            warmup: float = 1.0, duration: float = 5.0, loadgen_procs: int = 1) -> dict:
    """One measurement: start the bare server, load it, stop it; returns the figures."""
    port = C.free_port()
    server = subprocess.Popen(
        [sys.executable, str(C.HERE / "_sse_server.py"), str(port), str(tokens),
         str(per_write), str(interval)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=C.ROOT)
    loadgens: list[subprocess.Popen] = []
    try:
        C.wait_http_ok(f"http://127.0.0.1:{port}/health", server, timeout=30)
        t0 = time.monotonic() + 1.0 + clients / 2000
        t_warm, t_end = t0 + warmup, t0 + warmup + duration
        base = {"mode": "closed", "host": "127.0.0.1", "port": port,
                "path": "/v1/chat/completions",
                "body": {"model": "gpt-oss-20b", "stream": True, "max_tokens": tokens,
                         "messages": [{"role": "user", "content": "Say hello."}]},
                "t0": t0, "t_warm": t_warm, "t_end": t_end, "t_hard": t_end + 30,
                "stagger": min(warmup / 2, 0.5)}
        loadgens = C.start_loadgens([{**base, "clients": n}
                                     for n in C.split(clients, loadgen_procs) if n])
        pids = {"server": [server.pid], "loadgen": [p.pid for p in loadgens]}
        time.sleep(max(0.0, t_warm - time.monotonic()))
        cpu0, w0 = C.cpu_snapshot(pids), time.monotonic()
        time.sleep(max(0.0, t_end - time.monotonic()))
        cpu1, w1 = C.cpu_snapshot(pids), time.monotonic()
        results = C.collect_loadgens(loadgens, timeout=60)
    finally:
        C.stop_all(loadgens)
        C.stop_process(server)
    wall = w1 - w0
    events = sum(r["win_frames"] for r in results)
    writes = sum(r["win_writes"] for r in results)
    server_cpu = cpu1["server"] - cpu0["server"]
    loadgen_cpu = cpu1["loadgen"] - cpu0["loadgen"]
    other = C.others({k: cpu1[k] - cpu0[k] for k in cpu0})
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {"clients": clients, "per_write": per_write, "interval_s": interval, "wall_s": wall,
            "events": events, "writes": writes, "events_per_s": events / wall,
            "server_cpu_s": server_cpu, "server_cpu_frac": server_cpu / wall,
            "loadgen_cpu_s": loadgen_cpu, "loadgen_cpu_frac": loadgen_cpu / wall,
            "others_cpu_frac": other / wall,
            "events_per_cpu_s": events / server_cpu if server_cpu > 0 else float("nan"),
            "writes_per_cpu_s": writes / server_cpu if server_cpu > 0 else float("nan"),
            "errors": errors, "load_before": None}


def label(r: dict) -> str:
    t = r["interval_s"]
    how = ("back to back" if t < 0 else "ticker every loop turn" if t == 0
           else f"ticker every {t * 1e3:g} ms")
    return f"{r['per_write']} event(s)/write, {how}"


def parse_variants(text: str) -> list[tuple[int, float]]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        k, _, t = item.partition("@")
        out.append((int(k), float(t) if t else -1.0))
    return out


def report(r: dict) -> None:
    print(f"  {r['clients']} clients, {label(r)}: "
          f"{r['events_per_s']:,.0f} events/s ({r['writes'] / r['wall_s']:,.0f} writes/s), "
          f"server CPU {r['server_cpu_frac']:.2f} cores -> "
          f"{r['events_per_cpu_s']:,.0f} events per server CPU-second "
          f"({r['writes_per_cpu_s']:,.0f} writes/CPU-s); loadgen CPU {r['loadgen_cpu_frac']:.2f}, "
          f"other processes {r['others_cpu_frac']:.2f} cores"
          + (f"; errors {r['errors']}" if r["errors"] else ""), flush=True)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--variants", default="1,8,1@0",
                        help="K (back to back) or K@T (ticker every T s), comma-separated")
    parser.add_argument("--tokens", type=int, default=200, help="token events per response")
    C.add_window_arguments(parser, warmup=1.0, duration=5.0)
    parser.add_argument("--loadgen-procs", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3,
                        help="measurements per variant; the median is reported")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    print(f"machine: {C.machine()}")
    out = []
    for k, interval in parse_variants(args.variants):
        runs = []
        for _ in range(max(1, args.repeat)):
            C.print_load(f"sse ceiling, {k}@{interval}")
            load = C.loadavg()
            r = measure(args.clients, k, tokens=args.tokens, interval=interval,
                        warmup=args.warmup, duration=args.duration,
                        loadgen_procs=args.loadgen_procs)
            r["load_before"] = load
            report(r)
            runs.append(r)
        med = sorted(runs, key=lambda r: r["events_per_cpu_s"])[(len(runs) - 1) // 2]
        out.append({**med, "runs": [r["events_per_cpu_s"] for r in runs]})
        if len(runs) > 1:
            print(f"  -> median of {len(runs)}: {med['events_per_cpu_s']:,.0f} events per server "
                  f"CPU-second (runs: {', '.join(f'{x:,.0f}' for x in out[-1]['runs'])})",
                  flush=True)
    C.write_json(args.json, {"machine": C.machine(), "results": out})
    return out


if __name__ == "__main__":
    main()

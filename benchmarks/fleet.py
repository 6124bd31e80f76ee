"""Replicas in one engine: fidelity under load, idle cost, and scrape latency.

    python benchmarks/fleet.py fidelity [--replicas 8] [--streams 24] [--seconds 20]
    python benchmarks/fleet.py idle     [--replicas 64] [--seconds 10]
    python benchmarks/fleet.py scrape   [--replicas 8] [--streams 64] [--seconds 15]

fidelity: `serve --replicas R`, S closed-loop streams of gpt-oss-20b (200 tokens) on every
replica's port (one load generator per replica); per replica the end-to-end p50 seen by
the client next to the modelled one (the engine's own e2e of the same requests), and the
engine's pacing lag p99 over the window.
idle: `engine --replicas R` with nothing to do: its CPU over the window.
scrape: `serve --replicas R`, S streams spread over the replicas, every replica's /metrics
scraped every 50 ms by one thread each; the latency of replica 0's scrapes. The scrapers
start together (every 50 ms all eight ask at once: the worst case) unless --stagger spreads
their phases over the 50 ms (as independent scrapers, each on its own ticker, fall).
Prints figures, no pass/fail; the machine is shared, so the load average is printed too.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import threading
import time

import _common as C
from inference_lab.common.ports import free_port_run
from inference_lab.testing.launch import engine_process
from inference_lab.testing.poll import wait_until

LAG = "inference_lab_pacing_lag_seconds"
BODY = {"model": "gpt-oss-20b", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 200, "stream": True}


def get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def ready(port: int) -> bool:
    with contextlib.suppress(OSError):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/health/ready")
            return conn.getresponse().status == 200
        finally:
            conn.close()
    return False


def wait_ready(base_port: int, replicas: int, timeout: float = 60.0) -> None:
    wait_until(lambda: all(ready(base_port + i) for i in range(replicas)), timeout,
               what=f"{replicas} replicas ready")


def serve_fleet(replicas: int):
    """`serve --replicas R` on a run of free ports (replica i on base + i)."""
    base = free_port_run(replicas)
    return base, C.serve("--replicas", str(replicas), port=base)


def fidelity(args) -> None:
    base, server = serve_fleet(args.replicas)
    with server as served:
        wait_ready(base, args.replicas)
        C.print_load("before")
        now = time.monotonic()
        t0, warm = now + 2.0, now + 2.0 + args.warmup
        end = warm + args.seconds
        configs = [{"mode": "closed", "host": "127.0.0.1", "port": base + i,
                    "path": "/v1/chat/completions", "body": BODY, "clients": args.streams,
                    "t0": t0, "t_warm": warm, "t_end": end, "t_hard": end + 30, "stagger": 0.3}
                   for i in range(args.replicas)]
        loadgens = C.start_loadgens(configs)
        try:
            time.sleep(max(0.0, warm - time.monotonic()))
            before = served.engine_metrics()
            cpu0 = C.cpu_snapshot({"gateway": [served.gateway_pid], "engine": [served.engine_pid]})
            time.sleep(max(0.0, end - time.monotonic()))
            after = served.engine_metrics()
            cpu1 = C.cpu_snapshot({"gateway": [served.gateway_pid], "engine": [served.engine_pid]})
            results = C.collect_loadgens(loadgens, timeout=60)
        finally:
            C.stop_all(loadgens)
        C.print_load("after")
        lag = C.histogram_delta(C.histogram(before, LAG), C.histogram(after, LAG))[0]
        print(f"{args.replicas} replicas x {args.streams} streams of gpt-oss-20b on b200, "
              f"200 tokens, {args.seconds:.0f} s window; {C.machine()}")
        print(f"pacing lag p99 {C.histogram_quantile(lag, 0.99)[0] * 1000:.2f} ms, "
              f"p50 {C.histogram_quantile(lag, 0.5)[0] * 1000:.2f} ms")
        wall = end - warm
        print("cpu (cores): " + ", ".join(f"{k} {(cpu1[k] - cpu0[k]) / wall:.2f}"
                                          for k in ("gateway", "engine", "machine")))
        worst = 0.0
        for i, result in enumerate(results):
            records = [r for r in result["records"] if r[5]]
            measured = [r[2] - r[0] for r in records]
            modelled = [r[5][2] for r in records]  # (queue, ttft, e2e, ...) from the engine
            p50, m50 = C.quantile(measured, 0.5), C.quantile(modelled, 0.5)
            worst = max(worst, abs(p50 / m50 - 1))
            print(f"replica {i}: {len(records)} requests, e2e p50 {p50 * 1000:.1f} ms, "
                  f"modelled p50 {m50 * 1000:.1f} ms ({(p50 / m50 - 1) * 100:+.2f} %), "
                  f"errors {result['errors'] or 0}")
        print(f"worst replica: {worst * 100:.2f} % from modelled")


def idle(args) -> None:
    with engine_process("--replicas", str(args.replicas)) as proc:
        time.sleep(2.0)  # start-up allocations settle
        C.print_load("before")
        cpu0, t0 = C.proc_cpu(proc.pid), time.monotonic()
        time.sleep(args.seconds)
        cpu1, t1 = C.proc_cpu(proc.pid), time.monotonic()
        C.print_load("after")
        print(f"{args.replicas} idle replicas of gpt-oss-20b in one engine: "
              f"{(cpu1 - cpu0) / (t1 - t0):.4f} cores over {t1 - t0:.1f} s "
              f"(CPU time resolution {1 / C.CLK_TCK * 1000:.0f} ms); {C.machine()}")


def scrape(args) -> None:
    base, server = serve_fleet(args.replicas)
    with server as served:
        wait_ready(base, args.replicas)
        get(base, "/metrics")  # the gateway's copy of every replica (WatchMetrics) starts
        now = time.monotonic()
        start, end = now + 3.0, now + 3.0 + args.seconds
        per = C.split(args.streams, args.replicas)
        configs = [{"mode": "closed", "host": "127.0.0.1", "port": base + i,
                    "path": "/v1/chat/completions", "body": BODY, "clients": per[i],
                    "t0": now + 0.5, "t_warm": start, "t_end": end, "t_hard": end + 30,
                    "stagger": 0.3} for i in range(args.replicas) if per[i]]
        loadgens = C.start_loadgens(configs)
        latencies: list[float] = []
        sizes: list[int] = []
        stop = threading.Event()

        def scraper(port: int, record: bool, phase: float) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            next_at = start + phase
            while not stop.is_set():
                time.sleep(max(0.0, next_at - time.monotonic()))
                next_at += 0.05
                t = time.perf_counter()
                conn.request("GET", "/metrics")
                body = conn.getresponse().read()
                if record and time.monotonic() < end:
                    latencies.append(time.perf_counter() - t)
                    sizes.append(len(body))
                if time.monotonic() >= end:
                    return

        threads = [threading.Thread(target=scraper, args=(
            base + i, i == 0, 0.05 * i / args.replicas if args.stagger else 0.0))
            for i in range(args.replicas)]
        pids = {"gateway": [served.gateway_pid], "engine": [served.engine_pid]}
        try:
            time.sleep(max(0.0, start - time.monotonic() - 0.05))
            C.print_load("before")
            for t in threads:
                t.start()
            cpu0 = C.cpu_snapshot(pids)
            for t in threads:
                t.join(timeout=args.seconds + 30)
            cpu1 = C.cpu_snapshot(pids)
            C.collect_loadgens(loadgens, timeout=60)
        finally:
            stop.set()
            C.stop_all(loadgens)
        C.print_load("after")
        print(f"/metrics of replica 0 while {args.replicas} replicas are scraped every 50 ms "
              f"({'phases spread' if args.stagger else 'all at once'}) "
              f"and {args.streams} streams run: {len(latencies)} scrapes of ~{sizes[-1]} B, "
              f"p50 {C.quantile(latencies, 0.5) * 1000:.2f} ms, "
              f"p99 {C.quantile(latencies, 0.99) * 1000:.2f} ms, "
              f"max {max(latencies) * 1000:.2f} ms; {C.machine()}")
        print("cpu (cores): " + ", ".join(f"{k} {(cpu1[k] - cpu0[k]) / args.seconds:.2f}"
                                          for k in ("gateway", "engine", "machine")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("fidelity")
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--streams", type=int, default=24)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--warmup", type=float, default=3)
    p = sub.add_parser("idle")
    p.add_argument("--replicas", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10)
    p = sub.add_parser("scrape")
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--stagger", action="store_true")
    args = parser.parse_args()
    {"fidelity": fidelity, "idle": idle, "scrape": scrape}[args.what](args)


if __name__ == "__main__":
    main()

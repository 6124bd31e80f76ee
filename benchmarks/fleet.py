"""Replicas in one engine: fidelity under load, idle cost, and scrape latency.

    python benchmarks/fleet.py fidelity [--replicas 8] [--streams 24] [--seconds 20]
    python benchmarks/fleet.py idle     [--replicas 64] [--seconds 10]
    python benchmarks/fleet.py scrape   [--replicas 8] [--streams 64] [--seconds 15]
                                        [--stagger] [--path P] [--bare aiohttp|asyncio]... [--profile DIR]

Each takes --json FILE to write its figures there too.

fidelity: `serve --replicas R`, S closed-loop streams of gpt-oss-20b (200 tokens) on every
replica's port (all from one uvloop load-generator process by default, the cheapest client
the machine can run; --loadgens K deals the replicas over K processes); per replica the
end-to-end p50 seen by the client next to the modelled one (the engine's own e2e of the same
requests), where the difference shows (client TTFT against the modelled TTFT, and the
per-request e2e - modelled), and the engine's pacing lag p99 over the window.
idle: `engine --replicas R` with nothing to do: its CPU over the window.
scrape: `serve --replicas R`, S streams spread over the replicas (one load-generator
process), every replica's /metrics scraped every 50 ms on a keep-alive connection each;
the latency of replica 0's scrapes, timed in a process of its own (the other scrapers
are threads of this one). The scrapers
start together (every 50 ms all eight ask at once: the worst case) unless --stagger spreads
their phases over the 50 ms (as independent scrapers, each on its own ticker, fall).
--bare KIND also times, in the same window, a bare server in a process of its own (plain
aiohttp, or a raw asyncio protocol) answering the bytes of replica 0's /metrics fetched
before the window, scraped every 50 ms at replica 0's phase by a process of its own: the
floor of this machine under that load, independent of the gateway. After the window it
prints how many scrapes waited for the engine's copy (the gateway's
inference_lab_gateway_metrics_copy_waits_total against its /metrics requests).
Prints figures, no pass/fail; the machine is shared, so the load average is printed too.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time

import _common as C

from inference_lab.common.ports import free_port_run
from inference_lab.testing.launch import engine_process, stop_process
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
        groups = [list(range(args.replicas))[g::args.loadgens] for g in range(args.loadgens)]
        configs = [{"mode": "closed", "host": "127.0.0.1", "port": base + group[0],
                    "ports": [base + i for i in group], "path": "/v1/chat/completions",
                    "body": BODY, "clients": args.streams * len(group), "t0": t0,
                    "t_warm": warm, "t_end": end, "t_hard": end + 30, "stagger": 0.3}
                   for group in groups if group]
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
        out = {"replicas": args.replicas, "streams": args.streams,
               "lag_p50": C.histogram_quantile(lag, 0.5)[0],
               "lag_p99": C.histogram_quantile(lag, 0.99)[0], "per_replica": []}
        print(f"{args.replicas} replicas x {args.streams} streams of gpt-oss-20b on b200, "
              f"200 tokens, {args.seconds:.0f} s window; {C.machine()}")
        print(f"pacing lag p99 {C.histogram_quantile(lag, 0.99)[0] * 1000:.2f} ms, "
              f"p50 {C.histogram_quantile(lag, 0.5)[0] * 1000:.2f} ms")
        wall = end - warm
        out["cores"] = {k: (cpu1[k] - cpu0[k]) / wall for k in ("gateway", "engine", "machine")}
        print("cpu (cores): " + ", ".join(f"{k} {v:.2f}" for k, v in out["cores"].items()))
        worst = 0.0
        print(f"load generators: {len(results)} processes, "
              f"{sum(r['cpu_s'] for r in results):.1f} CPU s in all")
        every = [r for result in results for r in result["records"] if r[5]]
        errors = sum(sum(result["errors"].values()) for result in results)
        for i in range(args.replicas):
            records = [r for r in every if r[6] == base + i]
            measured = [r[2] - r[0] for r in records]
            modelled = [r[5][2] for r in records]  # (queue, ttft, e2e, ...) from the engine
            p50, m50 = C.quantile(measured, 0.5), C.quantile(modelled, 0.5)
            worst = max(worst, abs(p50 / m50 - 1))
            ttft = C.quantile([r[1] - r[0] for r in records], 0.5)
            mttft = C.quantile([r[5][1] for r in records], 0.5)
            extra = C.quantile([(r[2] - r[0]) - r[5][2] for r in records], 0.5)
            out["per_replica"].append({"requests": len(records), "e2e_p50": p50,
                                       "modelled_e2e_p50": m50, "ttft_p50": ttft,
                                       "modelled_ttft_p50": mttft, "extra_p50": extra})
            print(f"replica {i}: {len(records)} requests, e2e p50 {p50 * 1000:.1f} ms, "
                  f"modelled p50 {m50 * 1000:.1f} ms ({(p50 / m50 - 1) * 100:+.2f} %); "
                  f"ttft p50 {ttft * 1000:.1f} ms, modelled {mttft * 1000:.1f} ms; "
                  f"per request e2e - modelled p50 {extra * 1000:.1f} ms")
        print(f"worst replica: {worst * 100:.2f} % from modelled; errors {errors}")
        C.write_json(args.json, {**out, "worst": worst, "errors": errors})


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
        C.write_json(args.json, {"replicas": args.replicas, "seconds": t1 - t0,
                                 "cores": (cpu1 - cpu0) / (t1 - t0), "tick_s": 1 / C.CLK_TCK})


def run_delay(pid: int) -> float:
    """Seconds the thread `pid` has waited on a run queue (runnable, no core free) so far:
    /proc/PID/schedstat's second field."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


def scrape_loop(port: int, start: float, end: float, phase: float, record: bool,
                out=None, path: str = "/metrics", server_pid: int | None = None):
    """GET /metrics every 50 ms from start + phase until end on one keep-alive connection;
    the latencies and sizes of the scrapes, and (given the server's pid) how long the
    scraper and the server's main thread waited for a core during each scrape, together
    and the server's alone (sent to `out`, a pipe, when given)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    latencies: list[float] = []
    sizes: list[int] = []
    waits: list[float] = []
    server_waits: list[float] = []
    pids = [os.getpid()] + ([server_pid] if server_pid else [])
    next_at = start + phase
    while time.monotonic() < end:
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at += 0.05
        if record and server_pid:
            waited = [run_delay(pid) for pid in pids]
        t = time.perf_counter()
        conn.request("GET", path)
        body = conn.getresponse().read()
        if record and time.monotonic() < end:
            latencies.append(time.perf_counter() - t)
            sizes.append(len(body))
            if server_pid:
                now = [run_delay(pid) for pid in pids]
                waits.append(sum(now) - sum(waited))
                server_waits.append(now[-1] - waited[-1])
    conn.close()
    if out is not None:
        out.send((latencies, sizes, waits, server_waits))
    return latencies, sizes, waits, server_waits


def start_bare(kind: str, body: bytes):
    """A bare server (benchmarks/_bare_metrics.py) answering `body` to every GET, in a
    process of its own on a free port; (process, port, body file)."""
    fd, path = tempfile.mkstemp(suffix=".metrics")
    with os.fdopen(fd, "wb") as f:
        f.write(body)
    port = C.free_port()
    proc = subprocess.Popen([sys.executable, str(C.HERE / "_bare_metrics.py"), kind, str(port),
                             path], stdin=subprocess.DEVNULL, cwd=C.ROOT)
    wait_until(lambda: proc.poll() is not None or ready_any(port), 30,
               what=f"bare {kind} server")
    if proc.poll() is not None:
        raise RuntimeError(f"bare {kind} server exited with {proc.returncode}")
    return proc, port, path


def ready_any(port: int) -> bool:
    with contextlib.suppress(OSError):
        get(port, "/metrics")
        return True
    return False


def copy_waits(port: int) -> tuple[float, float] | None:
    """(scrapes of this port's /metrics that waited for the engine's copy, scrapes answered
    200) as the gateway counts them; None when it does not count waits."""
    text = get(port, "/metrics").decode()
    waits = served = None
    for line in text.splitlines():
        if line.startswith("inference_lab_gateway_metrics_copy_waits_total "):
            waits = float(line.split()[-1])
        elif line.startswith('inference_lab_gateway_http_requests_total{route="/metrics",'
                             'status="200"}'):
            served = float(line.split()[-1])
    return None if waits is None or not served else (waits, served)


def scrape(args) -> None:
    base, server = serve_fleet(args.replicas)
    bares = []
    with server as served, contextlib.ExitStack() as cleanup:
        wait_ready(base, args.replicas)
        copy = get(base, "/metrics")  # the gateway's copy of every replica (WatchMetrics) starts
        for kind in args.bare or []:
            proc, port, path = start_bare(kind, copy)
            cleanup.callback(os.unlink, path)
            cleanup.callback(stop_process, proc)
            bares.append((kind, proc, port))
        now = time.monotonic()
        start, end = now + 3.0, now + 3.0 + args.seconds
        # every stream from one uvloop process (the cheapest client), 64 / 8 per replica
        loadgens = C.start_loadgens([{
            "mode": "closed", "host": "127.0.0.1", "port": base,
            "ports": [base + i for i in range(args.replicas)], "path": "/v1/chat/completions",
            "body": BODY, "clients": args.streams, "t0": now + 0.5, "t_warm": start,
            "t_end": end, "t_hard": end + 30, "stagger": 0.3}])
        # replica 0's scraper is a process of its own (as an endpoint picker is: its
        # timings do not wait for this process's GIL); the others are threads here. A bare
        # server (--bare) is scraped the same way, by a process of its own at replica 0's
        # phase: the machine's floor for the same bytes under the same load.
        phases = [0.05 * i / args.replicas if args.stagger else 0.0
                  for i in range(args.replicas)]
        context = multiprocessing.get_context("fork")
        timed = [(f"{args.path} of replica 0", base, args.path, served.gateway_pid)]
        timed += [(f"bare {kind} server (same bytes, own process)", port, "/metrics", proc.pid)
                  for kind, proc, port in bares]
        measured = []
        for label, port, path, pid in timed:
            receive, send = context.Pipe(duplex=False)
            measured.append((label, receive, context.Process(
                target=scrape_loop, args=(port, start, end, phases[0], True, send, path, pid))))
        threads = [threading.Thread(target=scrape_loop,
                                    args=(base + i, start, end, phases[i], False))
                   for i in range(1, args.replicas)]
        pids = {"gateway": [served.gateway_pid], "engine": [served.engine_pid],
                "bare": [proc.pid for _, proc, _ in bares]}
        results = []
        try:
            time.sleep(max(0.0, start - time.monotonic() - 0.05))
            C.print_load("before")
            for _, _, process in measured:
                process.start()
            for t in threads:
                t.start()
            cpu0 = C.cpu_snapshot(pids)
            spies = C.start_profiles(args.profile, pids, args.seconds - 0.5, "scrape")
            for label, receive, _ in measured:
                results.append((label, receive.recv() if receive.poll(args.seconds + 30)
                                else ([], [0], [], [])))
            for t in threads:
                t.join(timeout=30)
            cpu1 = C.cpu_snapshot(pids)
            for _, _, process in measured:
                process.join(timeout=10)
            C.collect_loadgens(loadgens, timeout=60)
            for _, _, spy in spies:
                spy.wait(timeout=30)
        finally:
            C.stop_all(loadgens)
            for _, _, process in measured:
                if process.is_alive():
                    process.kill()
        counted = [copy_waits(base + i) for i in range(args.replicas)]
        C.print_load("after")
        print(f"{args.replicas} replicas scraped every 50 ms "
              f"({'phases spread' if args.stagger else 'all at once'}) while "
              f"{args.streams} streams run; {C.machine()}")
        out = {"replicas": args.replicas, "streams": args.streams, "stagger": args.stagger,
               "path": args.path, "targets": []}
        for label, (latencies, sizes, waits, server_waits) in results:
            if not latencies:
                print(f"{label}: no scrapes")
                continue
            print(f"{label}: {len(latencies)} scrapes of ~{sizes[-1]} B, "
                  f"p50 {C.quantile(latencies, 0.5) * 1000:.2f} ms, "
                  f"p99 {C.quantile(latencies, 0.99) * 1000:.2f} ms, "
                  f"max {max(latencies) * 1000:.2f} ms")
            rest = [lat - w for lat, w in zip(latencies, waits)]
            slow = [w / lat for lat, w in zip(latencies, waits) if lat > 0.005]
            out["targets"].append({
                "label": label, "scrapes": len(latencies), "bytes": sizes[-1],
                "p50": C.quantile(latencies, 0.5), "p99": C.quantile(latencies, 0.99),
                "max": max(latencies), "wait_p50": C.quantile(waits, 0.5),
                "wait_p99": C.quantile(waits, 0.99), "rest_p50": C.quantile(rest, 0.5),
                "rest_p99": C.quantile(rest, 0.99), "over_5ms": len(slow)})
            print(f"  of which waiting for a core (scraper + server main thread, "
                  f"/proc/PID/schedstat): p50 {C.quantile(waits, 0.5) * 1000:.2f} ms, "
                  f"p99 {C.quantile(waits, 0.99) * 1000:.2f} ms; latency minus that wait "
                  f"p50 {C.quantile(rest, 0.5) * 1000:.2f} ms, "
                  f"p99 {C.quantile(rest, 0.99) * 1000:.2f} ms; scrapes over 5 ms: "
                  f"{len(slow)}, waiting {C.quantile(slow, 0.5) * 100 if slow else 0:.0f} % "
                  f"of their time (median); the server's main thread alone waited p50 "
                  f"{C.quantile(server_waits, 0.5) * 1000:.2f}, p99 "
                  f"{C.quantile(server_waits, 0.99) * 1000:.2f} ms")
        if all(counted):
            waits, served = (sum(c[i] for c in counted) for i in (0, 1))
            print(f"scrapes that waited for the engine's copy (a request finished here was "
                  f"not in it yet): replica 0 {counted[0][0]:.0f} of {counted[0][1]:.0f} "
                  f"({100 * counted[0][0] / counted[0][1]:.1f} %), every port {waits:.0f} of "
                  f"{served:.0f} ({100 * waits / served:.1f} %)")
        else:
            print("scrapes that waited for the engine's copy: not counted by this gateway")
        out["cores"] = {k: (cpu1[k] - cpu0[k]) / args.seconds
                        for k in ("gateway", "engine", "bare", "machine") if k != "bare" or bares}
        out["copy_waits"] = ([sum(c[i] for c in counted) for i in (0, 1)]
                             if all(counted) else None)
        print("cpu (cores): " + ", ".join(f"{k} {v:.2f}" for k, v in out["cores"].items()))
        C.write_json(args.json, out)
        for name, path, _ in spies:
            print(f"py-spy {name} ({path}):\n{C.summarize_profile(path, 25)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("fidelity")
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--streams", type=int, default=24)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--warmup", type=float, default=3)
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--loadgens", type=int, default=1,
                   help="client processes, replicas dealt out over them (default 1: one "
                        "uvloop process reads every stream, the cheapest client)")
    p = sub.add_parser("idle")
    p.add_argument("--replicas", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--json", help="write the figures to this file")
    p = sub.add_parser("scrape")
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--stagger", action="store_true")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--path", default="/metrics",
                   help="what replica 0's timed scraper asks for (e.g. /fleet/targets, a "
                        "small answer with no engine call: the gateway's floor under the "
                        "same load)")
    p.add_argument("--bare", action="append", choices=("aiohttp", "asyncio"),
                   help="also time a bare server (plain aiohttp, or a raw asyncio protocol) "
                        "in a process of its own answering replica 0's /metrics bytes, "
                        "scraped by a process of its own at replica 0's phase, in the same "
                        "window (the machine's floor; repeat for both)")
    p.add_argument("--profile", metavar="DIR",
                   help="also py-spy the engine and the gateway during the window")
    args = parser.parse_args()
    {"fidelity": fidelity, "idle": idle, "scrape": scrape}[args.what](args)


if __name__ == "__main__":
    main()

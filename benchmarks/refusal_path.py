"""Refusal path: 529 latency of a saturated model under a sustained open-loop request rate.

A fresh `inference-lab serve` (gpt-oss-20b, b200) is saturated: POST /control/capacity
{"max_num_seqs": 1, "max_waiting": 1}, then two long streams (held by this process)
take the one running slot and the one waiting slot. Then an open loop sends non-streaming
chat requests at --rate per second for --duration seconds on keep-alive connections;
every one should be refused with 529 before any stream starts. Reported: client-side 529
latency (request write -> full response read) p50/p99/p99.9/max, the same from the
scheduled send instant (includes load-generator lateness), the rate actually achieved,
and CPU of gateway, engine and load generator over the sending window. No pass/fail.

    python benchmarks/refusal_path.py [--rate 2000] [--duration 5] [--loadgen-procs 1]
        [--profile DIR]   # also py-spy the engine and the gateway during the window
        [--no-floor]      # skip the bare aiohttp 529 server measured first (refusal_floor.py)

The floor is measured in the same run because this machine's noise moves both by a
factor of two or more within an hour; the gateway's figure means most next to it.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
import urllib.request

import _common as C


class Holder(threading.Thread):
    """A long streaming request read (and discarded) until stopped."""

    def __init__(self, port: int, max_tokens: int) -> None:
        super().__init__(daemon=True)
        body = json.dumps({"model": "gpt-oss-20b", "stream": True, "max_tokens": max_tokens,
                           "messages": [{"role": "user", "content": "Hold the slot."}]}).encode()
        self.request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                        ).encode() + body
        self.port = port
        self.stop = threading.Event()
        self.status = b""
        self.received = 0

    def run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port)) as sock:
            sock.settimeout(0.2)
            sock.sendall(self.request)
            while not self.stop.is_set():
                try:
                    data = sock.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    return
                if not self.status:
                    self.status = data[9:12]
                self.received += len(data)


def wait_saturated(served: C.Served, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cap = served.capacity()[0]
        if cap["running"] >= cap["max_num_seqs"] and cap["waiting"] >= cap["max_waiting"]:
            return cap
        time.sleep(0.05)
    raise RuntimeError(f"the model did not saturate: {served.capacity()}")


def run(args: argparse.Namespace) -> dict:
    loadgens = []
    holders: list[Holder] = []
    with C.serve(*args.serve_args.split()) as served:
        try:
            served.capacity({"max_num_seqs": 1, "max_waiting": 1})
            with urllib.request.urlopen(served.base + "/v1/models", timeout=5) as r:
                max_len = json.loads(r.read())["data"][0]["max_model_len"]
            hold_tokens = min(max(1000, max_len - 64), 100_000)
            for _ in range(2):
                holders.append(Holder(served.port, hold_tokens))
                holders[-1].start()
                time.sleep(0.2)  # the first takes the running slot, the second waits
            cap = wait_saturated(served)
            # baseline: what the two held streams alone cost (one decodes, one waits)
            pids = {"gateway": [served.gateway_pid], "engine": [served.engine_pid]}
            b0, bw0 = C.cpu_snapshot(pids), time.monotonic()
            time.sleep(args.baseline)
            b1, bw1 = C.cpu_snapshot(pids), time.monotonic()
            baseline = {k: (b1[k] - b0[k]) / (bw1 - bw0) for k in pids}
            procs = max(1, args.loadgen_procs)
            count = int(args.rate * args.duration)
            t0 = time.monotonic() + 1.0
            t_stop = t0 + args.duration
            base = {"mode": "open", "host": "127.0.0.1", "port": served.port,
                    "path": "/v1/chat/completions",
                    "body": {"model": "gpt-oss-20b", "max_tokens": 16,
                             "messages": [{"role": "user", "content": "Say hello."}]},
                    "t0": t0, "t_hard": t_stop + 10, "conns": args.conns,
                    "max_conns": args.max_conns}
            # each process sends every procs-th request of the schedule (offset start)
            configs = [{**base, "rate": args.rate / procs, "count": n,
                        "t0": t0 + i / args.rate}
                       for i, n in enumerate(C.split(count, procs)) if n]
            loadgens = C.start_loadgens(configs)
            cpu, m0, m1, wall, results, profiles = C.measure_window(
                served, loadgens, t0, t_stop, profile=args.profile, duration=args.duration,
                suffix="refusal", collect_timeout=30)
            cap_after = served.capacity()[0]
        finally:
            C.stop_all(loadgens)
            for h in holders:
                h.stop.set()
            for h in holders:
                h.join(timeout=5)
    records = [r for res in results for r in res["records"]]
    statuses: dict[str, int] = {}
    for res in results:
        for k, v in res["statuses"].items():
            statuses[str(k)] = statuses.get(str(k), 0) + v
    refused = [r for r in records if r[3] == 529]
    lat = [r[2] - r[1] for r in refused]
    lat_sched = [r[2] - r[0] for r in refused]
    late = [r[1] - r[0] for r in records]
    sends = sorted(r[1] for r in records)
    dones = sorted(r[2] for r in records)
    span_send = (sends[-1] - sends[0]) if len(sends) > 1 else float("nan")
    span_done = (dones[-1] - sends[0]) if dones else float("nan")
    rejections = (C.counter(m1, "inference_lab_rejections") - C.counter(m0, "inference_lab_rejections"))
    errors: dict[str, int] = {}
    for res in results:
        for k, v in res["errors"].items():
            errors[k] = errors.get(k, 0) + v
    n_ref = max(len(refused), 1)
    return {
        "target_rate": args.rate, "duration_s": args.duration, "scheduled": count,
        "sent": len(records), "skipped": sum(r["skipped"] for r in results),
        "unfinished": sum(r["unfinished"] for r in results), "errors": errors,
        "connections": sum(r["conns"] for r in results), "loadgen_procs": len(loadgens),
        "statuses": statuses, "capacity_before": cap, "capacity_after": cap_after,
        "sent_rate": (len(records) - 1) / span_send if span_send == span_send and span_send > 0 else float("nan"),
        "completed_529_rate": len(refused) / span_done if span_done == span_done and span_done > 0 else float("nan"),
        "engine_rejections": rejections,
        "lat_p50": C.quantile(lat, 0.5), "lat_p90": C.quantile(lat, 0.9),
        "lat_p99": C.quantile(lat, 0.99), "lat_p999": C.quantile(lat, 0.999),
        "lat_max": max(lat) if lat else float("nan"),
        "sched_p50": C.quantile(lat_sched, 0.5), "sched_p99": C.quantile(lat_sched, 0.99),
        "send_late_p99": C.quantile(late, 0.99),
        "window_s": wall, "cpu_s": cpu, "cpu_frac": {k: v / wall for k, v in cpu.items()},
        "cpu_us_per_refusal": {k: 1e6 * cpu[k] / n_ref for k in ("gateway", "engine", "loadgen")},
        "baseline_cpu_frac": baseline,
        "net_cpu_us_per_refusal": {k: 1e6 * (cpu[k] - baseline[k] * wall) / n_ref for k in baseline},
        "holder_bytes": [h.received for h in holders],
        "profiles": profiles,
    }


def report(r: dict) -> None:
    ms = lambda x: f"{x * 1e3:.2f}"  # noqa: E731
    print(f"  target {r['target_rate']:,.0f}/s for {r['duration_s']:.0f} s "
          f"({r['scheduled']:,} scheduled, {r['loadgen_procs']} loadgen proc(s), "
          f"{r['connections']} connections): sent {r['sent']:,} at {r['sent_rate']:,.0f}/s, "
          f"529s completed at {r['completed_529_rate']:,.0f}/s; statuses {r['statuses']}"
          f"{'; skipped %d' % r['skipped'] if r['skipped'] else ''}"
          f"{'; unfinished %d' % r['unfinished'] if r['unfinished'] else ''}"
          f"{'; errors %s' % r['errors'] if r['errors'] else ''}; engine counted "
          f"{r['engine_rejections']:,.0f} QUEUE_SATURATED rejections")
    print(f"  529 latency ms (write -> response): p50 {ms(r['lat_p50'])} p90 {ms(r['lat_p90'])} "
          f"p99 {ms(r['lat_p99'])} p99.9 {ms(r['lat_p999'])} max {ms(r['lat_max'])}")
    print(f"  529 latency ms (scheduled -> response): p50 {ms(r['sched_p50'])} "
          f"p99 {ms(r['sched_p99'])}; loadgen send lateness p99 {ms(r['send_late_p99'])}")
    cf, us = r["cpu_frac"], r["cpu_us_per_refusal"]
    print(f"  CPU cores gateway {cf['gateway']:.2f}, engine {cf['engine']:.2f}, loadgen "
          f"{cf['loadgen']:.2f}, other processes {cf['others']:.2f};  CPU-us per refusal: gateway {us['gateway']:.0f}, engine "
          f"{us['engine']:.0f}, loadgen {us['loadgen']:.0f}")
    b, net = r["baseline_cpu_frac"], r["net_cpu_us_per_refusal"]
    print(f"  baseline (the held streams alone) gateway {b['gateway']:.2f}, engine "
          f"{b['engine']:.2f} cores; net of it, CPU-us per refusal: gateway "
          f"{net['gateway']:.0f}, engine {net['engine']:.0f}", flush=True)
    for name, path in r.get("profiles", {}).items():
        print(f"  py-spy {name} ({path}):\n{C.summarize_profile(path)}", flush=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of sending")
    parser.add_argument("--loadgen-procs", type=int, default=1)
    parser.add_argument("--baseline", type=float, default=2.0,
                        help="seconds measuring the held streams alone first")
    parser.add_argument("--conns", type=int, default=32, help="keep-alive connections opened first")
    parser.add_argument("--max-conns", type=int, default=512, help="per load generator process")
    parser.add_argument("--profile", metavar="DIR",
                        help="py-spy record engine and gateway during the window into DIR")
    parser.add_argument("--no-floor", action="store_true",
                        help="do not measure the bare aiohttp 529 server first")
    parser.add_argument("--serve-args", default="",
                        help="extra flags for `serve`, e.g. \"--session-lane off\"")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    floor = None
    if not args.no_floor:
        import refusal_floor
        print("floor: a bare aiohttp server answering the fixed 529 (refusal_floor.py)")
        floor = refusal_floor.main(["--rate", str(args.rate), "--duration", str(args.duration),
                                    "--conns", str(args.conns)])
    print(f"machine: {C.machine()}")
    C.print_load(f"refusal path at {args.rate:,.0f}/s")
    load = C.loadavg()
    r = run(args)
    r["load_before"] = load
    r["floor"] = floor
    report(r)
    if floor is not None:
        print(f"  next to the bare floor measured just before: p50 {floor['p50'] * 1e3:.2f} / "
              f"p99 {floor['p99'] * 1e3:.2f} ms, {floor['server_us_per_request']:.0f} CPU-us "
              "per request", flush=True)
    C.write_json(args.json, {"machine": C.machine(), "result": r})
    return r


if __name__ == "__main__":
    main()

"""What the experiment runner's load generator and controller cost: CPU-microseconds per
request at an open-loop (Poisson) rate, and the send delay (from each arrival's scheduled
instant to its write: coordinated omission accounted for) p50/p99.

    python benchmarks/experiment_loadgen.py [--rate 1000] [--seconds 5] [--controller aimd]
    python benchmarks/experiment_loadgen.py --serve    # against a real `inference-lab serve`
    (--json FILE also writes the figures there)

By default the server is a stub in a child process that answers every request at once
with a short, gateway-shaped SSE stream (role+token, final chunk with "inference_lab"
timings, usage, [DONE]), so the runner's own cost is measured without sharing the two
cores with the gateway and the engine. The runner runs in this process (uvloop); its CPU
is this process's CPU time over the run (including the 250 ms scrapes) plus building the
records' columns, divided by the requests sent, split into the controller (time inside
acquire/release) and the rest (the generator). Before it, the floor: the same schedule,
timer callback and connection pool, writing pre-built bytes and waiting for each
response's end, nothing else. Prints figures, no pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as C
import numpy as np

STUB = r'''
import asyncio, sys
BODY = (b'data: {"id":"cmpl-0","object":"text_completion","created":1,"model":"gpt-oss-20b","choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}],"usage":null}\n\n'
        b'data: {"id":"cmpl-0","object":"text_completion","created":1,"model":"gpt-oss-20b","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}],"usage":null,"inference_lab":{"queue_time_s":0.0,"ttft_s":0.001,"e2e_s":0.001,"preemptions":0}}\n\n'
        b'data: {"id":"cmpl-0","object":"text_completion","created":1,"model":"gpt-oss-20b","choices":[],"usage":{"prompt_tokens":16,"completion_tokens":1,"total_tokens":17}}\n\n'
        b'data: [DONE]\n\n')
STREAM = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
          + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n")
JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]"
class P(asyncio.Protocol):
    def connection_made(self, t): self.t, self.buf = t, b""
    def data_received(self, d):
        self.buf += d
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0: return
            head = self.buf[:end]
            i = head.lower().find(b"content-length:")
            n = int(head[i + 15:].split(b"\r\n")[0]) if i >= 0 else 0
            if len(self.buf) < end + 4 + n: return
            self.buf = self.buf[end + 4 + n:]
            self.t.write(STREAM if head.startswith(b"POST /v1/") else JSON)
async def main():
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(P, "127.0.0.1", 0)
    print(srv.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()
try:
    import uvloop; uvloop.run(main())
except ImportError:
    asyncio.run(main())
'''


def scenario_file(rate: float, seconds: float, controller: str, where: Path) -> Path:
    path = where / "loadgen.toml"
    params = "{ min_limit = 1, max_limit = 10000, initial_limit = 1000 }" if controller == "aimd" else "{}"
    path.write_text(f"""
name = "loadgen-{controller}"
duration = {seconds}
model = "gpt-oss-20b"
[load]
arrival_pattern = "poisson"
arrival_rate = {rate}
input_len_dist = {{ type = "fixed", value = 16 }}
output_len_dist = {{ type = "fixed", value = 1 }}
seed = 7
[controller]
name = "{controller}"
params = {params}
""")
    return path


class Timed:
    """The controller, with the time spent inside acquire/release summed (perf_counter:
    nothing in them blocks, so wall time there is CPU time)."""

    def __init__(self, inner) -> None:
        self.inner, self.seconds = inner, 0.0

    @property
    def limit(self):
        return self.inner.limit

    @property
    def inflight(self):
        return self.inner.inflight

    def acquire(self, now):
        t = time.perf_counter()
        ticket = self.inner.acquire(now)
        self.seconds += time.perf_counter() - t
        return ticket

    def release(self, ticket, now, outcome, rtt):
        t = time.perf_counter()
        self.inner.release(ticket, now, outcome, rtt)
        self.seconds += time.perf_counter() - t


async def run(scenario, url: str, metrics_url: str | None):
    """The runner's CPU: process time over run() plus building the records' columns."""
    from inference_lab.experiments.controllers import make_controller
    from inference_lab.experiments.runner import Runner

    ctl = Timed(make_controller(scenario.controller, scenario.controller_params))
    runner = Runner(scenario, url, ctl, metrics_url=metrics_url)
    gc.collect()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    records = await runner.run()
    wall = time.perf_counter() - wall0
    req = records.req
    return req, time.process_time() - cpu0, wall, ctl.seconds


class _Bare(asyncio.Protocol):
    """The floor's connection: write pre-built bytes, wait for the chunked terminator,
    parse nothing."""

    def __init__(self) -> None:
        self.transport, self.on_done = None, None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if data.endswith(b"\r\n0\r\n\r\n"):
            self.on_done(self)


async def floor(port: int, rate: float, seconds: float) -> tuple[int, float, list[float]]:
    """The same Poisson schedule, timer callback and connection pool with nothing else
    (no controller, no parsing, no records): what the event loop, the timer and the socket
    calls cost per request on this machine."""
    import random

    from inference_lab.engine.drivers.alarm import Timer
    from inference_lab.experiments.client import Endpoint

    loop = asyncio.get_running_loop()
    raw = Endpoint(f"http://127.0.0.1:{port}", "gpt-oss-20b").request(16, 1)
    idle = [(await loop.create_connection(_Bare, "127.0.0.1", port))[1] for _ in range(64)]
    rng, delays = random.Random(7), []
    ended = loop.create_future()
    due = [time.monotonic()]
    end = due[0] + seconds

    def done(conn) -> None:
        idle.append(conn)

    def tick() -> None:
        now = time.monotonic()
        t = due[0]
        while t <= now:
            conn = idle.pop()
            conn.on_done = done
            delays.append((time.monotonic() - t) * 1000)
            conn.transport.write(raw)
            t += rng.expovariate(rate)
        if t >= end:
            ended.set_result(None)
            return
        due[0] = t
        timer.arm(t)

    timer = Timer(loop, tick)
    gc.collect()
    cpu0 = time.process_time()
    due[0] += rng.expovariate(rate)
    timer.arm(due[0])
    await ended
    while len(idle) < 64:
        await asyncio.sleep(0.001)
    cpu = time.process_time() - cpu0
    timer.close()
    for conn in idle:
        conn.transport.close()
    return len(delays), cpu, delays


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--controller", default="aimd")
    ap.add_argument("--serve", action="store_true", help="drive a real inference-lab serve")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    from inference_lab.experiments.scenario import load_scenario

    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    with tempfile.TemporaryDirectory() as tmp:
        sc = load_scenario(scenario_file(args.rate, args.seconds, args.controller, Path(tmp)))
        if args.serve:
            with C.serve() as served:
                req, cpu, wall, ctl_s = runner(run(sc, served.base, None))
        else:
            stub = subprocess.Popen([sys.executable, "-c", STUB], stdout=subprocess.PIPE)
            try:
                port = int(stub.stdout.readline())
                f_sent, f_cpu, f_delay = runner(floor(port, args.rate, args.seconds))
                req, cpu, wall, ctl_s = runner(run(sc, f"http://127.0.0.1:{port}", None))
            finally:
                stub.terminate()
                stub.wait(5)
    status = np.array(req["status"])
    sent = status != 0
    delay = np.array(req["send_delay_ms"])[sent]
    n = int(sent.sum())
    print(f"experiment runner, controller {args.controller}, open loop {args.rate:.0f}/s for "
          f"{args.seconds:g} s against {'inference-lab serve' if args.serve else 'a stub SSE server'} "
          f"(load average {os.getloadavg()[0]:.2f}, commit {commit()})")
    print(f"  requests sent {n} ({n / wall:.0f}/s), ok {int((status == 200).sum())}, "
          f"shed by the controller {int((status == 0).sum())}, other {int(((status != 200) & sent).sum())}")
    per = 1e6 / max(n, 1)
    print(f"  CPU per request {cpu * per:.1f} us = generator {(cpu - ctl_s) * per:.1f} + controller "
          f"{ctl_s * per:.1f} ({cpu / wall:.2f} cores; run() plus building the records' columns)")
    print(f"  send delay from the scheduled instant (coordinated omission accounted for): "
          f"p50 {np.percentile(delay, 50):.3f} ms, p99 {np.percentile(delay, 99):.3f} ms, "
          f"max {delay.max():.3f} ms")
    out = {"rate": args.rate, "seconds": args.seconds, "controller": args.controller,
           "serve": args.serve, "sent": n, "cpu_us_per_request": cpu * per,
           "controller_us_per_request": ctl_s * per,
           "send_delay_p50_ms": float(np.percentile(delay, 50)),
           "send_delay_p99_ms": float(np.percentile(delay, 99)), "floor": None}
    if not args.serve:
        print(f"  floor (same schedule, timer and pool; write, wait for the end, nothing else): "
              f"{1e6 * f_cpu / max(f_sent, 1):.1f} CPU-us per request, send delay p50 "
              f"{np.percentile(f_delay, 50):.3f} ms, p99 {np.percentile(f_delay, 99):.3f} ms")
        out["floor"] = {"cpu_us_per_request": 1e6 * f_cpu / max(f_sent, 1),
                        "send_delay_p99_ms": float(np.percentile(f_delay, 99))}
    C.write_json(args.json, out)


if __name__ == "__main__":
    main()

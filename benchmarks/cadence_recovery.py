"""Stream cadence after lateness ends: how soon one token per write comes back.

Against a fresh `inference-lab serve` (gpt-oss-20b on a modelled B200), two scenarios:

- `spike`: --high closed-loop streaming clients (default 128: more than this machine's
  gateway relays one token per write, so the engine groups mid-stream tokens) for
  --high-seconds, then all but --low of them stop (default 24) and those go on for
  --low-seconds;
- `stall`: --low clients, then the engine process is stopped (SIGSTOP) for --stall
  seconds and resumed (SIGCONT), and the clients go on for --low-seconds.

Every read of a stream is recorded client-side (when, how many SSE token events and how
many HTTP chunks it carried: the gateway writes each update as one chunk, so events per
chunk is events per write); the engine's `inference_lab_stream_update_interval_seconds`
and `inference_lab_relay_lag_seconds` are scraped every 0.1 s. Printed: events per write
in 0.25 s bins from just before the lateness ends, the two gauges over the same time, and
how long after the lateness ended events per write were back to <= 1.05 (and stayed).

    python benchmarks/cadence_recovery.py [--scenario both|spike|stall] [--high 128]
        [--low 24] [--high-seconds 25] [--low-seconds 10] [--stall 6]

No pass/fail: the figures go to BENCHMARKS.md with the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import threading
import time

import _common as C

BODY = {"model": "gpt-oss-20b", "stream": True, "max_tokens": 200,
        "messages": [{"role": "user", "content": "Say hello."}]}
BIN = 0.25
TARGET = 1.05


class Client(asyncio.Protocol):
    """One closed-loop streaming client on a kept-alive connection."""

    def __init__(self, request: bytes, reads: list, stop: asyncio.Event) -> None:
        self.request, self.reads, self.stop = request, reads, stop
        self.transport = None
        self.done = asyncio.get_running_loop().create_future()
        self.tail = b""

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        events = data.count(b"data: {")
        if events:  # (each server write is one HTTP chunk, ending with b"\n\n\r\n")
            self.reads.append((time.monotonic(), events, data.count(b"\n\n\r\n")))
        self.tail = (self.tail + data)[-16:]
        if self.tail.endswith(b"0\r\n\r\n"):  # a stream's end: the next request, or stop
            self.tail = b""
            if self.stop.is_set():
                self.transport.close()
            else:
                self.transport.write(self.request)

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_result(None)


def request_bytes(port: int) -> bytes:
    raw = json.dumps(BODY, separators=(",", ":")).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n").encode() + raw


def scrape_interval(served: C.Served, gauge: list, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            text = served.engine_metrics()
        except OSError:
            time.sleep(0.1)
            continue
        interval = relay = 0.0
        for line in text.splitlines():
            if line.startswith("inference_lab_stream_update_interval_seconds{"):
                interval = float(line.rsplit(" ", 1)[1])
            elif line.startswith("inference_lab_relay_lag_seconds{"):
                relay = float(line.rsplit(" ", 1)[1])
        gauge.append((time.monotonic(), interval, relay))
        time.sleep(0.1)


async def clients(port: int, count: int, reads: list, stop: asyncio.Event) -> list[Client]:
    loop = asyncio.get_running_loop()
    made = []
    for _ in range(count):
        client = Client(request_bytes(port), reads, stop)
        await loop.create_connection(lambda c=client: c, "127.0.0.1", port)
        made.append(client)
    return made


def report(label: str, reads: list, gauge: list, ended: float, until: float) -> dict:
    """Events per server write (HTTP chunk) in bins around `ended` (when the lateness
    ended), and when it was back to TARGET for good."""
    bins: dict[int, list[tuple[int, int]]] = {}
    for t, events, writes in reads:
        if ended - 2.0 <= t < until:
            bins.setdefault(int((t - ended) // BIN), []).append((events, writes))
    rows = []
    for b in sorted(bins):
        values = bins[b]
        writes = sum(w for _, w in values)
        rows.append((b * BIN, sum(e for e, _ in values) / max(writes, 1), writes))
    # back: the first bin from which the interval gauge stays 0 (every step) and the events
    # per write over the rest of the run average <= TARGET
    back = None
    for i, (start, _, _) in enumerate(rows):
        if start < 0:
            continue
        rest = rows[i:]
        events = sum(mean * n for _, mean, n in rest)
        writes = sum(n for _, _, n in rest)
        coalescing = [v for t, v, _ in gauge if t >= ended + start and v > 0]
        if writes and events / writes <= TARGET and not coalescing:
            back = start
            break
    print(f"\n{label}: events per write, 0.25 s bins (t = 0 when the lateness ended)")
    print("   t (s)  events/write  writes  interval / relay lag gauges (ms)")
    for start, mean, n in rows:
        g = [(v, r) for t, v, r in gauge if ended + start <= t < ended + start + BIN]
        gv = (f"{max(v for v, _ in g) * 1e3:.1f} / {max(r for _, r in g) * 1e3:.2f}"
              if g else "-")
        if -2.0 <= start <= 3.0 or start % 1.0 == 0:
            print(f"  {start:6.2f}  {mean:12.2f}  {n:6d}  {gv}")
    figure = f"{back:.2f} s" if back is not None else "not within the run"
    print(f"{label}: from {figure} after the lateness ended, every step's tokens in a write "
          f"of their own (the interval gauge 0) and <= {TARGET} events per write on average")
    return {"bins": rows, "back_after_s": back}


def start_scraping(served: C.Served) -> tuple[list, threading.Event]:
    """The gauge `scrape_interval` fills from a thread of its own, and the event that stops it."""
    gauge: list = []
    stop = threading.Event()
    threading.Thread(target=scrape_interval, args=(served, gauge, stop), daemon=True).start()
    return gauge, stop


async def spike(served: C.Served, args) -> dict:
    reads: list = []
    gauge, stop_scrape = start_scraping(served)
    low_stop, high_stop = asyncio.Event(), asyncio.Event()
    low = await clients(served.port, args.low, reads, low_stop)
    high = await clients(served.port, args.high - args.low, reads, high_stop)
    await asyncio.sleep(args.high_seconds)
    high_stop.set()  # each of them stops at the end of its current stream
    await asyncio.wait([c.done for c in high], timeout=30)
    ended = time.monotonic()
    await asyncio.sleep(args.low_seconds)
    low_stop.set()
    await asyncio.wait([c.done for c in low], timeout=30)
    stop_scrape.set()
    return report(f"spike ({args.high} -> {args.low} streams)", reads, gauge, ended,
                  ended + args.low_seconds)


async def stall(served: C.Served, args) -> dict:
    reads: list = []
    gauge, stop_scrape = start_scraping(served)
    stop = asyncio.Event()
    low = await clients(served.port, args.low, reads, stop)
    await asyncio.sleep(5.0)
    os.kill(served.engine_pid, signal.SIGSTOP)
    await asyncio.sleep(args.stall)
    os.kill(served.engine_pid, signal.SIGCONT)
    ended = time.monotonic()
    await asyncio.sleep(args.low_seconds)
    stop.set()
    await asyncio.wait([c.done for c in low], timeout=30)
    stop_scrape.set()
    return report(f"stall ({args.stall:g} s SIGSTOP of the engine, {args.low} streams)", reads,
                  gauge, ended, ended + args.low_seconds)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("both", "spike", "stall"), default="both")
    parser.add_argument("--high", type=int, default=128, help="streams during the spike")
    parser.add_argument("--low", type=int, default=24, help="streams before/after")
    parser.add_argument("--high-seconds", type=float, default=25.0)
    parser.add_argument("--low-seconds", type=float, default=10.0)
    parser.add_argument("--stall", type=float, default=6.0, help="seconds the engine is stopped")
    parser.add_argument("--serve-args", default="",
                        help="more flags for serve, e.g. --serve-args='--max-waiting 64'")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    print(f"machine: {C.machine()}")
    out: dict = {"config": {"high": args.high, "low": args.low, "stall": args.stall}}
    for scenario in (["spike", "stall"] if args.scenario == "both" else [args.scenario]):
        C.print_load(scenario)
        with C.serve(*args.serve_args.split()) as served:
            run = spike if scenario == "spike" else stall
            out[scenario] = asyncio.run(run(served, args))
    C.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()

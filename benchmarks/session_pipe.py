"""Diagnostic: where a stream's latency goes between the gateway and the engine.

Runs the gateway in this process (uvloop, as `serve` does) with a probe on its engine
client, in front of an `inference-lab engine` child process, under N
closed-loop streaming clients (benchmarks/_loadgen.py). Prints, over the window:

- per request, at the gateway: open -> Admitted, open -> first token progress,
  open -> Finished (the engine's modelled TTFT/e2e are next to them: anything above is
  time spent in the Session pipe or the gateway's event loop);
- the Session outbox wait (open queued -> handed to grpc.aio);
- ProgressBatch messages received per second against engine steps per second, and token
  entries per distinct tag in a batch (> 1 means the engine coalesced because its write
  was held back by flow control);
- gateway CPU (this process) and delivered tokens/s.

The timings come from the engine client's probe (gateway.engine_client.Probe: called
per Session message, never per token), so the gateway runs its own code unchanged. No
pass/fail.

    python benchmarks/session_pipe.py [--clients 256] [--duration 6]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time

import _common as C

from inference_lab.gateway.app import create_app
from inference_lab.gateway.engine_client import EngineClient, Probe
from inference_lab.gateway.server import start_gateway
from inference_lab.testing.launch import engine_process

monotonic = time.monotonic
OUTBOX_WAITS: list[float] = []
TIMES: dict[int, list[float]] = {}  # tag -> [open, admitted, first tokens, finished]
BATCHES = {"batches": 0, "entries": 0, "distinct": 0}


class Timing(Probe):
    """Timestamps of each request's events at the gateway, the outbox wait of each action,
    and the shape of each ProgressBatch."""

    def __init__(self) -> None:
        self.queued: dict[int, float] = {}  # id(action) -> when it was queued

    def on_open(self, tag: int) -> None:
        TIMES[tag] = [monotonic(), 0.0, 0.0, 0.0]

    def on_send(self, action) -> None:
        self.queued[id(action)] = monotonic()

    def on_message(self, actions) -> None:
        now = monotonic()
        for action in actions:
            queued = self.queued.pop(id(action), None)
            if queued is not None:
                OUTBOX_WAITS.append(now - queued)

    def on_batch(self, batch) -> None:
        now = monotonic()
        BATCHES["batches"] += 1
        BATCHES["entries"] += len(batch.token_tags)
        BATCHES["distinct"] += len(set(batch.token_tags))
        for event in batch.events:
            rec = TIMES.get(event.tag)
            if rec is None:
                continue
            kind = event.WhichOneof("event")
            if kind == "admitted":
                rec[1] = now
            elif kind == "tokens" and not rec[2]:
                rec[2] = now
            elif kind == "finished":
                rec[3] = now
        for tag in batch.token_tags:
            rec = TIMES.get(tag)
            if rec is not None and not rec[2]:
                rec[2] = now


async def run(args: argparse.Namespace) -> None:
    with engine_process(log_level="WARNING") as engine:
        figures = await measure(args, engine)
    report(args, *figures)


async def measure(args: argparse.Namespace, engine) -> tuple:
    loadgens: list[subprocess.Popen] = []
    runner = None
    client = EngineClient(f"127.0.0.1:{engine.port}", probe=Timing())
    try:
        runner, port = await start_gateway(create_app(f"127.0.0.1:{engine.port}", engine=client),
                                           "127.0.0.1", 0)
        t0 = monotonic() + 1.0 + args.clients / 1000
        t_warm, t_end = t0 + args.warmup, t0 + args.warmup + args.duration
        loadgens = C.start_loadgens([{
            "mode": "closed", "host": "127.0.0.1", "port": port, "path": "/v1/chat/completions",
            "body": {"model": "gpt-oss-20b", "stream": True, "max_tokens": 200,
                     "messages": [{"role": "user", "content": "Say hello."}]},
            "t0": t0, "t_warm": t_warm, "t_end": t_end, "t_hard": t_end + 30,
            "stagger": 0.5, "clients": args.clients}])
        metrics = f"http://127.0.0.1:{engine.metrics_port}/metrics"

        def steps() -> float:
            import urllib.request
            with urllib.request.urlopen(metrics, timeout=5) as r:
                return C.counter(r.read().decode(), "inference_lab_steps")

        await asyncio.sleep(max(0.0, t_warm - monotonic()))
        n0, b0, s0, c0, w0 = (len(OUTBOX_WAITS), dict(BATCHES), await asyncio.to_thread(steps),
                              time.process_time(), monotonic())
        await asyncio.sleep(max(0.0, t_end - monotonic()))
        n1, b1, s1, c1, w1 = (len(OUTBOX_WAITS), dict(BATCHES), await asyncio.to_thread(steps),
                              time.process_time(), monotonic())
        result = (await asyncio.to_thread(C.collect_loadgens, loadgens, 60))[0]
    finally:
        C.stop_all(loadgens)
        if runner is not None:
            await runner.cleanup()
        await client.close()
    return w0, w1, n0, n1, b0, b1, s0, s1, c0, c1, result


def report(args: argparse.Namespace, w0, w1, n0, n1, b0, b1, s0, s1, c0, c1, result) -> None:
    wall = w1 - w0
    recs = [r for r in TIMES.values() if w0 <= r[0] < w1 and r[3]]
    q = lambda xs: f"p50 {C.quantile(xs, .5) * 1e3:7.1f} p99 {C.quantile(xs, .99) * 1e3:7.1f} ms"  # noqa: E731
    records = [r for r in result["records"] if r[5]]
    print(f"{args.clients} clients, window {wall:.1f} s")
    print(f"  gateway: open -> Admitted {q([r[1] - r[0] for r in recs])} | open -> first tokens "
          f"{q([r[2] - r[0] for r in recs])} | open -> Finished {q([r[3] - r[0] for r in recs])}")
    print(f"  engine modelled: TTFT {q([r[5][1] for r in records])} | e2e {q([r[5][2] for r in records])}")
    print(f"  client: TTFT {q([r[1] - r[0] for r in records])} | e2e {q([r[2] - r[0] for r in records])}")
    print(f"  Session outbox wait {q(OUTBOX_WAITS[n0:n1])}; opens/s {(n1 - n0) / wall:,.0f}")
    nb = b1["batches"] - b0["batches"]
    print(f"  ProgressBatches received {nb / wall:,.0f}/s vs engine steps {(s1 - s0) / wall:,.0f}/s; "
          f"token entries per distinct tag {(b1['entries'] - b0['entries']) / max(b1['distinct'] - b0['distinct'], 1):.2f}")
    print(f"  gateway CPU {(c1 - c0) / wall:.2f} cores; delivered "
          f"{result['win_frames'] / wall * 200 / 203:,.0f} tokens/s in "
          f"{result['win_writes'] / wall:,.0f} writes/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args()
    print(f"machine: {C.machine()}")
    C.print_load(f"session pipe, {args.clients} clients")
    try:
        import uvloop
        uvloop.run(run(args))
    except ImportError:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()

"""Diagnostic: where a stream's latency goes between the gateway and the engine.

Runs the gateway in this process (uvloop, as `serve` does) with a few of its internals
wrapped for timing, in front of an `inference-lab engine` child process, under N
closed-loop streaming clients (benchmarks/_loadgen.py). Prints, over the window:

- per request, at the gateway: open -> Admitted, open -> first token progress,
  open -> Finished (the engine's modelled TTFT/e2e are next to them: anything above is
  time spent in the Session pipe or the gateway's event loop);
- the Session outbox wait (open queued -> handed to grpc.aio);
- ProgressBatch messages received per second against engine steps per second, and token
  entries per distinct tag in a batch (> 1 means the engine coalesced because its write
  was held back by flow control);
- gateway CPU (this process) and delivered tokens/s.

`--no-bdp` turns HTTP/2 BDP probing off on the gateway's channel: the receive window
stays at its initial size, so the engine's writes block (and it merges progress) instead
of gRPC buffering seconds of per-step batches.

`--coalesce-ms T` prototypes a "stream interval" in the gateway: token progress wakes a
stream's handler at most every T ms (its first token and its Finished still wake it at
once, so TTFT and end-to-end are not held back); the tokens in between go out in the
next write. It shows what write coalescing would buy before anyone changes the code.

Relies on private names of gateway.engine_client (_Session._actions/_dispatch/_outbox,
RequestStream._push/_tokens, EngineClient.open, CHANNEL_OPTIONS); it fails loudly when
they change. No pass/fail.

    python benchmarks/session_pipe.py [--clients 256] [--duration 6] [--no-bdp]
        [--coalesce-ms T]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

import _common as C

sys.path.insert(0, str(C.ROOT))

from inference_lab.gateway import engine_client as ec  # noqa: E402
from inference_lab.gateway.app import create_app  # noqa: E402
from inference_lab.gateway.server import start_gateway  # noqa: E402
from inference_lab.v1 import engine_pb2 as pb  # noqa: E402

monotonic = time.monotonic
OUTBOX_WAITS: list[float] = []
TIMES: dict[int, list[float]] = {}  # tag -> [open, admitted, first tokens, finished]
BATCHES = {"batches": 0, "entries": 0, "distinct": 0}


def instrument(coalesce_s: float = 0.0) -> None:
    def send(self, action):
        self._outbox.put_nowait((action, monotonic()))

    async def actions(self):  # as _Session._actions: everything queued goes in one message
        outbox = self._outbox
        while True:
            item = await outbox.get()
            batch = []
            while item is not None:
                action, queued = item
                OUTBOX_WAITS.append(monotonic() - queued)
                batch.append(action)
                if outbox.empty():
                    break
                item = outbox.get_nowait()
            if batch:
                yield pb.SessionActions(actions=batch)
            if item is None:
                return

    class CountingCall:
        def __init__(self, call):
            self._call = call

        def __getattr__(self, name):
            return getattr(self._call, name)

        def __aiter__(self):
            return self._iterate()

        async def _iterate(self):
            async for batch in self._call:
                BATCHES["batches"] += 1
                BATCHES["entries"] += len(batch.token_tags)
                BATCHES["distinct"] += len(set(batch.token_tags))
                yield batch

    dispatch = ec._Session._dispatch

    async def counting_dispatch(self):
        self.call = CountingCall(self.call)
        return await dispatch(self)

    open_ = ec.EngineClient.open

    async def timed_open(self, *args, **kwargs):
        t = monotonic()
        stream = await open_(self, *args, **kwargs)
        TIMES[stream.tag] = [t, 0.0, 0.0, 0.0]
        return stream

    push, tokens = ec.RequestStream._push, ec.RequestStream._tokens

    def timed_push(self, event):
        rec = TIMES.get(self.tag)
        if rec is not None:
            if event.HasField("admitted"):
                rec[1] = monotonic()
            elif event.HasField("finished"):
                rec[3] = monotonic()
        push(self, event)

    def timed_tokens(self, total):
        rec = TIMES.get(self.tag)
        if rec is not None and not rec[2]:
            rec[2] = monotonic()
        tokens(self, total)

    if coalesce_s > 0:
        last: dict[int, float] = {}
        pending: set[int] = set()

        def flush(stream) -> None:
            pending.discard(stream.tag)
            last[stream.tag] = monotonic()
            stream._wake()

        def coalescing_tokens(self, total):
            rec = TIMES.get(self.tag)
            if rec is not None and not rec[2]:
                rec[2] = monotonic()
            if total <= self.total:
                return
            first = self.total == 0
            self.total = total
            now = monotonic()
            since = now - last.get(self.tag, 0.0)
            if first or since >= coalesce_s:
                last[self.tag] = now
                self._wake()
            elif self.tag not in pending:
                pending.add(self.tag)
                self._loop.call_later(coalesce_s - since, flush, self)

    ec._Session.send = send
    ec._Session._actions = actions
    ec._Session._dispatch = counting_dispatch
    ec.EngineClient.open = timed_open
    ec.RequestStream._push = timed_push
    ec.RequestStream._tokens = coalescing_tokens if coalesce_s > 0 else timed_tokens


async def run(args: argparse.Namespace) -> None:
    eport, mport = C.free_port(), C.free_port()
    engine = subprocess.Popen(
        [sys.executable, "-P", "-m", "inference_lab", "--log-level", "WARNING", "engine",
         "--host", "127.0.0.1", "--port", str(eport), "--metrics-port", str(mport)],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=C.ROOT)
    loadgens: list[subprocess.Popen] = []
    runner = None
    try:
        line = await asyncio.to_thread(engine.stdout.readline)
        if not line.startswith(b"engine ready"):
            raise RuntimeError("the engine did not start")
        runner, port = await start_gateway(create_app(f"127.0.0.1:{eport}"), "127.0.0.1", 0)
        t0 = monotonic() + 1.0 + args.clients / 1000
        t_warm, t_end = t0 + args.warmup, t0 + args.warmup + args.duration
        loadgens = C.start_loadgens([{
            "mode": "closed", "host": "127.0.0.1", "port": port, "path": "/v1/chat/completions",
            "body": {"model": "gpt-oss-20b", "stream": True, "max_tokens": 200,
                     "messages": [{"role": "user", "content": "Say hello."}]},
            "t0": t0, "t_warm": t_warm, "t_end": t_end, "t_hard": t_end + 30,
            "stagger": 0.5, "clients": args.clients}])
        metrics = f"http://127.0.0.1:{mport}/metrics"

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
        C.stop_process(engine)
    wall = w1 - w0
    recs = [r for r in TIMES.values() if w0 <= r[0] < w1 and r[3]]
    q = lambda xs: f"p50 {C.quantile(xs, .5) * 1e3:7.1f} p99 {C.quantile(xs, .99) * 1e3:7.1f} ms"  # noqa: E731
    records = [r for r in result["records"] if r[5]]
    print(f"{args.clients} clients, BDP probing {'off' if args.no_bdp else 'on'}, "
          f"coalescing {args.coalesce_ms:g} ms, window {wall:.1f} s")
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
    parser.add_argument("--coalesce-ms", type=float, default=0.0,
                        help="prototype: wake a stream for token progress at most every T ms")
    parser.add_argument("--no-bdp", action="store_true",
                        help="grpc.http2.bdp_probe = 0 on the gateway's channel")
    args = parser.parse_args()
    if args.no_bdp:
        ec.CHANNEL_OPTIONS = tuple(ec.CHANNEL_OPTIONS) + (("grpc.http2.bdp_probe", 0),)
    instrument(args.coalesce_ms / 1000)
    print(f"machine: {C.machine()}")
    C.print_load(f"session pipe, {args.clients} clients")
    try:
        import uvloop
        uvloop.run(run(args))
    except ImportError:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()

"""The engine alone over gRPC: messages per second, engine CPU and pacing lag while N
requests stream concurrently (closed loop, 200-token replies), through the multiplexed
Session (the gateway's path) or one Submit stream per request.

    python benchmarks/engine_stream.py [--clients 256] [--seconds 10] [--mode session|submit]

Starts `inference-lab engine` as a child process on free loopback ports; the client runs
in this process. Prints figures, no pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import grpc

from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lag_histogram(metrics_port: int) -> dict[float, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    buckets = {}
    for le, value in re.findall(r'inference_lab_pacing_lag_seconds_bucket\{le="([^"]+)"[^}]*\} (\S+)', text):
        buckets[float("inf") if le == "+Inf" else float(le)] = float(value)
    return buckets


def quantile(before: dict, after: dict, q: float) -> float:
    """Bucket-interpolated quantile of the histogram difference."""
    edges = sorted(after)
    counts = [after[e] - before.get(e, 0.0) for e in edges]
    total = counts[-1]
    if total <= 0:
        return 0.0
    rank = q * total
    prev_edge, prev_count = 0.0, 0.0
    for edge, count in zip(edges, counts):
        if count >= rank:
            if edge == float("inf"):
                return prev_edge
            return prev_edge + (edge - prev_edge) * (rank - prev_count) / max(count - prev_count, 1e-12)
        prev_edge, prev_count = edge, count
    return edges[-2]


async def run_session(stub, clients: int, seconds: float, max_tokens: int) -> tuple[int, int, int]:
    call = stub.Session()
    tags = iter(range(1, 10**9))
    messages = tokens = finished = 0
    deadline = time.monotonic() + seconds

    def open_one():
        return pb.SessionActions(actions=[pb.SessionAction(open=pb.Open(
            tag=next(tags), request=pb.SubmitRequest(prompt_tokens=16, max_tokens=max_tokens)))])

    for _ in range(clients):
        await call.write(open_one())
    live = clients
    while live:
        batch = await call.read()
        messages += 1
        tokens += len(batch.token_tags)
        for event in batch.events:
            if event.HasField("finished") or event.HasField("rejected"):
                live -= 1
                finished += event.HasField("finished")
                if time.monotonic() < deadline:
                    await call.write(open_one())
                    live += 1
    await call.done_writing()
    return messages, tokens, finished


async def run_submit(stub, clients: int, seconds: float, max_tokens: int) -> tuple[int, int, int]:
    deadline = time.monotonic() + seconds
    counts = [0, 0, 0]

    async def user():
        while time.monotonic() < deadline:
            async for event in stub.Submit(pb.SubmitRequest(prompt_tokens=16, max_tokens=max_tokens)):
                counts[0] += 1
                counts[1] += event.HasField("tokens")
                counts[2] += event.HasField("finished")

    await asyncio.gather(*(user() for _ in range(clients)))
    return tuple(counts)


async def main_async(args) -> None:
    port, metrics_port = free_port(), free_port()
    engine = subprocess.Popen([sys.executable, "-m", "inference_lab", "--log-level", "WARNING",
                               "engine", "--port", str(port), "--metrics-port", str(metrics_port)],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert engine.stdout.readline().startswith(b"engine ready")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            run = run_session if args.mode == "session" else run_submit
            await run(stub, args.clients, 1.5, args.max_tokens)  # warm-up
            lag0, cpu0, self0, wall0 = (lag_histogram(metrics_port), cpu_seconds(engine.pid),
                                        time.process_time(), time.perf_counter())
            messages, token_msgs, finished = await run(stub, args.clients, args.seconds, args.max_tokens)
            wall = time.perf_counter() - wall0
            engine_cpu = cpu_seconds(engine.pid) - cpu0
            client_cpu = time.process_time() - self0
            lag1 = lag_histogram(metrics_port)
        generated = finished * args.max_tokens
        print(f"mode {args.mode}, {args.clients} concurrent requests of {args.max_tokens} tokens, "
              f"{wall:.1f} s (load average {os.getloadavg()[0]:.2f})")
        print(f"gRPC messages/s received: {messages / wall:,.0f}  "
              f"(token updates/s {token_msgs / wall:,.0f}; requests finished {finished:,})")
        print(f"tokens/s generated (finished requests): {generated / wall:,.0f}")
        print(f"engine CPU: {engine_cpu / wall:.2f} cores, {1000 * engine_cpu / max(generated, 1):.3f} CPU s "
              f"per 1,000 tokens; client CPU {client_cpu / wall:.2f} cores")
        print(f"pacing lag p50 {1000 * quantile(lag0, lag1, 0.5):.2f} ms, "
              f"p99 {1000 * quantile(lag0, lag1, 0.99):.2f} ms")
    finally:
        engine.terminate()
        engine.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--mode", choices=("session", "submit"), default="session")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()

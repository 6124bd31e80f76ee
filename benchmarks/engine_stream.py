"""The engine alone over gRPC: messages per second, engine CPU and pacing lag while N
requests stream concurrently (closed loop, 200-token replies), through the multiplexed
Session (the gateway's path), the same Session over the engine's same-host lane (a plain
socket: the gateway's path on one host), or one Submit stream per request.

    python benchmarks/engine_stream.py [--clients 256] [--seconds 10] [--mode session|lane|submit]
        [--json FILE]

Starts `inference-lab engine` as a child process on free loopback ports; the client runs
in this process. Prints figures, no pass/fail.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import urllib.request

import _common as C
from inference_lab.testing.launch import engine_process
from inference_lab.testing.lane_client import RawLane
import grpc

from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc


LAG = "inference_lab_pacing_lag_seconds"


def metrics_text(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def lag_quantile(before: str, after: str, q: float) -> float:
    buckets = C.histogram_delta(C.histogram(before, LAG), C.histogram(after, LAG))[0]
    return C.histogram_quantile(buckets, q)[0]


async def run_session(stub, clients: int, seconds: float, max_tokens: int,
                      make_request=None, lane: bool = False) -> tuple[int, int, int]:
    """`make_request()` builds each SubmitRequest (default: a 16-token prompt); `lane`:
    over the engine's Session lane instead of the gRPC stream."""
    call = await RawLane.open(stub) if lane else stub.Session()
    tags = iter(range(1, 10**9))
    messages = tokens = finished = 0
    deadline = time.monotonic() + seconds
    make_request = make_request or (lambda: pb.SubmitRequest(prompt_tokens=16,
                                                              max_tokens=max_tokens))

    def open_one():
        return pb.SessionActions(actions=[pb.SessionAction(open=pb.Open(
            tag=next(tags), request=make_request()))])

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
    with engine_process(log_level="WARNING") as engine:
        port, metrics_port = engine.port, engine.metrics_port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            run = {"session": run_session, "submit": run_submit,
                   "lane": functools.partial(run_session, lane=True)}[args.mode]
            await run(stub, args.clients, 1.5, args.max_tokens)  # warm-up
            lag0, cpu0, self0, wall0 = (metrics_text(metrics_port), C.proc_cpu(engine.pid),
                                        time.process_time(), time.perf_counter())
            messages, token_msgs, finished = await run(stub, args.clients, args.seconds, args.max_tokens)
            wall = time.perf_counter() - wall0
            engine_cpu = C.proc_cpu(engine.pid) - cpu0
            client_cpu = time.process_time() - self0
            lag1 = metrics_text(metrics_port)
        generated = finished * args.max_tokens
        print(f"mode {args.mode}, {args.clients} concurrent requests of {args.max_tokens} tokens, "
              f"{wall:.1f} s (load average {os.getloadavg()[0]:.2f})")
        print(f"Session messages/s received: {messages / wall:,.0f}  "
              f"(token updates/s {token_msgs / wall:,.0f}; requests finished {finished:,})")
        print(f"tokens/s generated (finished requests): {generated / wall:,.0f}")
        print(f"engine CPU: {engine_cpu / wall:.2f} cores, {1000 * engine_cpu / max(generated, 1):.3f} CPU s "
              f"per 1,000 tokens; client CPU {client_cpu / wall:.2f} cores")
        print(f"pacing lag p50 {1000 * lag_quantile(lag0, lag1, 0.5):.2f} ms, "
              f"p99 {1000 * lag_quantile(lag0, lag1, 0.99):.2f} ms")
        C.write_json(args.json, {
            "mode": args.mode, "clients": args.clients, "seconds": wall,
            "messages_per_s": messages / wall, "token_updates_per_s": token_msgs / wall,
            "finished": finished, "tokens_per_s": generated / wall,
            "engine_cores": engine_cpu / wall,
            "engine_cpu_per_1k_tokens": 1000 * engine_cpu / max(generated, 1),
            "client_cores": client_cpu / wall, "lag_p50": lag_quantile(lag0, lag1, 0.5),
            "lag_p99": lag_quantile(lag0, lag1, 0.99)})


def main() -> None:
    parser = C.stream_arguments(__doc__, clients=256, seconds=10.0)
    parser.add_argument("--mode", choices=("session", "lane", "submit"), default="session")
    parser.add_argument("--json", help="write the figures to this file")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()

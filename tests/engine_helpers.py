"""Starting the real engine in-process on free loopback ports, and talking to it."""

from __future__ import annotations

import dataclasses
import contextlib
import urllib.request

import grpc

from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.service.server import EngineServer
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc


@contextlib.asynccontextmanager
async def running_engine(max_waiting: int | None = None, max_num_seqs: int | None = None,
                         deployments=None, **server_options):
    """The real engine (gpt-oss-20b on b200 by default) on 127.0.0.1, free ports;
    server_options go to EngineServer (update_rate, control_token)."""
    deployments = deployments or default_deployments("b200", max_waiting)
    if max_num_seqs is not None:
        for d in deployments:
            d.scheduler = dataclasses.replace(d.scheduler, max_num_seqs=max_num_seqs)
    server = EngineServer(deployments, "127.0.0.1", 0, 0, **server_options)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace=0.0)


@contextlib.asynccontextmanager
async def engine_stub(server: EngineServer):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield engine_pb2_grpc.EngineStub(channel)


async def collect(call) -> list[pb.SubmitEvent]:
    """Every remaining message of a server stream (read() style, so it can follow reads)."""
    events = []
    while (event := await call.read()) is not grpc.aio.EOF:
        events.append(event)
    return events


def submit_request(prompt: int = 16, max_tokens: int = 200, model: str = "") -> pb.SubmitRequest:
    return pb.SubmitRequest(model=model, prompt_tokens=prompt, max_tokens=max_tokens)


def engine_rejections(metrics_port: int, model: str = "gpt-oss-20b", replica: int = 0) -> float:
    """The engine's own count of QUEUE_SATURATED refusals of `model`, from its /metrics."""
    key = (f'inference_lab_rejections_total{{engine="{replica}",model_name="{model}",'
           'reason="QUEUE_SATURATED"}')
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith(key)), 0.0)

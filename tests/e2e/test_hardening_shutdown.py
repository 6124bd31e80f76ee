"""Graceful shutdown of the real commands (`engine`, `serve`, `gateway`): on SIGTERM, gRPC
health goes NOT_SERVING and new
work gets UNAVAILABLE / 503 at once, in-flight streams finish within the grace period (or
are ended as aborted when it runs out), and the process exits 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine_helpers import collect
from hardening_helpers import content_tokens, sse_frames
from inference_lab.testing.launch import Proc, command, engine_process, gateway_process
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc
from inference_lab.common.ports import free_port
from inference_lab.testing.poll import until

MODEL = "gpt-oss-20b"
ENGINE_SERVICE = "inference_lab.v1.Engine"
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def exit_status(proc: Proc, timeout: float) -> int:
    return await asyncio.wait_for(asyncio.to_thread(proc.proc.wait), timeout)


async def test_sigterm_on_the_engine_drains_in_flight_streams_refuses_new_work_and_exits_0():
    with engine_process("--grace", "20") as engine:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}") as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            calls = [stub.Submit(pb.SubmitRequest(prompt_tokens=16, max_tokens=4000 + i))
                     for i in range(3)]
            for call in calls:
                assert (await call.read()).HasField("admitted")
                assert (await call.read()).HasField("tokens")  # streaming has begun
            engine.proc.send_signal(signal.SIGTERM)

            async def not_serving():
                reply = await health.Check(health_pb2.HealthCheckRequest(service=ENGINE_SERVICE))
                return reply.status == NOT_SERVING

            await until(not_serving)
            late = stub.Submit(pb.SubmitRequest(prompt_tokens=16, max_tokens=5))
            try:
                await late.read()
                raise AssertionError("a request was admitted after SIGTERM")
            except grpc.aio.AioRpcError as err:
                assert err.code() is grpc.StatusCode.UNAVAILABLE and "shutting down" in err.details()
            assert engine.proc.poll() is None  # still draining
            for i, call in enumerate(calls):
                events = await asyncio.wait_for(collect(call), 20)
                finished = events[-1].finished
                assert finished.reason == pb.FINISH_REASON_LENGTH
                assert finished.completion_tokens == 4000 + i
        assert await exit_status(engine, 15) == 0


async def test_sigterm_on_the_engine_aborts_what_outlives_the_grace_period_and_exits_0():
    with engine_process("--grace", "1") as engine:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}") as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            call = stub.Submit(pb.SubmitRequest(prompt_tokens=16, max_tokens=120_000))
            assert (await call.read()).HasField("admitted")
            assert (await call.read()).HasField("tokens")
            started = time.monotonic()
            engine.proc.send_signal(signal.SIGTERM)
            events = await asyncio.wait_for(collect(call), 10)
            assert events[-1].finished.reason == pb.FINISH_REASON_ABORTED
            assert 0 < events[-1].finished.completion_tokens < 120_000
        assert await exit_status(engine, 10) == 0
        assert time.monotonic() - started < 5  # the grace period (1 s) plus the stop itself


async def test_sigterm_on_serve_finishes_streams_answers_503_meanwhile_and_exits_0():
    port, engine_port = free_port(), free_port()
    serve = Proc(command("serve", "--port", str(port), "--engine-port", str(engine_port),
                         "--metrics-port", "0", "--grace", "20"))
    base = f"http://127.0.0.1:{port}"
    try:
        engine_pid = int(serve.wait_for_log(r"engine started: pid (\d+)").group(1))
        serve.wait_for_log(r"serving on http://")
        async with aiohttp.ClientSession() as http:
            async def healthy() -> bool:
                try:
                    return (await http.get(base + "/health")).status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await until(healthy, timeout=30)
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "stream": True, "stream_options": {"include_usage": True}}
            streams = [await http.post(base + "/v1/chat/completions",
                                       json={**body, "max_tokens": 4000 + i}) for i in range(3)]
            for resp in streams:
                assert resp.status == 200
                await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 10)
            serve.proc.send_signal(signal.SIGTERM)

            async def health_503() -> bool:
                return (await http.get(base + "/health")).status == 503

            await until(health_503)
            resp = await http.post(base + "/v1/chat/completions", json={**body, "max_tokens": 5})
            assert resp.status == 503 and resp.content_type == "application/json"
            assert (await resp.json())["error"]["code"] == "engine_unavailable"
            for i, resp in enumerate(streams):  # in flight: finished whole
                frames = sse_frames(await asyncio.wait_for(resp.read(), 20))
                assert frames[-1] == b"[DONE]" and b'"error"' not in b"".join(frames)
                assert content_tokens(frames) == 4000 + i
                assert json.loads(frames[-2])["usage"]["completion_tokens"] == 4000 + i
        assert await exit_status(serve, 30) == 0
        assert "engine stopped" in serve.log()
        try:
            os.kill(engine_pid, 0)
            raise AssertionError("the engine child outlived serve")
        except ProcessLookupError:
            pass
    finally:
        serve.close()


async def test_sigterm_on_the_gateway_lets_open_streams_finish_then_exits_0():
    with engine_process() as engine, gateway_process(engine.port) as gateway:
        base = f"http://127.0.0.1:{gateway.port}"
        async with aiohttp.ClientSession() as http:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "stream": True, "max_tokens": 3000}
            resp = await http.post(base + "/v1/chat/completions", json=body)
            assert resp.status == 200
            await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 10)
            gateway.proc.send_signal(signal.SIGTERM)
            frames = sse_frames(await asyncio.wait_for(resp.read(), 10))
            assert frames[-1] == b"[DONE]" and content_tokens(frames) == 3000
        assert await exit_status(gateway, 10) == 0

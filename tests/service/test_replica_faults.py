"""Replica-level faults on the real engine (in-process, real gRPC), driven through the real
gateway's /control/faults/replica: a stall freezes and resumes, a slowdown multiplies step
times, validation, the control token."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine_helpers import collect, engine_stub, running_engine, submit_request
from inference_lab.gateway import create_app
from inference_lab.v1 import engine_pb2 as pb

MODEL = "gpt-oss-20b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def lab():
    async with running_engine() as engine:
        async with TestClient(TestServer(create_app(f"127.0.0.1:{engine.port}"))) as client:
            yield engine, client


async def fault(client, **body) -> dict:
    resp = await client.post("/control/faults/replica", json=body)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def engine_health(engine) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2)
        return reply.status


async def test_a_stall_freezes_every_stream_and_they_resume_after(lab):
    engine, client = lab
    async with engine_stub(engine) as stub:
        call = stub.Submit(submit_request(max_tokens=2000))
        first = await call.read()
        assert first.HasField("admitted")
        await call.read()  # tokens are flowing
        state = await fault(client, fault="stall", seconds=1.0)
        assert 0.9 <= state["stalled_for_s"] <= 1.0
        frozen_at = time.monotonic()
        assert (await client.get("/health")).status == 503
        assert await engine_health(engine) == health_pb2.HealthCheckResponse.NOT_SERVING
        resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
        events = await collect(call)  # everything after the stall, to the end
        assert time.monotonic() - frozen_at >= 0.95  # nothing finished while frozen
        assert resp.status == 200  # it queued during the stall and ran after
        finished = events[-1].finished
        assert finished.reason == pb.FINISH_REASON_LENGTH and finished.completion_tokens == 2000
    assert (await client.get("/health")).status == 200
    assert await engine_health(engine) == health_pb2.HealthCheckResponse.SERVING
    assert (await fault(client, fault="clear"))["stalled_for_s"] == 0


async def test_clear_ends_a_stall_at_once(lab):
    engine, client = lab
    await fault(client, fault="stall", seconds=60)
    assert (await client.get("/health")).status == 503
    state = await fault(client, fault="clear")
    assert state["stalled_for_s"] == 0
    resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert resp.status == 200 and (await client.get("/health")).status == 200


async def modelled_e2e(client, tokens: int = 300) -> float:
    resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": tokens})
    return (await resp.json())["inference_lab"]["e2e_s"]


async def test_a_slowdown_multiplies_step_times_for_its_period(lab):
    _, client = lab
    normal = await modelled_e2e(client)
    state = await fault(client, fault="slow", factor=4, seconds=30)
    assert state["slow_factor"] == 4 and 29 <= state["slow_for_s"] <= 30
    slow = await modelled_e2e(client)
    assert slow == pytest.approx(4 * normal, rel=1e-6)  # every step of the lone request x 4
    await fault(client, fault="slow", factor=2, seconds=0.2)  # replaces it, for 0.2 s
    deadline = time.monotonic() + 5
    while (state := await (await client.get("/control/faults/replica")).json())["slow_factor"] != 1:
        assert time.monotonic() < deadline, state
        await asyncio.sleep(0.02)  # the period is wall time
    assert await modelled_e2e(client) == pytest.approx(normal, rel=1e-6)


@pytest.mark.parametrize("body, named", [
    ({"fault": "stall"}, "seconds > 0"),
    ({"fault": "slow", "seconds": 1}, "factor"),
    ({"fault": "slow", "factor": 0}, "$.factor"),
    ({"fault": "stall", "seconds": 1, "factor": 2}, "factor applies"),
    ({"fault": "explode"}, "crash"),
    ({"fault": "stall", "seconds": -1}, "$.seconds"),
])
async def test_bad_replica_faults_are_a_400(lab, body, named):
    _, client = lab
    resp = await client.post("/control/faults/replica", json=body)
    assert resp.status == 400
    assert named in (await resp.json())["error"]["message"]


async def test_an_unknown_replica_is_a_404(lab):
    _, client = lab
    resp = await client.post("/control/faults/replica", json={"fault": "clear", "replica": 3})
    assert resp.status == 404


async def test_inject_fault_needs_the_control_token():
    async with running_engine(control_token="ct") as engine:
        async with engine_stub(engine) as stub:
            request = pb.InjectFaultRequest(kind=pb.ENGINE_FAULT_STALL, seconds=1)
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await stub.InjectFault(request)
            assert exc.value.code() is grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await stub.InjectFault(pb.InjectFaultRequest(), metadata=(
                    ("authorization", "Bearer ct"),))
            assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            state = await stub.GetFaultState(pb.GetFaultStateRequest())
            assert state.slow_factor == 1 and state.stalled_for_s == 0

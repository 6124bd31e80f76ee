"""Replica-level faults on the real engine (in-process, real gRPC), driven through the real
gateway's /control/faults/replica: a stall freezes and resumes, a slowdown multiplies step
times, validation, the control token; with three replicas over real HTTP on every
replica's port, a fault aimed at one replica acts on it alone."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine_helpers import collect, engine_stub, running_engine, submit_request
from inference_lab.gateway import create_app
from inference_lab.testing.poll import until
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

    async def over() -> bool:  # the period is wall time
        return (await (await client.get("/control/faults/replica")).json())["slow_factor"] == 1

    await until(over, timeout=5, interval=0.02, what="the 0.2 s slow fault over")
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


# ---- one replica of several (a `replica` field), over real HTTP on every replica's port ----


@pytest.fixture
async def fleet_lab():
    """A real engine with 3 replicas and the real gateway in front (replica i on base + i)."""
    from inference_lab.common.ports import free_port_run
    from inference_lab.gateway.fleet import FleetGateway

    async with running_engine(replicas=3) as engine:
        base = free_port_run(3)
        gateway = FleetGateway(f"127.0.0.1:{engine.port}", "127.0.0.1", base)
        await gateway.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                await eventually_open(http, base + 2)
                yield engine, http, [f"http://127.0.0.1:{base + i}" for i in range(3)]
        finally:
            await gateway.stop()


async def eventually_open(http, port: int) -> None:
    """Replica ports open once the gateway has read the replica set (at its start)."""
    async def open_() -> bool:
        try:
            async with http.get(f"http://127.0.0.1:{port}/health") as resp:
                return resp.status == 200
        except aiohttp.ClientConnectionError:
            return False

    await until(open_, timeout=10, interval=0.05, what=f"port {port} open")


async def post(http, url: str, body: dict) -> tuple[int, dict]:
    async with http.post(url + "/control/faults/replica", json=body) as resp:
        return resp.status, await resp.json()


def core_of(engine, replica: int):
    return engine.fleet.replicas[MODEL][replica].runtime.core


async def test_a_stall_of_one_replica_freezes_it_alone(fleet_lab):
    engine, http, urls = fleet_lab
    status, state = await post(http, urls[0], {"fault": "stall", "seconds": 30, "replica": 1})
    assert status == 200 and state["replica"] == 1 and 29 < state["stalled_for_s"] <= 30
    health = []
    for url in urls:
        async with http.get(url + "/health") as resp:
            health.append(resp.status)
    assert health == [200, 503, 200]
    assert await engine_health(engine) == health_pb2.HealthCheckResponse.SERVING
    async with http.get(urls[0] + "/control/faults/replica") as resp:  # the whole engine's
        assert (await resp.json()) == {"replica": None, "stalled_for_s": 0.0,
                                       "slow_factor": 1.0, "slow_for_s": 0.0}
    frozen = asyncio.ensure_future(http.post(urls[1] + "/v1/chat/completions",
                                             json={**CHAT, "max_tokens": 5}))
    async with http.post(urls[2] + "/v1/chat/completions",
                         json={**CHAT, "max_tokens": 5}) as resp:  # another replica serves
        assert resp.status == 200 and (await resp.json())["usage"]["completion_tokens"] == 5
    assert not frozen.done()
    await post(http, urls[2], {"fault": "clear", "replica": 1})  # any port may ask
    async with await frozen as resp:
        assert resp.status == 200 and (await resp.json())["usage"]["completion_tokens"] == 5


async def test_a_slowdown_of_one_replica_combines_with_the_whole_engines(fleet_lab):
    engine, http, urls = fleet_lab
    assert (await post(http, urls[0], {"fault": "slow", "factor": 4, "replica": 2}))[1][
        "slow_factor"] == 4
    await post(http, urls[0], {"fault": "slow", "factor": 2})  # every replica
    assert [core_of(engine, i).slowdown for i in range(3)] == [2, 2, 8]
    async with http.get(urls[0] + "/control/faults/replica?replica=2") as resp:
        assert (await resp.json())["slow_factor"] == 8  # in effect: both
    await post(http, urls[0], {"fault": "clear", "replica": 2})
    assert [core_of(engine, i).slowdown for i in range(3)] == [2, 2, 2]
    await post(http, urls[0], {"fault": "slow", "factor": 3, "replica": 0})
    await post(http, urls[0], {"fault": "clear"})  # without a replica: everything
    assert [core_of(engine, i).slowdown for i in range(3)] == [1, 1, 1]


async def test_a_crash_of_one_replica_restarts_it_alone_with_its_capacity(fleet_lab):
    engine, http, urls = fleet_lab
    async with http.post(urls[1] + "/control/capacity", json={"max_num_seqs": 5}) as resp:
        assert resp.status == 200
    before = [core_of(engine, i) for i in range(3)]
    async with http.post(urls[1] + "/v1/chat/completions",
                         json={**CHAT, "max_tokens": 3000, "stream": True}) as stream:
        assert (await stream.content.readline()).startswith(b"data: ")  # under way
        status, state = await post(http, urls[0], {"fault": "crash", "replica": 1})
        assert status == 200 and state["replica"] == 1
        rest = await stream.read()  # the stream ends with an error frame, not [DONE] after
    assert b'"error"' in rest and b"finish_reason\":\"length" not in rest
    after = [core_of(engine, i) for i in range(3)]
    assert after[0] is before[0] and after[2] is before[2] and after[1] is not before[1]
    assert (after[1].max_num_seqs, before[0].max_num_seqs) == (5, 256)
    for url in urls:  # the engine process lives on; replica 1 serves again
        async with http.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 2}) as resp:
            assert resp.status == 200


async def test_a_fault_for_a_replica_no_model_has_is_a_404(fleet_lab):
    _, http, urls = fleet_lab
    status, body = await post(http, urls[0], {"fault": "stall", "seconds": 1, "replica": 7})
    assert status == 404 and body["error"]["code"] == "replica_not_found"
    async with http.get(urls[0] + "/control/faults/replica?replica=7") as resp:
        assert resp.status == 404
    async with http.get(urls[0] + "/control/faults/replica?replica=x") as resp:
        assert resp.status == 400 and "replica" in (await resp.json())["error"]["message"]

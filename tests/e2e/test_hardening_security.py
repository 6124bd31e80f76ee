"""Security: `--api-key` (Bearer, /v1/*) and `--control-token` (/control/* over HTTP, and
SetCapacity over gRPC as `authorization` metadata), from flags or from
INFERENCE_LAB_API_KEY / INFERENCE_LAB_CONTROL_TOKEN; compared in constant time; 401 with
the error envelope (gRPC: UNAUTHENTICATED); secrets never in argv of the engine child, in
`--help` or in logs; loopback by default."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import subprocess

import aiohttp
import grpc
import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer

from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.service.server import EngineServer
from inference_lab.gateway import create_app
from inference_lab.gateway.app import STATE
from inference_lab.testing.launch import Proc, command, engine_process, gateway_process
from inference_lab.testing.poll import wait_until
from inference_lab.cli import build_parser
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc
from inference_lab.common.ports import free_port

MODEL = "gpt-oss-20b"
KEY, TOKEN = "sk-lab-3f9a1c", "ct-lab-77e2b0"


async def set_capacity(port: int, metadata=None, **fields) -> pb.CapacityResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        return await stub.SetCapacity(pb.SetCapacityRequest(**fields), metadata=metadata, timeout=5)


@contextlib.asynccontextmanager
async def engine_with_token(token: str):
    server = EngineServer(default_deployments("b200"), "127.0.0.1", 0, 0, control_token=token)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace=0.0)


async def assert_401(resp: aiohttp.ClientResponse, code: str) -> None:
    assert resp.status == 401 and resp.content_type == "application/json"
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    err = (await resp.json())["error"]
    assert set(err) == {"message", "type", "code"}
    assert (err["type"], err["code"]) == ("authentication_error", code)


# ---- the engine ------------------------------------------------------------------------------


async def test_the_engine_refuses_set_capacity_without_its_control_token():
    async with engine_with_token(TOKEN) as server:
        for metadata in [None, (("authorization", "Bearer nope"),), (("authorization", TOKEN),),
                         (("authorization", "Basic " + TOKEN),), (("authorization", f"Bearer {TOKEN}x"),),
                         (("x-token", f"Bearer {TOKEN}"),)]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await set_capacity(server.port, metadata, max_waiting=3)
            assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED and info.value.details()
            assert server.runtimes[0].core.max_waiting == 0  # nothing changed
        reply = await set_capacity(server.port, (("authorization", f"Bearer {TOKEN}"),), max_waiting=3)
        assert reply.models[0].max_waiting == 3


@contextlib.asynccontextmanager
async def engine_with_secrets(key: str | None, token: str | None):
    server = EngineServer(default_deployments("b200"), "127.0.0.1", 0, 0, control_token=token,
                          **({"api_key": key} if key else {}))
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace=0.0)


async def submit(port: int, metadata=None) -> list[pb.SubmitEvent]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        call = stub.Submit(pb.SubmitRequest(model=MODEL, prompt_tokens=8, max_tokens=2),
                           metadata=metadata, timeout=10)
        return [event async for event in call]


async def lane_info(port: int, metadata=None) -> pb.SessionLaneInfo:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        return await stub.SessionLane(pb.SessionLaneRequest(), metadata=metadata, timeout=5)


@pytest.mark.parametrize("key,token", [(KEY, TOKEN), (KEY, None), (None, TOKEN)])
async def test_with_secrets_the_engine_generates_and_hands_out_its_lane_only_with_one(key, token):
    async with engine_with_secrets(key, token) as server:
        for metadata in [None, (("authorization", "Bearer nope"),), (("authorization", KEY or TOKEN),)]:
            for call in (submit, lane_info):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(server.port, metadata)
                assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED, call
                assert "authorization: Bearer" in info.value.details()
        for secret in filter(None, (key, token)):  # either secret passes
            events = await submit(server.port, (("authorization", f"Bearer {secret}"),))
            assert events[-1].finished.completion_tokens == 2
            info = await lane_info(server.port, (("authorization", f"Bearer {secret}"),))
            assert len(info.token) == 32
        assert server.runtimes[0].metrics is not None


async def test_without_secrets_the_engine_generates_for_anyone():
    async with engine_with_secrets(None, None) as server:
        assert (await submit(server.port))[-1].finished.completion_tokens == 2


@pytest.mark.parametrize("lane", ["auto", "off"])
async def test_a_gateway_passes_its_own_secret_to_an_engine_that_requires_one(lane):
    async with engine_with_secrets(KEY, TOKEN) as server:
        app = create_app(f"127.0.0.1:{server.port}", api_key=KEY, control_token=TOKEN,
                         session_lane=lane)
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": "a",
                                                              "max_tokens": 3},
                                     headers={"Authorization": f"Bearer {KEY}"})
            assert resp.status == 200 and (await resp.json())["usage"]["completion_tokens"] == 3
            assert app[STATE].engine._session.transport == ("lane" if lane == "auto" else "grpc")


async def test_the_engine_command_takes_the_control_token_from_the_environment():
    with engine_process(env={"INFERENCE_LAB_CONTROL_TOKEN": TOKEN}) as engine:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await set_capacity(engine.port, max_num_seqs=8)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        reply = await set_capacity(engine.port, (("authorization", f"Bearer {TOKEN}"),), max_num_seqs=8)
        assert reply.models[0].max_num_seqs == 8
        async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}") as channel:  # reads stay open
            stub = engine_pb2_grpc.EngineStub(channel)
            assert (await stub.GetCapacity(pb.GetCapacityRequest())).models[0].max_num_seqs == 8
        assert TOKEN not in engine.log()


# ---- the gateway -----------------------------------------------------------------------------


async def test_gateway_flags_guard_v1_and_control_and_forward_the_control_token_to_the_engine():
    with engine_process("--control-token", TOKEN) as engine, \
            gateway_process(engine.port, "--api-key", KEY, "--control-token", TOKEN) as gateway:
        base = f"http://127.0.0.1:{gateway.port}"
        api = {"Authorization": f"Bearer {KEY}"}
        control = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as http:
            await assert_401(await http.get(base + "/v1/models"), "invalid_api_key")
            await assert_401(await http.get(base + "/v1/models", headers=control), "invalid_api_key")
            await assert_401(await http.post(base + "/v1/completions", json={"model": MODEL, "prompt": "a"},
                                             headers={"Authorization": f"Bearer {KEY}x"}),
                             "invalid_api_key")
            assert (await http.get(base + "/v1/models", headers=api)).status == 200
            await assert_401(await http.get(base + "/control/capacity"), "invalid_control_token")
            await assert_401(await http.post(base + "/control/capacity", json={"max_num_seqs": 2},
                                             headers=api), "invalid_control_token")
            resp = await http.post(base + "/control/capacity", json={"max_num_seqs": 2}, headers=control)
            assert resp.status == 200 and (await resp.json())[0]["max_num_seqs"] == 2  # forwarded
            assert (await http.get(base + "/health")).status == 200  # probes and scrapers stay open
            assert (await http.get(base + "/metrics")).status == 200
        assert KEY not in gateway.log() and TOKEN not in gateway.log()


async def test_a_gateway_without_the_engines_control_token_gets_401_from_the_engine():
    with engine_process("--control-token", TOKEN) as engine, gateway_process(engine.port) as gateway:
        async with aiohttp.ClientSession() as http:
            resp = await http.post(f"http://127.0.0.1:{gateway.port}/control/capacity",
                                   json={"max_num_seqs": 2})
            await assert_401(resp, "invalid_control_token")
            assert "authorization" in (await resp.json())["error"]["message"]


async def test_secrets_are_compared_in_constant_time(monkeypatch):
    compared = []
    real = hmac.compare_digest

    def spy(a, b):
        if b in (KEY.encode(), TOKEN.encode()):  # (not the Session lane's own token, whose
            compared.append((type(a), type(b)))  # hello may or may not come in this window)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    async with engine_with_token(TOKEN) as server:
        app = create_app(f"127.0.0.1:{server.port}", api_key=KEY, control_token=TOKEN)
        async with TestClient(TestServer(app)) as client:
            assert (await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).status == 200
            assert (await client.get("/control/capacity",
                                     headers={"Authorization": f"Bearer {TOKEN}ü"})).status == 401
        await set_capacity(server.port, (("authorization", f"Bearer {TOKEN}"),), max_waiting=1)
    # the gateway's two checks and SetCapacity's, besides the engine's of the gateway's Session
    assert len(compared) >= 3 and set(compared) == {(bytes, bytes)}


# ---- the commands ----------------------------------------------------------------------------


def test_serve_reads_both_secrets_from_the_environment_and_keeps_them_off_argv_and_logs():
    port, engine_port = free_port(), free_port()
    serve = Proc(command("serve", "--port", str(port), "--engine-port", str(engine_port),
                         "--metrics-port", "0", "--grace", "1"),
                 env={"INFERENCE_LAB_API_KEY": KEY, "INFERENCE_LAB_CONTROL_TOKEN": TOKEN})
    try:
        engine_pid = int(serve.wait_for_log(r"engine started: pid (\d+)").group(1))
        serve.wait_for_log(r"serving on http://")
        base = f"http://127.0.0.1:{port}"
        good = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=30)
        bad = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0, timeout=30)

        def answered():  # until the gateway answers
            try:
                return good.completions.create(model=MODEL, prompt="a", max_tokens=3)
            except openai.APIConnectionError:
                return None

        reply = wait_until(answered, timeout=10, interval=0.1, what="the gateway's first answer")
        assert reply.usage.completion_tokens == 3
        with pytest.raises(openai.AuthenticationError) as info:
            bad.completions.create(model=MODEL, prompt="a", max_tokens=3)
        assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
        with pytest.raises(grpc.aio.AioRpcError) as info:  # the child engine wants it too
            asyncio.run(set_capacity(engine_port, max_waiting=1))
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with open(f"/proc/{engine_pid}/cmdline", "rb") as f:
            assert TOKEN.encode() not in f.read()
        assert KEY not in serve.log() and TOKEN not in serve.log()
        assert serve.terminate() == 0
    finally:
        serve.close()


@pytest.mark.parametrize("sub", ["serve", "gateway", "engine"])
def test_help_never_shows_a_secret_from_the_environment(sub):
    out = subprocess.run(command(sub, "--help"), capture_output=True, text=True, timeout=30,
                         env={**os.environ, "INFERENCE_LAB_API_KEY": KEY,
                              "INFERENCE_LAB_CONTROL_TOKEN": TOKEN})
    assert out.returncode == 0 and "--control-token" in out.stdout and "--api-key" in out.stdout
    assert KEY not in out.stdout and TOKEN not in out.stdout


@pytest.mark.parametrize("secrets", [{}, {"INFERENCE_LAB_CONTROL_TOKEN": TOKEN}])
def test_an_engine_beyond_loopback_without_secrets_logs_a_warning(secrets):
    unset = {"INFERENCE_LAB_API_KEY": "", "INFERENCE_LAB_CONTROL_TOKEN": ""}  # empty: unset
    proc = Proc(command("engine", "--host", "0.0.0.0", "--port", str(free_port()),
                        "--metrics-port", "0"), env={**unset, **secrets})
    try:
        proc.wait_for_log(r"engine ready")
        warned = "the engine listening on 0.0.0.0 without --api-key or --control-token"
        assert (warned in proc.log()) == (not secrets)
    finally:
        proc.close()


def test_serve_gateway_and_engine_listen_on_loopback_by_default():
    parser = build_parser()
    assert parser.parse_args(["serve"]).host == "127.0.0.1"
    assert parser.parse_args(["gateway"]).host == "127.0.0.1"
    assert parser.parse_args(["engine"]).host == "127.0.0.1"

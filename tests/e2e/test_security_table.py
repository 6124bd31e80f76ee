"""The tables of docs/security.md are the lab's access rules, checked against the real
servers so that the two cannot drift: every HTTP route of the gateway's router (the base
port of a fleet, which has every route) and every RPC the engine registers (from its
service descriptors and reflection) must have a row, every row must be served, and each
answers as its row says, with no credentials, the wrong one and the right one, from a web
page and not. A route or RPC added without a row fails here.

A real engine (in process, both secrets set) over real gRPC, and the real fleet gateway
(both secrets) over real HTTP, on free loopback ports."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from inference_lab.engine.service.server import EngineServer
from inference_lab.engine.sim.config import default_deployments
from inference_lab.gateway.fleet import FleetGateway

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
KEY, TOKEN = "sk-lab-table", "ct-lab-table"
PAGE = "http://page.example"
BEARER = {"API key": {"Authorization": f"Bearer {KEY}"},
          "control token": {"Authorization": f"Bearer {TOKEN}"}}
NEEDS = {"API key", "control token", "open"}
RPC_NEEDS = {"API key or control token", "control token", "open"}


def table(heading: str) -> list[list[str]]:
    """The rows of the first table under `## heading`, cells stripped of backticks."""
    text = DOC.read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows[2:]]


def route_rows() -> dict[tuple[str, str], tuple[str, str]]:
    """(method, route) -> (needs, CORS) from the doc."""
    rows = {}
    for route, methods, needs, cors in table("Every route"):
        assert needs in NEEDS and cors in {"open", "refused"}, (route, needs, cors)
        for method in methods.split(", "):
            assert (method, route) not in rows, f"{method} {route} twice"
            rows[(method, route)] = (needs, cors)
    return rows


def rpc_rows() -> dict[str, str]:
    rows = {}
    for rpc, needs in table("Every RPC"):
        assert needs in RPC_NEEDS, (rpc, needs)
        rows[rpc] = needs
    return rows


@pytest.fixture
async def lab():
    engine = EngineServer(default_deployments("b200"), "127.0.0.1", 0, 0, api_key=KEY,
                          control_token=TOKEN, max_loras=1)
    await engine.start()
    fleet = FleetGateway(f"127.0.0.1:{engine.port}", port=0, api_key=KEY, control_token=TOKEN,
                         dev_mode=True)  # (vLLM's dev-mode routes are in the table too)
    port = await fleet.start()
    try:
        yield engine, fleet, f"http://127.0.0.1:{port}"
    finally:
        await fleet.stop()
        await engine.stop(grace=0.0)


def served_routes(fleet: FleetGateway) -> set[tuple[str, str]]:
    runner, _ = fleet.listeners[0]
    return {(r.method, r.resource.canonical) for r in runner.app.router.routes()
            if r.method not in ("HEAD", "OPTIONS")}


async def test_every_route_answers_as_the_table_in_the_docs_says(lab):
    _, fleet, base = lab
    rows = route_rows()
    assert served_routes(fleet) == set(rows), "routes served and docs/security.md differ"
    # the last ones change the lab for everyone: after the others
    # (/pause holds every later generation request: last too)
    order = sorted(rows, key=lambda mr: (mr[1] in ("/control/replicas", "/control/faults/replica",
                                                   "/pause"), mr))
    async with aiohttp.ClientSession() as http:
        async def call(method: str, route: str, headers: dict, body: bytes | None = b"{}",
                       content_type: str = "application/json"):
            path = re.sub(r"\{[^}]+\}", "x", route)
            extra = {"Content-Type": content_type} if method == "POST" else {}
            async with http.request(method, base + path, headers={**extra, **headers},
                                    data=body if method == "POST" else None) as resp:
                text = await resp.text()
                return resp.status, resp.headers, text

        for method, route in order:
            needs, cors = rows[(method, route)]
            where = f"{method} {route}"
            status, _, text = await call(method, route, {})  # no credentials
            if needs == "open":
                assert status not in (401, 403) and status < 500, (where, status, text)
            else:
                # (Anthropic's envelope names no code: the message says which secret)
                assert status == 401 and "authentication_error" in text, (where, status, text)
                assert f"missing {needs}" in text, (where, text)
                wrong = BEARER["control token" if needs == "API key" else "API key"]
                assert (await call(method, route, wrong))[0] == 401, where
            right = BEARER.get(needs, {})
            status, headers, text = await call(method, route, right)
            assert status not in (401, 403, 415) and status < 500, (where, status, text)
            # from a web page, and its preflight
            status, headers, text = await call(method, route, {**right, "Origin": PAGE})
            preflight, pre_headers, _ = await call("OPTIONS", route, {
                "Origin": PAGE, "Access-Control-Request-Method": method}, body=None)
            if cors == "open":
                assert status not in (401, 403) and headers["Access-Control-Allow-Origin"] == "*"
                assert preflight == 200 and pre_headers["Access-Control-Allow-Origin"] == "*"
            else:
                assert status == 403 and "cross_origin_forbidden" in text, (where, status)
                assert "Access-Control-Allow-Origin" not in headers
                assert preflight == 403 and "Access-Control-Allow-Origin" not in pre_headers
                if method == "POST":  # a body a page can send without a preflight
                    for kind in ("text/plain", "application/x-www-form-urlencoded"):
                        status, _, _ = await call(method, route, right, content_type=kind)
                        assert status == 415, (where, kind, status)


def engine_methods() -> dict[str, tuple[bool, bool]]:
    """Every method of every service the engine registers: (client, server) streaming."""
    from grpc_health.v1 import health_pb2

    from inference_lab.v1 import engine_pb2
    from inference_lab.vllm_grpc import vllm_engine_pb2

    out = {}
    for module in (engine_pb2, vllm_engine_pb2, health_pb2, reflection_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                out[f"{service.full_name}/{m.name}"] = (m.client_streaming, m.server_streaming)
    return out


async def registered_services(port: int) -> set[str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for reply in stub.ServerReflectionInfo(iter([request])):
            return {s.name for s in reply.list_services_response.service}
    return set()


async def call_rpc(channel: grpc.aio.Channel, method: str, streaming: tuple[bool, bool],
                   metadata) -> grpc.StatusCode:
    """The status of `method` called with an empty request (raw bytes: any message's
    defaults), or OK once its first reply came; a stream is cut after that."""
    path = "/" + method
    kind = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
            (True, False): channel.stream_unary, (True, True): channel.stream_stream}[streaming]
    call = kind(path)(iter(()) if streaming[0] else b"", metadata=metadata, timeout=5)
    try:
        if streaming[1]:
            await call.read()
            call.cancel()
        else:
            await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_every_rpc_answers_as_the_table_in_the_docs_says(lab):
    engine, _, _ = lab
    rows = rpc_rows()
    methods = engine_methods()
    services = await registered_services(engine.port)
    documented = {rpc.rsplit("/", 1)[0] for rpc in rows}
    assert services == documented, "services registered and docs/security.md differ"
    engine_rows = {rpc for rpc in rows if not rpc.endswith("/*")}
    assert engine_rows == {m for m in methods
                           if m.startswith(("inference_lab.v1.Engine/", "vllm.grpc.engine.VllmEngine/"))}

    def needs(method: str) -> str:
        return rows.get(method) or rows[method.rsplit("/", 1)[0] + "/*"]

    unauthenticated = grpc.StatusCode.UNAUTHENTICATED
    # SetReplicas last: its empty request scales every model to 0 (and Pause pauses them)
    order = sorted((m for m in methods if m.rsplit("/", 1)[0] in services),
                   key=lambda m: (m.endswith(("/SetReplicas", "/Pause")), m))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}") as channel:
        for method in order:
            need, streaming = needs(method), methods[method]
            code = await call_rpc(channel, method, streaming, None)
            assert (code is unauthenticated) == (need != "open"), (method, code)
            if need == "control token":
                wrong = (("authorization", f"Bearer {KEY}"),)
                assert await call_rpc(channel, method, streaming, wrong) is unauthenticated
            secrets = {"open": [None], "control token": [TOKEN],
                       "API key or control token": [KEY, TOKEN]}[need]
            for secret in secrets:
                metadata = (("authorization", f"Bearer {secret}"),) if secret else None
                code = await call_rpc(channel, method, streaming, metadata)
                assert code not in (unauthenticated, grpc.StatusCode.UNKNOWN,
                                    grpc.StatusCode.INTERNAL), (method, secret, code)

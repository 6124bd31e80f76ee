"""A replica port's /metrics on a kept-alive connection is answered at the edge, without
aiohttp's request machinery (gateway.edge FAST_GETS): the real engine (in-process, real
gRPC, 2 replicas) and the real fleet gateway over real TCP. The answer is the one the
aiohttp handler gives (status, headers, x-request-id, body, the route's counts); anything
that is not exactly one plain GET of /metrics on an idle connection is aiohttp's."""

from __future__ import annotations

import asyncio

import pytest

from engine_helpers import running_engine
from hardening_helpers import exchange, record_reads
from metrics_helpers import sample
from inference_lab.common.ports import free_port_run
from inference_lab.gateway import control as gateway_app
from inference_lab.gateway.fleet import FleetGateway
from inference_lab.testing.poll import until

MODEL = "gpt-oss-20b"
COUNT = "inference_lab_gateway_http_requests_total"


@pytest.fixture
async def replica_port(monkeypatch):
    """(port of replica 1, calls of the aiohttp /metrics handler)."""
    calls: list[int] = []
    original = gateway_app.metrics

    async def counted(request):
        calls.append(1)
        return await original(request)

    monkeypatch.setattr(gateway_app, "metrics", counted)  # (before create_app adds the route)
    async with running_engine(replicas=2) as engine:
        base = free_port_run(2)
        gateway = FleetGateway(f"127.0.0.1:{engine.port}", "127.0.0.1", base)
        await gateway.start()
        try:
            await until(lambda: gateway.port_of(1) is not None, timeout=10, interval=0.02,
                        what="replica 1's port open")
            yield base + 1, calls
        finally:
            await gateway.stop()


GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.fast_paths
async def test_kept_alive_scrapes_are_answered_at_the_edge_as_the_handler_answers(replica_port):
    port, calls = replica_port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answers = []
        for raw in (GET, GET, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Request-ID: scrape-7\r\n\r\n",
                    GET):
            answers += await exchange(writer, reader, raw)
        assert len(calls) == 1  # the first on the connection went through aiohttp
        for index, (status, headers, body) in enumerate(answers):
            assert status == b"HTTP/1.1 200 OK"
            assert list(headers) == ["content-type", "content-length", "date", "server",
                                     "x-request-id"]
            assert headers["content-type"] == answers[0][1]["content-type"]
            assert headers["server"] == answers[0][1]["server"]
            text = body.decode()
            assert text.startswith("# HELP vllm:")
            assert sample(text, "vllm:num_requests_waiting", engine="1", model_name=MODEL) == 0
            assert sample(text, COUNT, route="/metrics", status="200") == index  # each counted
            assert sample(text, "inference_lab_gateway_engine_metrics_up") == 1
        assert answers[2][1]["x-request-id"] == "scrape-7"
        ids = {headers["x-request-id"] for _, headers, _ in answers}
        assert len(ids) == 4 and all(len(i) == 32 for i in ids - {"scrape-7"})
        # the engine part is the very copy the aiohttp handler serves
        assert answers[1][2].split(b"# HELP inference_lab_gateway_")[0] == \
            answers[0][2].split(b"# HELP inference_lab_gateway_")[0]
    finally:
        writer.close()


@pytest.mark.parametrize("raw, answers", [
    (GET + GET, 2),  # pipelined: two in one write
    (b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n", 1),
    (b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n", 1),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 1),
    (b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 0),
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nOrigin: http://page.example\r\n\r\n", 1),
])
async def test_anything_else_is_aiohttps(replica_port, raw, answers):
    port, calls = replica_port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await exchange(writer, reader, GET)  # the connection has served one: it may go fast
        assert len(calls) == 1
        if answers:
            for status, headers, body in await exchange(writer, reader, raw, answers):
                assert status.endswith(b" 200 OK") and b"# HELP vllm:" in body
                if b"Origin:" in raw:  # a browser's scrape gets the CORS header
                    assert headers["access-control-allow-origin"] == "*"
            assert len(calls) == 1 + answers
        else:  # HEAD: headers alone
            writer.write(raw)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200 OK") and len(calls) == 2
        if b"close" in raw or b"1.0" in raw:
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, as aiohttp does
    finally:
        writer.close()


@pytest.mark.fast_paths
async def test_a_request_split_across_reads_is_aiohttps(replica_port, monkeypatch):
    port, calls = replica_port
    reads = record_reads(monkeypatch)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await exchange(writer, reader, GET)
        writer.write(GET[:10])
        await writer.drain()
        await until(lambda: reads[-1:] == [GET[:10]], what="the first part read alone")
        [(status, _, body)] = await exchange(writer, reader, GET[10:])
        assert status == b"HTTP/1.1 200 OK" and b"# HELP vllm:" in body
        assert len(calls) == 2
        await exchange(writer, reader, GET)  # and the next whole one goes fast again
        assert len(calls) == 2
    finally:
        writer.close()

"""The gateway when things go wrong: engine down or dying, clients leaving, many at once."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from inference_lab.gateway import create_app
from inference_lab.gateway.app import STATE
from inference_lab.testing.fake_engine import FAKE_MODEL, FakeEngine

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hello"}]}


async def assert_503(resp: aiohttp.ClientResponse) -> None:
    assert resp.status == 503
    assert resp.content_type == "application/json"
    err = (await resp.json())["error"]
    assert (err["type"], err["code"]) == ("server_error", "engine_unavailable")


# ---- engine down, engine back -----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_engine_never_started_is_503_json(stream):
    probe = FakeEngine()
    port = await probe.start()
    await probe.stop()  # a port nobody listens on
    async with TestClient(TestServer(create_app(f"127.0.0.1:{port}"))) as c:
        await assert_503(await c.post("/v1/chat/completions", json={**CHAT, "stream": stream}))
        await assert_503(await c.get("/health"))
        await assert_503(await c.get("/control/capacity"))


async def test_stopped_engine_is_503_and_a_restart_on_the_same_port_is_served(client, fake):
    assert (await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})).status == 200
    await fake.stop()
    await assert_503(await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2}))
    await assert_503(await client.get("/health"))
    await fake.start(fake.port)
    resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
    assert resp.status == 200
    assert (await resp.json())["usage"]["completion_tokens"] == 2
    assert (await client.get("/health")).status == 200


async def test_unresponsive_engine_is_503_within_about_a_second():
    writers: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)  # accept, never answer (a hung engine)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with TestClient(TestServer(create_app(f"127.0.0.1:{port}"))) as c:
            started = time.monotonic()
            await assert_503(await c.post("/v1/chat/completions", json=CHAT))
            assert time.monotonic() - started < 2.0
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


async def test_engine_dying_mid_stream_ends_with_an_error_frame_then_done(client, fake):
    fake.mode = "partial"  # admitted and one token, then nothing
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert resp.status == 200
    role = await resp.content.readuntil(b"\n\n")
    token = await resp.content.readuntil(b"\n\n")
    assert b'"role":"assistant"' in role and b'" token"' in token
    await fake.stop()
    rest = (await resp.content.read()).decode()
    frames = rest.split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    error = json.loads(frames[-3].removeprefix("data: "))
    assert error["error"]["code"] == "engine_unavailable"


async def test_engine_dying_before_a_non_stream_answer_is_503(client, fake):
    fake.mode = "hold"
    pending = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT))
    await fake.opened.wait(1)
    await fake.stop()
    await assert_503(await pending)


# ---- clients that leave -----------------------------------------------------------------------


async def test_client_leaving_mid_stream_cancels_the_engine_request(client, fake):
    fake.mode = "hold"
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert resp.status == 200  # admitted: headers are out
    resp.close()
    (tag,) = await fake.cancelled.wait(1)
    assert tag == fake.opened.items[0].tag


async def test_client_leaving_before_admission_cancels_the_engine_request(client, fake):
    fake.mode = "silent"  # the engine never answers the Open
    pending = asyncio.ensure_future(
        client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    await fake.opened.wait(1)
    pending.cancel()
    (tag,) = await fake.cancelled.wait(1)
    assert tag == fake.opened.items[0].tag


async def test_watchdog_cancels_when_the_runner_does_not_cancel_handlers(fake):
    app = create_app(fake.target, disconnect_poll_s=0.02)
    runner = web.AppRunner(app, handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    fake.mode = "hold"
    try:
        async with aiohttp.ClientSession() as session:
            pending = asyncio.ensure_future(
                session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT))
            await fake.opened.wait(1)
            pending.cancel()
            (tag,) = await fake.cancelled.wait(timeout=2)
        assert tag == fake.opened.items[0].tag
    finally:
        await runner.cleanup()


async def test_no_cancel_is_sent_for_requests_that_finished(client, fake):
    resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert resp.status == 200
    assert fake.cancelled.items == []
    assert client.server.app[STATE].inflight == {}


# ---- many at once -----------------------------------------------------------------------------


async def test_concurrent_requests_share_one_session_and_get_their_own_tokens(client, fake):
    async def one(n: int) -> int:
        resp = await client.post("/v1/completions", json={
            "model": FAKE_MODEL, "prompt": "x", "max_tokens": n, "stream": True,
            "stream_options": {"include_usage": True}})
        payloads = [f.removeprefix("data: ") for f in (await resp.text()).split("\n\n")[:-1]]
        chunks = [json.loads(p) for p in payloads[:-1]]
        assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["text"]) == n
        return chunks[-1]["usage"]["completion_tokens"]

    counts = list(range(1, 41))
    assert await asyncio.gather(*(one(n) for n in counts)) == counts
    assert len(fake.sessions.items) == 1
    assert len(fake.opened.items) == 40

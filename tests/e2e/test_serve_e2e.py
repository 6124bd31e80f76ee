"""`inference-lab serve` end to end: the official openai SDK, the reference page's curl
commands, 529 before any stream, 503 while the engine is down, and disconnects."""

import asyncio
import json
import os
import signal
import subprocess
import time

import aiohttp
import openai
import pytest

from engine_helpers import engine_rejections
from hardening_helpers import json_request
from inference_lab.common.ports import free_port
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import until, wait_until
from system_tools import tool



@pytest.fixture(scope="module")
def served():
    metrics_port = free_port()
    with serve("--metrics-port", str(metrics_port)) as s:
        s.metrics_port = metrics_port
        yield s


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(autouse=True)
def reset_capacity(request):
    yield
    if "served" in request.fixturenames:
        base = request.getfixturevalue("served").base
        curl_json(base, "POST", "/control/capacity", {"max_num_seqs": 256, "max_waiting": 0})


def curl_json(base: str, method: str, path: str, body=None) -> tuple[int, dict | list]:
    """The reference page's curl commands, run with real curl when it is installed."""
    curl = tool("curl", optional=True)
    if curl:
        cmd = [curl, "-s", "-w", "\n%{http_code}", "-X", method, base + path]
        if body is not None:
            cmd += ["-H", "content-type: application/json", "-d", json.dumps(body)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
        text, _, code = out.rpartition("\n")
        return int(code), json.loads(text)
    return json_request(base, method, path, body)


def test_chat_completion_non_streaming_has_exact_usage(client):
    reply = client.chat.completions.create(
        model="gpt-oss-20b", messages=[{"role": "user", "content": "hello there"}], max_tokens=12)
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.role == "assistant" and reply.choices[0].message.content
    assert reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    modelled = reply.model_extra["inference_lab"]  # the engine's simulated timings
    assert 0 < modelled["ttft_s"] < modelled["e2e_s"] and modelled["preemptions"] == 0


def test_chat_completion_streaming_sends_role_first_tokens_then_usage(client):
    chunks = list(client.chat.completions.create(
        model="gpt-oss-20b", messages=[{"role": "user", "content": "hi"}], max_tokens=25,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 25
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 25
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    assert finals[0].model_extra["inference_lab"]["e2e_s"] > 0


def test_completions_streaming_and_not_with_token_id_prompts(client):
    reply = client.completions.create(model="gpt-oss-20b", prompt=[1, 2, 3, 4, 5], max_tokens=7)
    assert reply.usage.prompt_tokens == 5 and reply.usage.completion_tokens == 7
    chunks = list(client.completions.create(model="gpt-oss-20b", prompt="once upon a time",
                                            max_tokens=9, stream=True,
                                            stream_options={"include_usage": True}))
    assert sum(1 for c in chunks if c.choices and c.choices[0].text) == 9
    assert chunks[-1].usage.completion_tokens == 9


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["gpt-oss-20b"]


def test_reference_page_capacity_commands_return_the_documented_shapes(served):
    code, body = curl_json(served.base, "GET", "/control/capacity")
    assert code == 200
    assert body == [{"model": "gpt-oss-20b", "max_waiting": 0, "max_num_seqs": 256,
                     "waiting": 0, "running": 0}]
    code, body = curl_json(served.base, "POST", "/control/capacity", {"max_num_seqs": 16})
    assert code == 200 and body[0]["max_num_seqs"] == 16 and body[0]["max_waiting"] == 0
    code, body = curl_json(served.base, "POST", "/control/capacity", {"max_waiting": 64})
    assert code == 200 and (body[0]["max_num_seqs"], body[0]["max_waiting"]) == (16, 64)
    assert set(body[0]) == {"model", "max_waiting", "max_num_seqs", "waiting", "running"}
    for bad in ({"max_num_seqs": 0}, {"max_waiting": -1}, {"bogus": 1}, {}):
        code, body = curl_json(served.base, "POST", "/control/capacity", bad)
        assert code == 400, bad
        assert set(body["error"]) >= {"message", "type", "code"}
    code, body = curl_json(served.base, "POST", "/control/capacity", {"model": "nope", "max_waiting": 1})
    assert code == 404


async def _saturate(served, session, holders: int = 3):
    """max_num_seqs 1, max_waiting 2, and three long streams holding the slots: once the
    engine has let go of every earlier stream (a hang-up reaches it a moment after the
    client closed), each holder is admitted and the engine reports 1 running, 2 waiting."""
    await _until_capacity(served, lambda c: (c["waiting"], c["running"]) == (0, 0),
                          "earlier streams never left the engine")
    code, _ = curl_json(served.base, "POST", "/control/capacity", {"max_num_seqs": 1, "max_waiting": 2})
    assert code == 200
    streams = []
    for _ in range(holders):
        resp = await session.post(served.base + "/v1/chat/completions", json={
            "model": "gpt-oss-20b", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 20000, "stream": True})
        assert resp.status == 200
        streams.append(resp)
        if len(streams) == 1:  # admitted is not yet running: until a step schedules it,
            # the first stream takes a place in the waiting queue the last holder needs
            await _until_capacity(served, lambda c: c["running"] == 1, "the first holder never ran")
    await _until_capacity(served, lambda c: (c["waiting"], c["running"]) == (2, 1),
                          "the holders never filled the engine")
    return streams


async def _until_capacity(served, done, message: str, seconds: float = 10) -> None:
    """Until the engine's capacity reading satisfies `done` (another process's state: no
    event announces it)."""
    await until(lambda: done(curl_json(served.base, "GET", "/control/capacity")[1][0]),
                timeout=seconds, what=message)


async def test_saturated_streaming_requests_get_529_json_never_an_event_stream(served):
    async with aiohttp.ClientSession() as session:
        holders = await _saturate(served, session)
        assert [r.status for r in holders] == [200, 200, 200]

        async def one():
            async with session.post(served.base + "/v1/chat/completions", json={
                    "model": "gpt-oss-20b", "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 50, "stream": True}) as resp:
                return resp.status, resp.headers.get("content-type", ""), await resp.read()

        results = await asyncio.gather(*(one() for _ in range(20)))
        for resp in holders:
            resp.close()
    assert len(results) == 20
    for status, ctype, body in results:
        assert status == 529
        assert ctype.startswith("application/json") and "event-stream" not in ctype
        assert json.loads(body) == {"error": {
            "message": "Server is at capacity: 2 requests waiting (max_waiting = 2). "
                       "Retry with reduced concurrency.",
            "type": "overloaded_error", "code": "queue_saturated"}}


async def admitted_within(session, served, body: dict, seconds: float) -> float:
    """Seconds until a request is admitted (a 200 stream), sending one after another; each
    earlier one must be a 529."""
    started = time.monotonic()
    while True:
        async with session.post(served.base + "/v1/chat/completions",
                                json={**body, "stream": True}) as resp:
            if resp.status == 200:
                assert resp.content_type == "text/event-stream"
                return time.monotonic() - started
            assert resp.status == 529
        assert time.monotonic() - started < seconds, f"no room within {seconds} s"


async def test_every_529_is_counted_by_the_engine_and_room_is_served_from_the_next_step(served):
    """Refusals made at the gateway on the engine's announced queue state still show in the
    engine's metrics; a freed place and a raised bound are the engine's from its next step
    boundary (at most Pacer.FULL_SPAN after a promise that the queue stays full): within
    tens of milliseconds, never a stale 529 after that."""
    before = await asyncio.to_thread(engine_rejections, served.metrics_port)
    body = {"model": "gpt-oss-20b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}
    async with aiohttp.ClientSession() as session:
        holders = await _saturate(served, session)
        statuses = []
        for _ in range(30):
            async with session.post(served.base + "/v1/chat/completions", json=body) as resp:
                statuses.append(resp.status)
        assert statuses == [529] * 30
        async def counted() -> int | None:
            n = await asyncio.to_thread(engine_rejections, served.metrics_port)
            return n if n >= before + 30 else None

        n = await until(counted, timeout=10, what="the engine's count of the 30 refusals")
        assert n == before + 30
        holders[-1].close()  # the last waiting stream leaves: its place is free once the
        # engine has heard (no event tells the client)
        await _until_capacity(served, lambda c: c["waiting"] == 1,
                              "the engine never heard of the hang-up")
        # admitted (it waits behind the running holder) once the engine's next step began
        assert await admitted_within(session, served, body, 2.0) < 0.5
        for resp in holders:
            resp.close()
        holders = await _saturate(served, session)
        async with session.post(served.base + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 529
        code, _ = curl_json(served.base, "POST", "/control/capacity", {"max_waiting": 3})
        assert code == 200
        assert await admitted_within(session, served, body, 2.0) < 0.5
        for resp in holders:
            resp.close()


async def test_the_openai_sdk_sees_529_overloaded_error_queue_saturated(served, client):
    async with aiohttp.ClientSession() as session:
        holders = await _saturate(served, session)
        with pytest.raises(openai.APIStatusError) as info:
            await asyncio.to_thread(client.chat.completions.create, model="gpt-oss-20b",
                                    messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        for resp in holders:
            resp.close()
    err = info.value
    assert err.status_code == 529
    assert err.body["type"] == "overloaded_error" and err.body["code"] == "queue_saturated"


async def test_fifty_clients_that_hang_up_early_leave_nothing_waiting_or_running(served):
    async with aiohttp.ClientSession() as session:
        async def hang_up():
            resp = await session.post(served.base + "/v1/chat/completions", json={
                "model": "gpt-oss-20b", "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 5000, "stream": True})
            assert resp.status == 200
            await resp.content.readuntil(b"\n\n")  # the first frame arrived
            resp.close()  # hang up mid-stream

        await asyncio.gather(*(hang_up() for _ in range(50)))
    await _until_capacity(served, lambda c: (c["waiting"], c["running"]) == (0, 0),
                          "requests left in the engine after the hang-ups")


def test_engine_killed_gives_503_within_a_second_and_service_resumes_after_restart():
    with serve() as s:
        client = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=10)
        assert client.completions.create(model="gpt-oss-20b", prompt="a", max_tokens=2).usage
        [pid] = s.engine_pids()
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(openai.APIStatusError) as info:
            client.completions.create(model="gpt-oss-20b", prompt="a", max_tokens=2)
        assert info.value.status_code == 503 and time.monotonic() - start < 1.0
        assert info.value.body["type"] and info.value.body["code"]

        def served_again():  # serve restarts the engine; the gateway reconnects
            try:
                return client.completions.create(model="gpt-oss-20b", prompt="a", max_tokens=3)
            except openai.APIStatusError as err:
                assert err.status_code == 503
                return None

        reply = wait_until(served_again, timeout=30, interval=0.2, what="a reply after the restart")
        assert reply.usage.completion_tokens == 3
        assert len(s.engine_pids()) == 2

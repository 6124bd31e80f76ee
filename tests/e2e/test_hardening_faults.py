"""Faults, with the real `inference-lab engine` and `inference-lab gateway` as separate
processes: the engine killed mid-stream (open streams end with an error frame and [DONE],
new requests get 503, service resumes when the engine is back) and the gateway restarted
(the engine's capacity and queue are intact)."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import aiohttp
import grpc

from engine_helpers import collect
from hardening_helpers import content_tokens, sse_frames
from inference_lab.testing.launch import engine_process, gateway_process
from inference_lab.testing.poll import until
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc

MODEL = "gpt-oss-20b"
STREAM_TIMEOUT_S = 15.0  # "never a hang": every read below is bounded by this


def chat(max_tokens: int, stream: bool = True) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": max_tokens, "stream": stream, "stream_options": {"include_usage": True}}


async def read_all(resp: aiohttp.ClientResponse) -> bytes:
    return await asyncio.wait_for(resp.read(), STREAM_TIMEOUT_S)


async def assert_503(resp: aiohttp.ClientResponse) -> None:
    body = await resp.read()
    assert resp.status == 503, body
    assert resp.content_type == "application/json"
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "code"} and err["code"] == "engine_unavailable"


async def test_engine_killed_mid_stream_ends_open_streams_with_an_error_frame_then_503_then_resumes():
    with engine_process() as engine, gateway_process(engine.port) as gateway:
        base = f"http://127.0.0.1:{gateway.port}"
        async with aiohttp.ClientSession() as http:
            streams = [await http.post(base + "/v1/chat/completions", json=chat(50_000))
                       for _ in range(4)]
            for resp in streams:
                assert resp.status == 200
                await asyncio.wait_for(resp.content.readuntil(b"\n\n"), STREAM_TIMEOUT_S)
            waiting_reply = asyncio.ensure_future(
                http.post(base + "/v1/chat/completions", json=chat(50_000, stream=False)))
            async def all_five_run() -> bool:
                return (await (await http.get(base + "/control/capacity")).json())[0]["running"] == 5

            await until(all_five_run, timeout=10, what="the non-streaming request running too")

            os.kill(engine.pid, signal.SIGKILL)
            engine.proc.wait(10)

            for resp in streams:  # each ends by itself, promptly: error frame, then [DONE]
                frames = sse_frames(await read_all(resp))
                assert frames[-1] == b"[DONE]"
                err = json.loads(frames[-2])["error"]
                assert (err["type"], err["code"]) == ("server_error", "engine_unavailable")
                assert content_tokens(frames[:-2]) >= 1  # tokens before the failure were kept
            await assert_503(await asyncio.wait_for(waiting_reply, STREAM_TIMEOUT_S))
            await assert_503(await http.post(base + "/v1/chat/completions", json=chat(5)))
            await assert_503(await http.get(base + "/health"))
            await assert_503(await http.get(base + "/control/capacity"))

            with engine_process(port=engine.port):  # the engine returns on the same address
                async def served_again():  # the gateway reconnects on the next request
                    resp = await http.post(base + "/v1/chat/completions", json=chat(7))
                    if resp.status == 200:
                        return resp
                    await assert_503(resp)
                    return None

                resp = await until(served_again, timeout=10, interval=0.1,
                                   what="a reply once the engine is back")
                frames = sse_frames(await read_all(resp))
                assert content_tokens(frames) == 7 and frames[-1] == b"[DONE]"
                assert (await http.get(base + "/health")).status == 200


async def test_a_restarted_gateway_finds_the_engines_capacity_and_queue_intact():
    with engine_process() as engine:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}") as channel:
            stub = engine_pb2_grpc.EngineStub(channel)

            async def capacity() -> pb.ModelCapacity:
                return (await stub.GetCapacity(pb.GetCapacityRequest(), timeout=5)).models[0]

            async def state_is(waiting: int, running: int) -> None:
                async def reached() -> bool:  # the engine applies cancels asynchronously
                    cap = await capacity()
                    return (cap.waiting, cap.running) == (waiting, running)

                await until(reached, timeout=10, interval=0.05,
                            what=f"engine at waiting={waiting} running={running}")

            async with aiohttp.ClientSession() as http:
                with gateway_process(engine.port) as first:
                    base = f"http://127.0.0.1:{first.port}"
                    resp = await http.post(base + "/control/capacity",
                                           json={"max_num_seqs": 1, "max_waiting": 5})
                    assert resp.status == 200
                    # Other clients of the engine: one running, two queued behind it.
                    direct = []
                    for n in (60_000, 20, 30):  # one at a time: the long one arrives first
                        direct.append(stub.Submit(pb.SubmitRequest(prompt_tokens=16, max_tokens=n)))
                        assert (await direct[-1].read()).HasField("admitted")
                    # And one of the gateway's own, queued too.
                    held = await http.post(base + "/v1/chat/completions", json=chat(40))
                    await state_is(waiting=3, running=1)
                    os.kill(first.pid, signal.SIGKILL)  # the gateway dies and is restarted
                    first.proc.wait(10)
                    held.close()
                await state_is(waiting=2, running=1)  # only its own request went with it

                with gateway_process(engine.port) as second:
                    base = f"http://127.0.0.1:{second.port}"
                    resp = await http.get(base + "/control/capacity")
                    assert await resp.json() == [{"model": MODEL, "max_waiting": 5,
                                                  "max_num_seqs": 1, "waiting": 2, "running": 1}]
                    resp = await http.post(base + "/control/capacity", json={"max_num_seqs": 4})
                    assert (await resp.json())[0]["max_num_seqs"] == 4
                    for call, n in zip(direct[1:], (20, 30)):  # the queue drains, nothing lost
                        events = await asyncio.wait_for(collect(call), STREAM_TIMEOUT_S)
                        assert events[-1].finished.completion_tokens == n
                        assert sum(e.tokens.new_tokens for e in events if e.HasField("tokens")) == n
                    direct[0].cancel()
                    await state_is(waiting=0, running=0)

"""vLLM's tokens-in, tokens-out route and its dev-mode routes, in-process: the real gateway
(real HTTP, plain aiohttp) in front of the real engine (real gRPC). /inference/v1/generate
answers token IDs in vLLM's shapes through the one engine path (its 529 too); /pause
aborts, waits for or freezes the requests in flight as each of vLLM's modes does, and
holds new ones until /resume; /reset_prefix_cache empties the prefix cache and publishes
AllBlocksCleared; without dev mode the dev routes are 404s."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio
from aiohttp.test_utils import TestServer
from engine_helpers import running_engine

from inference_lab.common.ports import free_port
from inference_lab.common.tokenizer import load_tokenizer
from inference_lab.engine.service.kv_events import KVEventsConfig
from inference_lab.gateway import create_app
from inference_lab.testing.poll import until

GENERATED = load_tokenizer(None).encode(" token")[0]  # every generated token's ID


class Lab:
    """The real engine and gateway, and an HTTP session against the gateway."""

    def __init__(self, server: TestServer, http: aiohttp.ClientSession, engine) -> None:
        self.server, self.http, self.engine = server, http, engine

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.port}{path}"

    async def post(self, path: str, body: dict | None = None) -> tuple[int, object]:
        # no body: no Content-Type either (as curl -X POST sends vLLM's query-only routes)
        kwargs = {"skip_auto_headers": ["Content-Type"]} if body is None else {"json": body}
        async with self.http.post(self.url(path), **kwargs) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if text else None

    async def get(self, path: str) -> tuple[int, object]:
        async with self.http.get(self.url(path)) as resp:
            return resp.status, await resp.json(content_type=None)

    async def capacity(self) -> dict:
        return (await self.get("/control/capacity"))[1][0]


def lab(dev_mode: bool = True, **engine_options):
    class _Lab:
        async def __aenter__(self):
            self.engine_cm = running_engine(**engine_options)
            engine = await self.engine_cm.__aenter__()
            self.server = TestServer(create_app(f"127.0.0.1:{engine.port}", dev_mode=dev_mode))
            await self.server.start_server()
            self.http = aiohttp.ClientSession()
            return Lab(self.server, self.http, engine)

        async def __aexit__(self, *exc):
            await self.http.close()
            await self.server.close()
            await self.engine_cm.__aexit__(*exc)

    return _Lab()


def generate_body(max_tokens: int, stream: bool = False, **extra) -> dict:
    return {"token_ids": [1, 2, 3, 4, 5], "sampling_params": {"max_tokens": max_tokens},
            "stream": stream, **extra}


async def stream_frames(lab: Lab, body: dict, started: asyncio.Event | None = None) -> list:
    """Every `data:` payload of a streamed generate request (`started` set at the first)."""
    frames = []
    async with lab.http.post(lab.url("/inference/v1/generate"), json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.startswith(b"data: "):
                payload = line[6:].strip()
                frames.append(payload if payload == b"[DONE]" else json.loads(payload))
                if started is not None:
                    started.set()
    return frames


def token_count(frames: list) -> int:
    return sum(len(c["token_ids"]) for f in frames if isinstance(f, dict) and "choices" in f
               for c in f["choices"])


# ---- /inference/v1/generate ------------------------------------------------------------------


async def test_generate_takes_token_ids_and_answers_token_ids_in_vllms_shape():
    async with lab() as it:
        status, body = await it.post("/inference/v1/generate",
                                     generate_body(4, request_id="abc", model="gpt-oss-20b"))
        assert status == 200, body
        assert body["request_id"] == "generate-tokens-abc"
        assert body["choices"] == [{"index": 0, "logprobs": None, "finish_reason": "length",
                                    "token_ids": [GENERATED] * 4}]
        assert body["prompt_logprobs"] is None and body["kv_transfer_params"] is None
        # no model: the first served; n sequences; streamed with usage at the end
        status, body = await it.post("/inference/v1/generate", {
            "token_ids": [7, 8], "sampling_params": {"max_tokens": 2, "n": 2}})
        assert status == 200 and [len(c["token_ids"]) for c in body["choices"]] == [2, 2]
        frames = await stream_frames(it, generate_body(
            3, stream=True, stream_options={"include_usage": True}))
    assert frames[-1] == b"[DONE]"
    assert frames[-2] == {"request_id": frames[0]["request_id"], "choices": [],
                          "usage": {"prompt_tokens": 5, "completion_tokens": 3,
                                    "total_tokens": 8}}
    assert token_count(frames) == 3
    assert frames[-3]["choices"][0]["finish_reason"] == "length"


async def test_generate_is_refused_as_every_route_is_bad_input_400_full_queue_529():
    async with lab(max_waiting=1, max_num_seqs=1) as it:
        for bad, where in (({"token_ids": [], "sampling_params": {}}, "$.token_ids"),
                           ({"token_ids": [1], "sampling_params": {"n": 0}}, "$.sampling_params.n"),
                           ({"token_ids": [-1], "sampling_params": {}}, "$.token_ids[0]")):
            status, body = await it.post("/inference/v1/generate", bad)
            assert status == 400 and where in body["error"]["message"], body
        status, body = await it.post("/inference/v1/generate",
                                     {"token_ids": [1], "sampling_params": {}, "model": "nope"})
        assert status == 404 and body["error"]["code"] == "model_not_found"
        first = asyncio.create_task(stream_frames(it, generate_body(3000, stream=True)))
        await until(lambda: it.capacity(), what="the engine answering")
        await until(lambda: _running(it, 1), what="one running")
        second = asyncio.create_task(it.post("/inference/v1/generate", generate_body(3000)))
        await until(lambda: _waiting(it, 1), what="one waiting")
        status, body = await it.post("/inference/v1/generate", generate_body(5))
        assert status == 529 and body["error"]["code"] == "queue_saturated"
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


async def _running(it: Lab, n: int) -> bool:
    return (await it.capacity())["running"] == n


async def _waiting(it: Lab, n: int) -> bool:
    return (await it.capacity())["waiting"] == n


# ---- dev mode ----------------------------------------------------------------------------


async def started_stream(it, tokens: int) -> asyncio.Task:
    """A streamed generate request of `tokens` tokens, running: its first frame is in."""
    started = asyncio.Event()
    stream = asyncio.create_task(stream_frames(it, generate_body(tokens, stream=True), started))
    await started.wait()
    return stream


async def test_without_dev_mode_the_dev_routes_are_404():
    async with lab(dev_mode=False) as it:
        for path in ("/pause", "/resume", "/reset_prefix_cache"):
            assert (await it.post(path))[0] == 404, path
        assert (await it.get("/is_paused"))[0] == 404


async def test_pause_abort_ends_the_stream_and_holds_new_requests_until_resume():
    async with lab() as it:
        stream = await started_stream(it, 3000)
        assert await it.post("/pause?mode=abort") == (200, {"status": "paused"})
        frames = await stream  # aborted: the stream ends with an error, not its 3000 tokens
        assert any(isinstance(f, dict) and "error" in f for f in frames)
        assert token_count(frames) < 3000
        assert await it.get("/is_paused") == (200, {"is_paused": True})
        held = asyncio.create_task(it.post("/inference/v1/generate", generate_body(2)))
        await until(lambda: _waiting(it, 1), what="the new request queued")
        row = await it.capacity()  # (one more round trip later: still queued, not run)
        assert (row["waiting"], row["running"], held.done()) == (1, 0, False)
        assert await it.post("/resume") == (200, {"status": "resumed"})
        status, body = await held
        assert status == 200 and body["choices"][0]["token_ids"] == [GENERATED] * 2
        assert await it.get("/is_paused") == (200, {"is_paused": False})


async def test_pause_wait_answers_once_the_running_request_has_finished_whole():
    async with lab() as it:
        stream = await started_stream(it, 300)
        status, body = await it.post("/pause?mode=wait")
        assert (status, body) == (200, {"status": "paused"})
        # the pause took hold only once the request had finished (its last bytes may
        # still be on their way to this client over the other connection)
        assert (await it.capacity())["running"] == 0
        frames = await stream
        assert token_count(frames) == 300 and frames[-1] == b"[DONE]"
        assert not any(isinstance(f, dict) and "error" in f for f in frames)
        await it.post("/resume")


async def test_pause_keep_freezes_the_running_request_and_resume_finishes_it():
    async with lab() as it:
        stream = await started_stream(it, 400)
        assert await it.post("/pause?mode=keep") == (200, {"status": "paused"})
        row = await it.capacity()
        assert row["running"] == 1 and not stream.done()  # held, not aborted
        assert await it.get("/is_paused") == (200, {"is_paused": True})
        await it.post("/resume")
        frames = await stream
    assert token_count(frames) == 400
    assert not any(isinstance(f, dict) and "error" in f for f in frames)


async def test_a_bad_pause_mode_is_a_400_naming_it():
    async with lab() as it:
        status, body = await it.post("/pause?mode=later")
        assert status == 400 and "`?mode`" in body["error"]["message"]
        status, body = await it.post("/pause?clear_cache=perhaps")
        assert status == 400 and "`?clear_cache`" in body["error"]["message"]
        assert await it.get("/is_paused") == (200, {"is_paused": False})


async def test_reset_prefix_cache_forgets_the_cache_and_publishes_all_blocks_cleared():
    pub, replay = free_port(), free_port()
    config = KVEventsConfig.parse(json.dumps({
        "enable_kv_cache_events": True, "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}"}))
    prompt = list(range(1, 200))  # three full blocks of 64
    ctx = zmq.asyncio.Context()
    try:
        async with lab(kv_events=config) as it:
            cached = []
            for _ in range(2):
                status, _ = await it.post("/inference/v1/generate", {
                    "token_ids": prompt, "sampling_params": {"max_tokens": 1}})
                assert status == 200
            cache = it.engine.runtimes[0].core.prefix_cache
            cached.append(len(cache))
            status, body = await it.post("/reset_prefix_cache")
            assert (status, body) == (200, None)
            cached.append(len(cache))
            events = await replayed(ctx, replay)
    finally:
        ctx.term()
    assert cached == [3, 0]
    assert events[-1] == [{"type": "AllBlocksCleared"}]


async def replayed(ctx, port: int) -> list[list[dict]]:
    """Every batch's events, from the replay socket (vLLM's replay request)."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    await dealer.send_multipart((b"", (0).to_bytes(8, "big")))
    batches = []
    try:
        while True:
            assert await dealer.poll(5000), "no replay answer"
            _, seq, payload = await dealer.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):
                return batches
            batches.append(msgpack.unpackb(payload)[1])
    finally:
        dealer.close(0)


@pytest.mark.parametrize("path", ["/pause", "/resume", "/reset_prefix_cache"])
async def test_the_dev_routes_are_control_routes(path):
    async with running_engine() as engine:
        app = create_app(f"127.0.0.1:{engine.port}", dev_mode=True, control_token="ct")
        async with TestServer(app) as server, aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{server.port}{path}"
            bare = {"skip_auto_headers": ["Content-Type"]}
            async with http.post(url, **bare) as resp:
                assert resp.status == 401
            async with http.post(url, headers={"authorization": "Bearer ct",
                                               "origin": "https://example.com"}, **bare) as resp:
                assert resp.status == 403
            async with http.post(url, headers={"authorization": "Bearer ct"}, **bare) as resp:
                assert resp.status == 200
            if path == "/pause":
                async with http.get(f"http://127.0.0.1:{server.port}/is_paused") as resp:
                    assert (await resp.json()) == {"is_paused": True}

"""What a router reads of each replica, over real HTTP on every replica's port of the real
gateway in front of the real engine (3 replicas, KV events on): the load from the
replica's live queue, vLLM's render API giving exactly the token IDs the engine caches
(checked against the replica's own KV events), the server info and KV-event sources
vllm-router's discovery reads, the replica and model named on every generation
response, and vLLM's X-data-parallel-rank header on the base port."""

from __future__ import annotations

import json

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from engine_helpers import running_engine
from inference_lab.common.ports import free_port_run
from inference_lab.engine.service.kv_events import KVEventsConfig
from inference_lab.gateway.fleet import FleetGateway
from inference_lab.testing.poll import until

MODEL = "gpt-oss-20b"
SYSTEM = "You answer briefly and exactly. " * 40  # 1,280 bytes: several 64-token blocks


@pytest.fixture
async def lab():
    """(engine, http session, replica URLs, KV base port): 3 replicas, replica i's HTTP
    port base + i, its KV events on kv + 2i (replays on kv + 1 + 2i)."""
    kv = free_port_run(6)
    config = KVEventsConfig.parse(json.dumps({
        "enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{kv}",
        "replay_endpoint": f"tcp://127.0.0.1:{kv + 1}", "topic": "kv@lab@{model}"}))
    async with running_engine(replicas=3, kv_events=config) as engine:
        base = free_port_run(3)
        gateway = FleetGateway(f"127.0.0.1:{engine.port}", "127.0.0.1", base)
        await gateway.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
                urls = [f"http://127.0.0.1:{base + i}" for i in range(3)]

                async def open_() -> bool:
                    try:
                        async with http.get(urls[2] + "/health") as resp:
                            return resp.status == 200
                    except aiohttp.ClientConnectionError:
                        return False

                await until(open_, timeout=10, interval=0.05, what="replica 2's port open")
                yield engine, http, urls, kv
        finally:
            await gateway.stop()


async def get(http, url: str) -> dict:
    async with http.get(url) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


def chat(content: str, **extra) -> dict:
    return {"model": MODEL, "max_tokens": 2, **extra,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]}


async def test_the_load_is_the_replicas_requests_waiting_and_running_now(lab):
    _, http, urls, _ = lab
    body = {"model": MODEL, "prompt": "tell me", "max_tokens": 100_000, "stream": True}
    async with http.post(urls[2] + "/v1/completions", json=body) as held:
        assert held.status == 200
        await held.content.readline()  # streaming: the request runs on replica 2
        loads = [(await get(http, u + "/get_load"))["load"] for u in urls]
        assert loads == [0, 0, 1]
        assert (await get(http, urls[2] + "/load")) == {"server_load": 1}  # vLLM's shape
    await until(lambda: _load_is(http, urls[2], 0), what="replica 2's load back to 0")


async def _load_is(http, url: str, n: int) -> bool:
    return (await get(http, url + "/get_load"))["load"] == n


async def test_render_gives_the_token_ids_the_replica_caches_and_its_events_carry(lab):
    _, http, urls, kv = lab
    async with http.post(urls[1] + "/v1/chat/completions/render", json=chat("hi")) as resp:
        assert resp.status == 200
        rendered = await resp.json()
    assert set(rendered) == {"request_id", "token_ids", "features", "sampling_params",
                             "model", "stream", "stream_options", "cache_salt",
                             "priority", "kv_transfer_params"}
    assert rendered["request_id"].startswith("chatcmpl-") and rendered["model"] == MODEL
    assert rendered["sampling_params"]["max_tokens"] == 2 and rendered["features"] is None
    ids = rendered["token_ids"]
    assert len(ids) > 3 * 64
    async with http.post(urls[1] + "/v1/chat/completions", json=chat("hi")) as resp:
        assert resp.status == 200
        assert resp.headers["x-inference-lab-replica"] == "1"
        assert resp.headers["x-inference-lab-model"] == MODEL
    # replica 1's batches so far, from its replay endpoint (a subscriber could miss what
    # precedes its subscription; the replay misses nothing)
    ctx = zmq.asyncio.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{kv + 3}")
    stored = []
    try:
        await dealer.send_multipart((b"", (0).to_bytes(8, "big")))
        while True:
            assert await dealer.poll(5000), "no answer from replica 1's replay endpoint"
            _, seq, payload = await dealer.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                break
            _, events, rank = msgpack.unpackb(payload)
            assert rank == 0  # an independent replica: a server of its own
            stored += [e for e in events if e["type"] == "BlockStored"]
    finally:
        dealer.close(0)
        ctx.term()
    cached = {tuple(e["token_ids"][k:k + 64]) for e in stored
              for k in range(0, len(e["token_ids"]), 64)}
    # every full block of the rendered prompt is a block the engine cached, token for token
    blocks = [tuple(ids[k:k + 64]) for k in range(0, len(ids) // 64 * 64, 64)]
    assert blocks and all(b in cached for b in blocks)


async def test_completions_render_is_one_request_per_prompt_and_bad_input_is_a_4xx(lab):
    _, http, urls, _ = lab
    body = {"model": MODEL, "prompt": [[5, 6], [7, 8, 9]], "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.5}
    async with http.post(urls[0] + "/v1/completions/render", json=body) as resp:
        assert resp.status == 200
        items = await resp.json()
    assert [item["token_ids"] for item in items] == [[5, 6], [7, 8, 9]]  # as given
    assert all(item["stream"] and item["stream_options"]["include_usage"] for item in items)
    assert items[0]["sampling_params"]["temperature"] == 0.5
    for body, status, words in [({"model": MODEL}, 400, "prompt"),
                                ({"model": "nope", "prompt": "x"}, 404, "does not exist"),
                                ({"model": MODEL, "prompt": "x", "n": 0}, 400, "$.n")]:
        async with http.post(urls[0] + "/v1/completions/render", json=body) as resp:
            assert resp.status == status
            assert words in (await resp.json())["error"]["message"]


async def test_each_port_names_its_own_publisher_and_instance(lab):
    _, http, urls, kv = lab
    infos = [await get(http, u + "/get_server_info") for u in urls]
    assert [i["kv_block_size"] for i in infos] == [64] * 3
    assert {i["model_id"] for i in infos} == {MODEL}
    assert len({i["instance_id"] for i in infos}) == 3  # one identity per port
    # independent replicas: each a server of its own, so each says rank 0 (as a vLLM
    # server that is not a data-parallel rank does), on ports offset by its index
    assert [i["data_parallel_rank"] for i in infos] == [0, 0, 0]
    for index, url in enumerate(urls):
        sources = await get(http, url + "/kv_event_sources")
        assert sources == {"0": {
            "endpoint": f"tcp://127.0.0.1:{kv + 2 * index}",
            "replay_endpoint": f"tcp://127.0.0.1:{kv + 1 + 2 * index}",
            "topic": f"kv@lab@{MODEL}", "hwm": 100_000, "buffer_steps": 10_000,
            "enable_kv_cache_events": True, "publisher": "zmq", "encoding": "msgpack",
            "schema_version": 1}}


async def test_x_data_parallel_rank_picks_the_replica_on_the_base_port_only(lab):
    _, http, urls, _ = lab
    body = {"model": MODEL, "prompt": "tell me", "max_tokens": 100_000, "stream": True}
    async with http.post(urls[0] + "/v1/completions", json=body,
                         headers={"X-data-parallel-rank": "2"}) as held:
        assert held.status == 200 and held.headers["x-inference-lab-replica"] == "2"
        await held.content.readline()
        assert [(await get(http, u + "/get_load"))["load"] for u in urls] == [0, 0, 1]
    cases = [(urls[1], "2", 400, "serves replica 1 only"), (urls[0], "two", 400, "not a replica"),
             (urls[0], "9", 404, "replica 9")]
    for url, rank, status, words in cases:
        async with http.post(url + "/v1/completions", json={**body, "stream": False},
                             headers={"X-data-parallel-rank": rank}) as resp:
            assert resp.status == status, await resp.text()
            assert words in (await resp.json())["error"]["message"]
    async with http.post(urls[1] + "/v1/completions", json={**body, "max_tokens": 1},
                         headers={"X-data-parallel-rank": "1"}) as resp:  # its own: fine
        assert resp.status == 200 and resp.headers["x-inference-lab-replica"] == "1"


async def test_the_names_are_on_every_generation_response_and_off_by_a_flag(fake):
    """Streamed, whole, every dialect; with served_by off (--no-served-by-headers) none."""
    from aiohttp.test_utils import TestClient, TestServer

    from inference_lab.gateway import create_app
    from inference_lab.testing.fake_engine import FAKE_MODEL

    bodies = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
              "/v1/completions": {"prompt": "hi"}, "/v1/responses": {"input": "hi"},
              "/v1/messages": {"messages": [{"role": "user", "content": "hi"}]}}
    for served_by in (True, False):
        async with TestClient(TestServer(create_app(fake.target, served_by=served_by))) as c:
            for path, body in bodies.items():
                for stream in (False, True):
                    resp = await c.post(path, json={"model": FAKE_MODEL, "max_tokens": 3,
                                                    "stream": stream, **body})
                    assert resp.status == 200, await resp.text()
                    await resp.read()
                    named = (resp.headers.get("x-inference-lab-replica"),
                             resp.headers.get("x-inference-lab-model"))
                    assert named == (("0", FAKE_MODEL) if served_by else (None, None)), path
            health = await c.get("/health")  # not a generation response: never named
            assert "x-inference-lab-replica" not in health.headers


async def test_an_engine_without_kv_events_has_no_sources_and_a_live_load(client, fake):
    """A lone gateway (the engine's default replica) in front of an engine that has no
    GetKvEventSources call: `{}`, as vLLM answers with events off; the load still live."""
    from inference_lab.testing.fake_engine import FAKE_MODEL

    sources = await client.get("/kv_event_sources")
    assert (sources.status, await sources.json()) == (200, {})
    load = await client.get("/get_load")
    assert (load.status, await load.json()) == (200, {"load": 0})
    info = await (await client.get("/get_server_info")).json()
    assert info["model_id"] == FAKE_MODEL and info["instance_id"].startswith("inference-lab@")


async def test_a_model_name_that_cannot_be_a_header_is_not_named(client):
    """The body's model goes on the response only as printable ASCII: a line break in it
    is no header injection and no 500, just the 404 of an unknown model."""
    resp = await client.post("/v1/chat/completions", json={
        "model": "nope\r\nx-evil: 1", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 404
    assert "x-evil" not in resp.headers and "x-inference-lab-model" not in resp.headers
    assert resp.headers["x-inference-lab-replica"] == "0"  # the replica is named all the same
    unicode = await client.post("/v1/chat/completions", json={
        "model": "modèle", "messages": [{"role": "user", "content": "hi"}]})
    assert unicode.status == 404 and "x-inference-lab-model" not in unicode.headers


async def test_derender_turns_a_generate_response_back_into_openai_shapes(lab):
    # tokens in, tokens out, then text again: /inference/v1/generate's answer for a
    # rendered prompt, derendered; the text is the token IDs decoded by the server's
    # tokenizer (the built-in one: 4 bytes a token), the usage what the caller says
    _, http, urls, _ = lab
    url = urls[0]
    ids = [1819043144, 1870078063]  # b"Hell", b"o wo" as the built-in tokenizer packs them
    async with http.post(url + "/v1/chat/completions/derender", json={
            "model": MODEL, "prompt_tokens": 7, "generate_response": {
                "request_id": "abc", "choices": [
                    {"index": 0, "token_ids": ids, "finish_reason": "stop"}]}}) as resp:
        assert resp.status == 200, await resp.text()
        chat = await resp.json()
    assert chat["id"] == "chatcmpl-abc" and chat["object"] == "chat.completion"
    assert chat["choices"] == [{"index": 0, "logprobs": None, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "Hello wo"}}]
    assert chat["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    async with http.post(url + "/v1/completions/derender", json={
            "model": MODEL, "prompt_tokens": [3, 4], "generate_responses": [
                {"choices": [{"index": 0, "token_ids": ids[:1]}]},
                {"choices": [{"index": 0, "token_ids": ids[1:], "finish_reason": "stop"}]}]}
            ) as resp:
        assert resp.status == 200, await resp.text()
        done = await resp.json()
    assert done["object"] == "text_completion"
    assert [(c["index"], c["text"], c["finish_reason"]) for c in done["choices"]] == [
        (0, "Hell", "length"), (1, "o wo", "stop")]
    assert done["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    for path, body, status, words in [
            ("/v1/chat/completions/derender", {"model": MODEL}, 400, "generate_response"),
            ("/v1/chat/completions/derender", {"model": MODEL, "stream": True,
                                               "generate_response": {"choices": []}}, 400,
             "stream"),
            ("/v1/chat/completions/derender", {"model": "nope", "generate_response": {
                "choices": []}}, 404, "does not exist"),
            ("/v1/completions/derender", {"model": MODEL, "generate_responses": []}, 400,
             "generate_responses"),
            ("/v1/completions/derender", {"model": MODEL, "prompt_tokens": [1, 2],
                                          "generate_responses": [{"choices": []}]}, 400,
             "prompt_tokens"),
            ("/v1/completions/derender", {"model": MODEL, "generate_responses": [
                {"choices": [{"token_ids": [-1]}]}]}, 400, "token_ids")]:
        async with http.post(url + path, json=body) as resp:
            assert resp.status == status, (path, body, await resp.text())
            assert words in (await resp.json())["error"]["message"], (path, body)


async def test_a_messages_request_renders_to_the_token_ids_chat_would_give(lab):
    # the same conversation as Anthropic Messages (system first) and as chat: one prompt
    _, http, urls, _ = lab
    url = urls[0]
    async with http.post(url + "/v1/chat/completions/render", json=chat("hi")) as resp:
        chat_ids = (await resp.json())["token_ids"]
    body = {"model": MODEL, "max_tokens": 7, "system": SYSTEM, "top_k": 5,
            "stop_sequences": ["END"], "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(url + "/v1/messages/render", json=body) as resp:
        assert resp.status == 200, await resp.text()
        rendered = await resp.json()
    assert rendered["token_ids"] == chat_ids
    assert rendered["request_id"].startswith("msg-") and rendered["model"] == MODEL
    params = rendered["sampling_params"]
    assert (params["max_tokens"], params["top_k"], params["stop"]) == (7, 5, ["END"])
    async with http.post(url + "/v1/messages/render", json={"model": MODEL, "messages": []}) as resp:
        assert resp.status == 400
        error = await resp.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"

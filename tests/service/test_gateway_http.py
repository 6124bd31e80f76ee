"""The gateway's HTTP surface against a fake engine on a free port (in-process tier)."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from inference_lab.engine.sim.lengths import OutputLength
from inference_lab.gateway import create_app
from inference_lab.testing.fake_engine import FAKE_MODEL

SATURATED = {
    "error": {
        "message": "Server is at capacity: 64 requests waiting (max_waiting = 64). "
        "Retry with reduced concurrency.",
        "type": "overloaded_error",
        "code": "queue_saturated",
    }
}
CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
async def client(fake):
    async with TestClient(TestServer(create_app(fake.target, max_body_bytes=4096))) as c:
        yield c


def sse_payloads(text: str) -> list[str]:
    assert text.endswith("\n\n")
    frames = text.split("\n\n")[:-1]
    assert all(f.startswith("data: ") for f in frames)
    return [f.removeprefix("data: ") for f in frames]


# ---- generation ---------------------------------------------------------------------------


async def test_chat_non_stream_returns_the_engines_token_count(client, fake):
    resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5})
    assert resp.status == 200
    assert resp.content_type == "application/json"
    body = await resp.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": " token" * 5}
    assert body["choices"][0]["finish_reason"] == "length"
    # prompt: (3 + ceil(5/4)) + 3 = 8
    assert body["usage"] == {"prompt_tokens": 8, "completion_tokens": 5, "total_tokens": 13,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    (opened,) = fake.opened.items
    assert (opened.request.prompt_tokens, opened.request.max_tokens) == (8, 5)


async def test_max_completion_tokens_is_what_the_engine_is_asked_for(client, fake):
    resp = await client.post("/v1/chat/completions",
                             json={**CHAT, "max_completion_tokens": 3, "max_tokens": 9})
    assert (await resp.json())["usage"]["completion_tokens"] == 3
    assert fake.opened.items[0].request.max_tokens == 3


async def test_without_max_tokens_the_engine_chooses_the_length(client, fake):
    fake.lengths = OutputLength(4)  # the engine's --default-max-tokens 4
    resp = await client.post("/v1/completions", json={"model": FAKE_MODEL, "prompt": "hi"})
    assert (await resp.json())["usage"]["completion_tokens"] == 4
    assert not fake.opened.items[0].request.HasField("max_tokens")  # left to the engine


async def test_chat_stream_frames_role_tokens_finish_usage_done(client):
    resp = await client.post("/v1/chat/completions", json={
        **CHAT, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}})
    assert resp.status == 200
    assert resp.content_type == "text/event-stream"
    payloads = sse_payloads(await resp.text())
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert contents == [" token"] * 4  # 1 token, then 3 coalesced into one engine event
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12,
                                   "prompt_tokens_details": {"cached_tokens": 0}}
    assert len({c["id"] for c in chunks}) == 1


async def test_completions_stream_without_usage_has_no_usage_frame(client):
    resp = await client.post("/v1/completions", json={
        "model": FAKE_MODEL, "prompt": [1, 2, 3], "max_tokens": 2, "stream": True})
    payloads = sse_payloads(await resp.text())
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == [" token", " token", ""]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks)


@pytest.mark.parametrize("prompt, expected", [("abcdefgh", 2), (["abcdefghi"], 3), ([5] * 7, 7)])
async def test_completion_prompt_forms_reach_the_engine_as_lengths(client, fake, prompt, expected):
    resp = await client.post("/v1/completions",
                             json={"model": FAKE_MODEL, "prompt": prompt, "max_tokens": 1})
    assert resp.status == 200
    assert fake.opened.items[0].request.prompt_tokens == expected
    assert (await resp.json())["usage"]["prompt_tokens"] == expected


# ---- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_saturation_is_a_bare_529_json_never_an_event_stream(client, fake, path, stream):
    fake.mode = "reject"
    body = CHAT if path.endswith("chat/completions") else {"model": FAKE_MODEL, "prompt": "x"}
    resp = await client.post(path, json={**body, "stream": stream})
    assert resp.status == 529
    assert resp.content_type == "application/json"
    assert await resp.json() == SATURATED


async def test_unknown_model_is_404_without_reaching_the_session(client, fake):
    resp = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    assert resp.status == 404
    assert await resp.json() == {"error": {"message": "The model `nope` does not exist.",
                                           "type": "invalid_request_error",
                                           "code": "model_not_found"}}
    assert fake.opened.items == []


async def test_an_unknown_models_long_name_is_shortened_in_the_message(client, fake):
    resp = await client.post("/v1/chat/completions", json={**CHAT, "model": "m" * 3_000})
    assert resp.status == 404
    message = (await resp.json())["error"]["message"]
    assert message == f"The model `{'m' * 200}...` does not exist."


async def test_engine_invalid_argument_is_400_with_its_message(client):
    resp = await client.post("/v1/completions",
                             json={"model": FAKE_MODEL, "prompt": "x", "max_tokens": 5000})
    assert resp.status == 400
    err = (await resp.json())["error"]
    assert err["type"] == "invalid_request_error"
    assert "exceeds max_model_len 4096" in err["message"]


@pytest.mark.parametrize("body, needle", [
    (b"{not json", "Invalid JSON"),
    (b"[1]", "Expected `object`, got `array`"),
    (b'{"messages": [{"role": "user"}]}', "missing required field `model`"),
    (b'{"model": "fake-model", "messages": "hi"}', "$.messages"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], '
     b'"max_tokens": -1}', "$.max_tokens"),
    (b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], '
     b'"stream": "yes"}', "$.stream"),
])
async def test_bad_bodies_are_400_naming_the_problem(client, body, needle):
    resp = await client.post("/v1/chat/completions", data=body,
                             headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert resp.content_type == "application/json"
    err = (await resp.json())["error"]
    assert err["type"] == "invalid_request_error" and needle in err["message"]


async def test_body_over_the_limit_is_413(client):
    resp = await client.post("/v1/completions",
                             json={"model": FAKE_MODEL, "prompt": "x" * 5000})
    assert resp.status == 413
    assert (await resp.json())["error"]["code"] == "request_too_large"


async def test_unknown_route_uses_the_error_envelope(client):
    resp = await client.get("/v1/nothing")
    assert resp.status == 404
    assert (await resp.json())["error"]["code"] == "not_found"


async def test_api_key_hook_refuses_with_401(fake):
    async with TestClient(TestServer(create_app(fake.target, api_key="sk-test"))) as c:
        resp = await c.get("/v1/models")
        assert resp.status == 401
        assert (await resp.json())["error"]["type"] == "authentication_error"
        resp = await c.get("/v1/models", headers={"Authorization": "Bearer sk-test"})
        assert resp.status == 200


# ---- models, health, metrics -----------------------------------------------------------------


async def test_models_lists_the_engines_models_in_openai_shape(client):
    resp = await client.get("/v1/models")
    body = await resp.json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in body["data"]] == [
        (FAKE_MODEL, "model", 4096)]


async def test_health_is_ok_when_the_engine_answers(client):
    resp = await client.get("/health")
    assert (resp.status, await resp.json()) == (200, {"status": "ok"})


async def test_metrics_count_requests_by_route_and_status(client, fake):
    await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
    fake.mode = "reject"
    await client.post("/v1/chat/completions", json=CHAT)
    text = await (await client.get("/metrics")).text()
    assert ('inference_lab_gateway_http_requests_total{route="/v1/chat/completions",'
            'status="200"} 1.0') in text
    assert ('inference_lab_gateway_http_requests_total{route="/v1/chat/completions",'
            'status="529"} 1.0') in text
    assert ('inference_lab_gateway_http_request_duration_seconds_count'
            '{route="/v1/chat/completions"} 2.0') in text


# ---- capacity control ------------------------------------------------------------------------


async def test_get_capacity_has_the_reference_shape(client):
    resp = await client.get("/control/capacity")
    assert await resp.json() == [{"model": FAKE_MODEL, "max_waiting": 0, "max_num_seqs": 256,
                                  "waiting": 0, "running": 0}]


async def test_post_capacity_returns_the_new_state(client):
    resp = await client.post("/control/capacity", json={"max_num_seqs": 16, "max_waiting": 64})
    assert resp.status == 200
    assert await resp.json() == [{"model": FAKE_MODEL, "max_waiting": 64, "max_num_seqs": 16,
                                  "waiting": 0, "running": 0}]
    resp = await client.post("/control/capacity", json={"model": FAKE_MODEL, "max_waiting": 0})
    assert (await resp.json())[0]["max_waiting"] == 0


@pytest.mark.parametrize("body, needle", [
    (b"[]", "Expected `object`"),
    (b"3", "Expected `object`"),
    (b"{}", "max_num_seqs or max_waiting must be given"),
    (b'{"model": "fake-model"}', "max_num_seqs or max_waiting must be given"),
    (b'{"max_num_seqs": 8, "extra": 1}', "unknown field `extra`"),
    (b'{"max_num_seqs": true}', "$.max_num_seqs"),
    (b'{"max_waiting": 1.5}', "$.max_waiting"),
    (b'{"max_num_seqs": "8"}', "$.max_num_seqs"),
    (b'{"max_num_seqs": 0}', "max_num_seqs must be an integer >= 1, got 0"),
    (b'{"max_waiting": -1}', "max_waiting must be an integer >= 0 (0 = unbounded), got -1"),
    (b'{"max_waiting": 4294967296}', "max_waiting must be at most 4294967295"),
    (b"{oops", "Invalid JSON"),
])
async def test_post_capacity_validation_is_400(client, body, needle):
    resp = await client.post("/control/capacity", data=body,
                             headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert needle in (await resp.json())["error"]["message"]


async def test_post_capacity_unknown_model_is_404(client):
    resp = await client.post("/control/capacity", json={"model": "nope", "max_waiting": 1})
    assert resp.status == 404
    assert (await resp.json())["error"]["code"] == "model_not_found"


async def test_post_capacity_engine_invalid_argument_is_400_with_its_message(client):
    resp = await client.post("/control/capacity", json={"max_num_seqs": 100000})
    assert resp.status == 400
    assert (await resp.json())["error"]["message"] == (
        "max_num_seqs must be at most max_num_batched_tokens (8192), got 100000")

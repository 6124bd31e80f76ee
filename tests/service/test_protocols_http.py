"""The Anthropic Messages and OpenAI Responses routes against a fake engine (in-process
tier): each route's error envelope, the API key as `x-api-key` or Bearer, the engine
being gone (503, and mid-stream), echo on completions, and metrics by route."""

from __future__ import annotations

import json

import anthropic
import pytest
from aiohttp.test_utils import TestClient, TestServer

from inference_lab.gateway import create_app
from inference_lab.testing.fake_engine import FAKE_MODEL

KEY = "sk-protocols-test"
MESSAGE = {"model": FAKE_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
RESPONSE = {"model": FAKE_MODEL, "input": "hi", "max_output_tokens": 4}


@pytest.fixture
async def locked(fake):
    async with TestClient(TestServer(create_app(fake.target, api_key=KEY))) as c:
        yield c


def events(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of each named SSE event."""
    out = []
    for block in text.split("\n\n")[:-1]:
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


async def test_messages_errors_use_anthropics_envelope(client):
    resp = await client.post("/v1/messages", json={**MESSAGE, "model": "nope"})
    assert resp.status == 404
    assert await resp.json() == {"type": "error", "error": {
        "type": "not_found_error", "message": "The model `nope` does not exist."}}
    resp = await client.post("/v1/messages", json={**MESSAGE, "max_tokens": 0})
    body = await resp.json()
    assert resp.status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "$.max_tokens" in body["error"]["message"]
    resp = await client.post("/v1/messages", data=b"<xml/>", headers={"content-type": "text/xml"})
    assert resp.status == 415 and (await resp.json())["error"]["type"] == "invalid_request_error"
    resp = await client.get("/v1/messages")
    assert resp.status == 405 and (await resp.json())["type"] == "error"
    resp = await client.post("/v1/messages/batches", json=MESSAGE)  # not served here
    assert resp.status == 404 and (await resp.json())["error"]["type"] == "not_found_error"


async def test_responses_errors_use_the_openai_envelope(client):
    resp = await client.post("/v1/responses", json={**RESPONSE, "input": []})
    body = await resp.json()
    assert resp.status == 400 and body["error"]["code"] == "invalid_request"
    assert "$.input" in body["error"]["message"]
    resp = await client.post("/v1/responses", json={
        **RESPONSE, "input": [{"type": "message", "content": "x"}]})  # a message needs a role
    body = await resp.json()
    assert resp.status == 400 and "`role` - at `$.input[0]`" in body["error"]["message"]


@pytest.mark.parametrize("headers, status", [
    ({"x-api-key": KEY, "anthropic-version": "2023-06-01"}, 200),
    ({"Authorization": f"Bearer {KEY}"}, 200),
    ({"x-api-key": "wrong", "Authorization": f"Bearer {KEY}"}, 200),
    ({"x-api-key": "wrong"}, 401),
    ({}, 401),
])
async def test_the_api_key_is_accepted_as_x_api_key_or_bearer(locked, headers, status):
    resp = await locked.post("/v1/messages", json=MESSAGE, headers=headers)
    assert resp.status == status
    if status == 401:
        assert await resp.json() == {"type": "error", "error": {
            "type": "authentication_error", "message": "Invalid or missing API key."}}
    resp = await locked.get("/v1/models", headers=headers)  # every /v1 route, OpenAI envelope
    assert resp.status == status
    if status == 401:
        assert (await resp.json())["error"]["code"] == "invalid_api_key"


async def test_the_anthropic_sdk_authenticates_with_x_api_key(locked):
    sdk = anthropic.AsyncAnthropic(base_url=str(locked.make_url("")), api_key=KEY, max_retries=0)
    msg = await sdk.messages.create(**MESSAGE)
    assert msg.usage.output_tokens == 4
    with pytest.raises(anthropic.AuthenticationError):
        await anthropic.AsyncAnthropic(base_url=str(locked.make_url("")), api_key="no",
                                       max_retries=0).messages.create(**MESSAGE)


async def test_engine_gone_is_503_api_error_which_the_sdk_calls_service_unavailable(client, fake):
    await fake.stop()
    resp = await client.post("/v1/messages", json=MESSAGE)
    assert resp.status == 503
    body = await resp.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    sdk = anthropic.AsyncAnthropic(base_url=str(client.make_url("")), api_key="x", max_retries=0)
    with pytest.raises(anthropic.ServiceUnavailableError) as info:
        await sdk.messages.create(**MESSAGE)
    assert isinstance(info.value, anthropic.InternalServerError)


@pytest.mark.parametrize("path, body", [("/v1/messages", MESSAGE), ("/v1/responses", RESPONSE)])
async def test_an_engine_failure_mid_stream_is_the_dialects_error_event(client, fake, path, body):
    fake.mode = "partial"  # admitted and one token, then nothing
    resp = await client.post(path, json={**body, "stream": True})
    assert resp.status == 200
    await resp.content.readuntil(b"delta")  # the first token is out
    await fake.stop()
    got = events((await resp.read()).decode().split("\n\n", 1)[1])
    if path == "/v1/messages":
        assert got[-1] == ("error", {"type": "error", "error": {
            "type": "api_error", "message": got[-1][1]["error"]["message"]}})
    else:
        assert [n for n, _ in got[-2:]] == ["error", "response.failed"]
        assert got[-2][1]["code"] == "engine_unavailable"
        assert got[-1][1]["response"]["status"] == "failed"
        assert got[-1][1]["response"]["error"]["code"] == "engine_unavailable"


async def test_messages_stream_names_every_event_and_counts_usage(client):
    resp = await client.post("/v1/messages", json={**MESSAGE, "stream": True})
    assert resp.status == 200 and resp.content_type == "text/event-stream"
    got = events(await resp.text())
    names = [n for n, _ in got]
    assert names == ["message_start", "content_block_start", "ping"] + [
        "content_block_delta"] * 4 + ["content_block_stop", "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in got)
    delta = got[-2][1]
    assert delta["delta"]["stop_reason"] == "max_tokens"
    # "hi": (3 + 1) + 3 = 7
    assert delta["usage"] == {"input_tokens": 7, "output_tokens": 4}


async def test_completions_echo_puts_the_prompt_before_the_completion(client):
    body = {"model": FAKE_MODEL, "prompt": "Say hi", "max_tokens": 2, "echo": True}
    doc = await (await client.post("/v1/completions", json=body)).json()
    assert doc["choices"][0]["text"] == "Say hi token token"
    assert doc["usage"]["prompt_tokens"] == 2  # 6 bytes -> 2 tokens
    text = await (await client.post("/v1/completions", json={**body, "stream": True})).text()
    chunks = [json.loads(f.removeprefix("data: ")) for f in text.split("\n\n")[:-2]]
    texts = [c["choices"][0]["text"] for c in chunks]
    assert texts[0] == "Say hi" and "".join(texts) == "Say hi token token"
    ids = {"model": FAKE_MODEL, "prompt": [5, 6, 7], "max_tokens": 1, "echo": True}
    doc = await (await client.post("/v1/completions", json=ids)).json()
    assert doc["choices"][0]["text"] == "\x05\x06\x07" + " token"  # ids echo as the tokenizer decodes them


async def test_metrics_count_each_new_route_by_status(client):
    await client.post("/v1/messages", json=MESSAGE)
    await client.post("/v1/responses", json=RESPONSE)
    await client.post("/v1/responses", json={**RESPONSE, "model": "nope"})
    text = await (await client.get("/metrics")).text()
    assert 'route="/v1/messages",status="200"} 1.0' in text
    assert 'route="/v1/responses",status="200"} 1.0' in text
    assert 'route="/v1/responses",status="404"} 1.0' in text

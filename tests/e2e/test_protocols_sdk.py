"""The other APIs clients speak, against the real `serve`, through the official SDKs: the
Anthropic Messages API (`anthropic`, including its 529 OverloadedError and its retries) and
the OpenAI Responses API (`openai`)."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import anthropic
import httpx2
import openai
import pytest

from hardening_helpers import json_request
from inference_lab.testing.poll import wait_until
from inference_lab.testing.launch import serve

MODEL = "gpt-oss-20b"


@pytest.fixture(scope="module")
def served():
    with serve() as s:
        yield s


def post_json(base: str, path: str, body: dict) -> tuple[int, dict | list]:
    return json_request(base, "POST", path, body)


def gateway_count(base: str, route: str, status: int) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = (r'inference_lab_gateway_http_requests_total\{route="%s",status="%d"\} (\S+)'
               % (re.escape(route), status))
    match = re.search(pattern, text)
    return float(match.group(1)) if match else 0.0


# ---- Anthropic Messages -----------------------------------------------------------------------


def test_a_message_has_exactly_max_tokens_and_exact_usage(claude):
    msg = claude.messages.create(model=MODEL, max_tokens=7, system="be brief",
                                 messages=[{"role": "user", "content": "hello"}])
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL
    assert msg.content[0].type == "text" and msg.content[0].text == " token" * 7
    assert msg.stop_reason == "max_tokens"
    # "hello" 5 bytes -> 2, "be brief" 8 bytes -> 2: (3 + 2) + (3 + 2) + 3 = 13
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (13, 7)


def test_a_streamed_message_has_the_event_sequence_one_delta_per_token_and_usage(claude):
    with claude.messages.stream(model=MODEL, max_tokens=6, messages=[
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "again"}]) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    raw = [e for e in events if e != "text"]  # the SDK adds a `text` event per delta
    assert raw == (["message_start", "content_block_start"] + ["content_block_delta"] * 6
                   + ["content_block_stop", "message_delta", "message_stop"])
    assert final.content[0].text == " token" * 6 and final.stop_reason == "max_tokens"
    # (3 + 2) + (3 + 1) + (3 + 2) + 3 = 17
    assert (final.usage.input_tokens, final.usage.output_tokens) == (17, 6)


def test_an_unknown_model_is_not_found_error_and_bad_input_is_invalid_request_error(served, claude):
    with pytest.raises(anthropic.NotFoundError) as info:
        claude.messages.create(model="nope", max_tokens=3,
                               messages=[{"role": "user", "content": "x"}])
    assert info.value.status_code == 404 and info.value.type == "not_found_error"
    status, body = post_json(served.base, "/v1/messages",
                             {"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert status == 400 and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


def _saturate(served) -> list:
    """max_num_seqs 1, max_waiting 1: one long stream runs, one waits, so the queue is full.
    First the engine lets go of every earlier stream (a hang-up reaches it a moment after
    the client closed): otherwise a holder could find the queue still full."""
    wait_until(lambda: served.capacity()[0]["running"] == 0
               and served.capacity()[0]["waiting"] == 0, what="an idle engine")
    base = served.base
    status, _ = post_json(base, "/control/capacity", {"max_num_seqs": 1, "max_waiting": 1})
    assert status == 200
    holders = []
    for held in range(2):
        req = urllib.request.Request(base + "/v1/messages", method="POST", data=json.dumps({
            "model": MODEL, "max_tokens": 20000, "stream": True,
            "messages": [{"role": "user", "content": "x"}]}).encode(),
            headers={"content-type": "application/json"})
        holders.append(urllib.request.urlopen(req, timeout=30))  # admitted: headers are back
        if not held:
            # admitted is not yet running: until a step schedules it, the first stream is
            # the one request the waiting queue holds, and a second would be refused
            wait_until(lambda: served.capacity()[0]["running"] == 1, what="the first stream running")
    assert [h.status for h in holders] == [200, 200]
    return holders


def _release(served, holders) -> None:
    """Hang up the streams holding the engine's places and lift the capacity limits; the
    hang-ups reach the engine, so the next test starts from an idle queue."""
    for h in holders:
        h.close()
    post_json(served.base, "/control/capacity", {"max_num_seqs": 256, "max_waiting": 0})
    wait_until(lambda: served.capacity()[0]["running"] == 0
               and served.capacity()[0]["waiting"] == 0, what="an idle engine")


@pytest.fixture
def saturated(served):
    holders = _saturate(served)
    try:
        yield
    finally:
        _release(served, holders)


def test_a_saturated_model_raises_overloaded_error_529_before_any_event(served, claude, saturated):
    with pytest.raises(anthropic.OverloadedError) as info:
        claude.messages.create(model=MODEL, max_tokens=3, stream=True,
                               messages=[{"role": "user", "content": "x"}])
    err = info.value
    assert err.status_code == 529 and err.type == "overloaded_error"
    assert err.response.headers["content-type"].startswith("application/json")
    assert err.body == {"type": "error", "error": {
        "type": "overloaded_error",
        "message": "Server is at capacity: 1 requests waiting (max_waiting = 1). "
                   "Retry with reduced concurrency."}}


def test_with_retries_on_the_sdk_tries_max_retries_plus_one_times(served, saturated):
    attempts = []
    http = httpx2.Client(event_hooks={"request": [attempts.append]})
    client = anthropic.Anthropic(base_url=served.base, api_key="unused", max_retries=2,
                                 timeout=30, http_client=http)
    before = gateway_count(served.base, "/v1/messages", 529)
    with pytest.raises(anthropic.OverloadedError):
        client.messages.create(model=MODEL, max_tokens=3,
                               messages=[{"role": "user", "content": "x"}])
    assert len(attempts) == 3
    assert [r.headers["x-stainless-retry-count"] for r in attempts] == ["0", "1", "2"]
    assert gateway_count(served.base, "/v1/messages", 529) == before + 3


# ---- OpenAI Responses ------------------------------------------------------------------------


def test_a_response_without_a_cap_is_completed_with_exact_usage(oai):
    resp = oai.responses.create(model=MODEL, input="hello", instructions="be brief")
    assert resp.status == "completed" and resp.object == "response"
    assert resp.output_text == " token" * 256  # the default length
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.total_tokens) == (
        13, 256, 269)


def test_a_response_that_reaches_max_output_tokens_is_incomplete(oai):
    resp = oai.responses.create(model=MODEL, input=[{"role": "user", "content": "hello"}],
                                max_output_tokens=5)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output_text == " token" * 5 and resp.usage.output_tokens == 5


def test_a_streamed_response_has_typed_events_one_delta_per_token_then_completed(oai):
    events = list(oai.responses.create(model=MODEL, input="hello", stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[4:-4] == ["response.output_text.delta"] * 256
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert done.status == "completed" and done.usage.output_tokens == 256
    assert done.output_text == "".join(e.delta for e in events if e.type.endswith(".delta"))


def test_a_saturated_model_refuses_a_response_with_the_openai_529(oai, saturated):
    with pytest.raises(openai.APIStatusError) as info:
        oai.responses.create(model=MODEL, input="x", stream=True)
    assert info.value.status_code == 529
    assert info.value.body["code"] == "queue_saturated"


# ---- parallel sampling -----------------------------------------------------------------------


def test_n_3_chat_has_three_choices_and_usage_counting_all_three(oai):
    resp = oai.chat.completions.create(model=MODEL, n=3, max_tokens=6,
                                       messages=[{"role": "user", "content": "hello"}])
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert all(c.message.content == " token" * 6 and c.finish_reason == "length"
               for c in resp.choices)
    # "hello": (3 + 2) + 3 = 8 prompt tokens, counted once; 3 x 6 completion tokens
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (8, 18)


def test_n_3_chat_streams_every_choice_by_index_one_chunk_per_token(oai):
    stream = oai.chat.completions.create(model=MODEL, n=3, max_tokens=6, stream=True,
                                         stream_options={"include_usage": True},
                                         messages=[{"role": "user", "content": "hello"}])
    tokens, roles, finish, usage = [0, 0, 0], set(), {}, None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.role:
                roles.add(choice.index)
            if choice.delta.content:
                assert choice.delta.content == " token"
                tokens[choice.index] += 1
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    assert roles == {0, 1, 2} and tokens == [6, 6, 6]
    assert finish == {0: "length", 1: "length", 2: "length"}
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (8, 18, 26)


def test_a_request_of_n_sequences_takes_n_places_but_waits_as_one(served, oai):
    """max_num_seqs 4, max_waiting 1: an n = 4 stream holds all four places, an n = 3 one
    waits as one request, so the next is refused with 529; after they hang up nothing is
    left running."""
    status, _ = post_json(served.base, "/control/capacity", {"max_num_seqs": 4, "max_waiting": 1})
    assert status == 200
    try:
        holders = []
        for n in (4, 3):
            req = urllib.request.Request(served.base + "/v1/chat/completions", method="POST",
                                         data=json.dumps({
                                             "model": MODEL, "n": n, "max_tokens": 20000,
                                             "stream": True,
                                             "messages": [{"role": "user", "content": "x"}]}).encode(),
                                         headers={"content-type": "application/json"})
            holders.append(urllib.request.urlopen(req, timeout=30))
        holders[0].read(1)  # the family of four is decoding
        _, rows = json_request(served.base, "GET", "/control/capacity")
        assert (rows[0]["running"], rows[0]["waiting"]) == (4, 1)
        with pytest.raises(openai.APIStatusError) as info:
            oai.chat.completions.create(model=MODEL, n=2, max_tokens=3,
                                        messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 529
    finally:
        _release(served, holders)
    deadline = time.monotonic() + 10
    while json_request(served.base, "GET", "/control/capacity")[1][0]["running"]:
        assert time.monotonic() < deadline, "the hung-up sequences kept running"
        time.sleep(0.02)


def test_a_batch_of_prompts_streams_every_choice_by_its_prompt_major_index(oai):
    stream = oai.completions.create(model=MODEL, prompt=["hello", "hi"], n=2, max_tokens=5,
                                    stream=True, stream_options={"include_usage": True})
    tokens, finish, usage = [0] * 4, {}, None
    for chunk in stream:
        for choice in chunk.choices:
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
            else:
                tokens[choice.index] += 1
        usage = chunk.usage or usage
    assert tokens == [5, 5, 5, 5] and finish == {i: "length" for i in range(4)}
    # "hello" 5 bytes -> 2 tokens, "hi" -> 1; 2 prompts x 2 choices x 5 tokens
    assert (usage.prompt_tokens, usage.completion_tokens) == (3, 20)


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"max_tokens": 20000, "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/responses", {"max_output_tokens": 20000, "input": "x"}),
])
def test_a_client_that_hangs_up_mid_stream_leaves_nothing_running(served, path, body):
    req = urllib.request.Request(served.base + path, method="POST", data=json.dumps(
        {"model": MODEL, "stream": True, **body}).encode(),
        headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.read(200)  # the stream is flowing
        assert json_request(served.base, "GET", "/control/capacity")[1][0]["running"] == 1
    deadline = time.monotonic() + 10
    while json_request(served.base, "GET", "/control/capacity")[1][0]["running"]:
        assert time.monotonic() < deadline, "the engine never heard of the hang-up"
        time.sleep(0.02)

"""What real clients send that the first sweep of the APIs did not cover, against the real
`serve` through the official SDKs: an agent loop's tool calls, tool results and tool
definitions counted in the prompt (every dialect); the Responses API's function_call /
function_call_output / reasoning input items and `previous_response_id`; Anthropic's
`count_tokens`; OpenAI's nullable fields sent as null; and finish_reason "stop" when the
length was the engine's choice."""

from __future__ import annotations

import json
import math

import anthropic
import openai
import pytest

from hardening_helpers import json_request
from inference_lab.testing.launch import serve

MODEL = "gpt-oss-20b"
TOOLS_OAI = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                                "parameters": {"type": "object"}}}]
TOOLS_CLAUDE = [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}}]


def tokens(*texts: str) -> int:
    """The built-in tokenizer's count of a conversation of these message texts: 3 header
    tokens a message, ceil(bytes / 4) for its text, 3 for the reply's priming."""
    return sum(3 + math.ceil(len(t.encode()) / 4) for t in texts) + 3


def compact(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


@pytest.fixture(scope="module")
def served():
    with serve() as s:
        yield s


def test_chat_counts_tool_calls_and_tool_definitions_and_takes_null_fields(served, oai):
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}]
    plain = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert plain.usage.prompt_tokens == tokens("weather?", 'get_weather{"city":"Paris"}', "sunny, 21 C")
    # the raw body as an SDK-less client sends it, nullable fields null and tools given
    status, body = json_request(served.base, "POST", "/v1/chat/completions", {
        "model": MODEL, "messages": messages, "tools": TOOLS_OAI, "max_tokens": 2,
        "stream": None, "n": None, "stream_options": None})
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == tokens(compact(TOOLS_OAI), "weather?",
                                                    'get_weather{"city":"Paris"}', "sunny, 21 C")
    assert len(body["choices"]) == 1 and body["choices"][0]["finish_reason"] == "length"


def test_finish_reason_is_stop_when_the_engine_chose_the_length(oai):
    natural = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert natural.choices[0].finish_reason == "stop" and natural.usage.completion_tokens == 256
    capped = oai.completions.create(model=MODEL, prompt="hi", max_tokens=3)
    assert capped.choices[0].finish_reason == "length"
    stream = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                         n=2, stream=True)
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in stream
                if c.choices and c.choices[0].finish_reason}
    assert finishes == {0: "stop", 1: "stop"}  # the default 256 tokens: no cap reached


def test_responses_take_an_agent_loops_items_and_chain_by_previous_response_id(oai):
    items = [{"role": "user", "content": "weather?"},
             {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "look up"}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    first = oai.responses.create(model=MODEL, input=items, max_output_tokens=4, instructions="be brief",
                                 tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}])
    tools = compact([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}])
    turn1 = ["weather?", "look up", 'get_weather{"city":"Paris"}', "sunny"]
    assert first.usage.input_tokens == tokens(tools, "be brief", *turn1)
    second = oai.responses.create(model=MODEL, input="and tomorrow?", previous_response_id=first.id,
                                  max_output_tokens=2)
    assert second.previous_response_id == first.id
    # instructions are not carried over (as OpenAI); the first reply is
    assert second.usage.input_tokens == tokens(*turn1, " token" * 4, "and tomorrow?")
    with pytest.raises(openai.NotFoundError) as info:
        oai.responses.create(model=MODEL, input="x", previous_response_id="resp_nope", max_output_tokens=2)
    assert info.value.body["code"] == "previous_response_not_found" and "resp_nope" in info.value.body["message"]
    unstored = oai.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model=MODEL, input="y", previous_response_id=unstored.id, max_output_tokens=2)


def test_anthropic_counts_tool_use_tool_results_thinking_and_tools_and_count_tokens_agrees(claude):
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "look it up", "signature": "sig"},
                    {"type": "tool_use", "id": "tu1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "tu1", "content": [{"type": "text", "text": "sunny"}]}]}]
    msg = claude.messages.create(model=MODEL, max_tokens=3, system="be brief", tools=TOOLS_CLAUDE,
                                 messages=messages)
    expected = tokens(compact(TOOLS_CLAUDE), "be brief", "weather?",
                      'look it upget_weather{"city":"Paris"}', "sunny")
    assert msg.usage.input_tokens == expected
    counted = claude.messages.count_tokens(model=MODEL, system="be brief", tools=TOOLS_CLAUDE,
                                           messages=messages)
    assert counted.input_tokens == expected
    with pytest.raises(anthropic.NotFoundError) as info:
        claude.messages.count_tokens(model="nope", messages=[{"role": "user", "content": "x"}])
    assert info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.count_tokens(model=MODEL, messages=[])
    assert "$.messages" in info.value.body["error"]["message"]


def test_logprobs_when_asked_in_each_apis_shape(oai):
    chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=3, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert [(c.token, c.logprob, len(c.top_logprobs)) for c in content] == [(" token", 0.0, 2)] * 3
    assert content[0].top_logprobs[0].token == " token" and content[0].top_logprobs[1].logprob == -9999.0
    plain = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert plain.choices[0].logprobs is None
    stream = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=3, logprobs=True, stream=True)
    per_chunk = [len(c.choices[0].logprobs.content) for c in stream
                 if c.choices and c.choices[0].delta.content]
    assert per_chunk == [1, 1, 1]
    text = oai.completions.create(model=MODEL, prompt="hi", max_tokens=3, logprobs=2, echo=True)
    lp = text.choices[0].logprobs
    # the echoed prompt's token first (nothing predicts it: null), then the generated ones
    assert lp.tokens == ["hi"] + [" token"] * 3 and lp.token_logprobs == [None] + [0.0] * 3
    assert lp.text_offset == [0, 2, 8, 14] and len(lp.top_logprobs[1]) == 2  # after "hi"
    streamed = oai.completions.create(model=MODEL, prompt="hi", max_tokens=3, logprobs=1, stream=True)
    offsets = [c.choices[0].logprobs.text_offset[0] for c in streamed if c.choices and c.choices[0].text]
    assert offsets == [0, 6, 12]
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                    max_tokens=2, top_logprobs=2)
    assert "$.top_logprobs" in info.value.body["message"]


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
CLAUDE = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
RESP = {"model": MODEL, "input": "hi", "max_output_tokens": 2}


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "$.temperature"),
    ("/v1/chat/completions", {**CHAT, "temperature": -0.5}, "$.temperature"),
    ("/v1/chat/completions", {**CHAT, "top_p": 1.5}, "$.top_p"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": 3}, "$.presence_penalty"),
    ("/v1/chat/completions", {**CHAT, "stop": 5}, "$.stop"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"50256": 500}}, "$.logit_bias"),
    ("/v1/chat/completions", {**CHAT, "seed": "x"}, "$.seed"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2, "top_k": -5}, "$.top_k"),
    ("/v1/messages", {**CLAUDE, "temperature": 1.5}, "$.temperature"),
    ("/v1/messages", {**CLAUDE, "stop_sequences": "\n"}, "$.stop_sequences"),
    ("/v1/responses", {**RESP, "temperature": -1}, "$.temperature"),
    ("/v1/responses", {**RESP, "top_p": 2}, "$.top_p"),
])
def test_sampling_parameters_are_checked_by_type_and_range(served, path, body, field):
    status, reply = json_request(served.base, "POST", path, body)
    assert status == 400, reply
    error = reply["error"]
    assert field in error["message"]
    assert (reply["type"], error["type"]) == ("error", "invalid_request_error") if path == "/v1/messages" \
        else error["code"] == "invalid_request"


def test_valid_sampling_parameters_pass(served):
    ok = {**CHAT, "temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0.1, "seed": 7, "user": "u",
          "stop": ["\n", "END"], "logit_bias": {"50256": -100}, "frequency_penalty": -2,
          "repetition_penalty": 1.1}
    assert json_request(served.base, "POST", "/v1/chat/completions", ok)[0] == 200
    assert json_request(served.base, "POST", "/v1/messages",
                        {**CLAUDE, "temperature": 1, "top_k": 5, "stop_sequences": ["x"]})[0] == 200
    assert json_request(served.base, "POST", "/v1/responses", {**RESP, "temperature": 2, "top_p": 0.5})[0] == 200


def test_a_stored_response_is_retrieved_and_deleted(oai):
    made = oai.responses.create(model=MODEL, input="hi", max_output_tokens=3)
    got = oai.responses.retrieve(made.id)
    assert (got.id, got.status, got.output_text, got.usage.output_tokens) == (made.id, "incomplete", " token" * 3, 3)
    streamed = oai.responses.create(model=MODEL, input="hi", max_output_tokens=2, stream=True)
    rid = [e.response.id for e in streamed if e.type == "response.incomplete"][0]
    assert oai.responses.retrieve(rid).output_text == " token" * 2
    oai.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError) as info:
        oai.responses.retrieve(made.id)
    assert info.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        oai.responses.create(model=MODEL, input="x", previous_response_id=made.id, max_output_tokens=2)
    unstored = oai.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)

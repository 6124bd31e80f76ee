"""Reasoning output through the real `serve` (gpt-oss-20b, a reasoning model), read by the
official SDKs' stream accumulators: `reasoning_content` chat deltas before the content,
a reasoning item before the message in Responses, a thinking block before the text on
Messages when the request enables thinking; counted in usage, paced like any token."""

from __future__ import annotations

import time

import anthropic
import openai
import pytest

from inference_lab.testing.launch import serve

MODEL = "gpt-oss-20b"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def lab():
    with serve("--reasoning") as served:
        yield served


@pytest.fixture(scope="module")
def client(lab):
    return openai.OpenAI(base_url=lab.base + "/v1", api_key="unused", max_retries=0)


def test_chat_streams_reasoning_content_first_then_the_content(client):
    stream = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=40, stream=True,
                                            stream_options={"include_usage": True})
    kinds, seen = [], {}
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            extra = delta.model_extra or {}
            if extra.get("reasoning_content"):
                kinds.append("reasoning")
                seen.setdefault("reasoning", time.monotonic())
            elif delta.content:
                kinds.append("content")
                seen.setdefault("content", time.monotonic())
        usage = chunk.usage
    assert kinds == ["reasoning"] * 20 + ["content"] * 20  # the preset's share: a half
    assert seen["content"] > seen["reasoning"]  # time to first content token apart from TTFT
    assert usage.completion_tokens == 40
    assert usage.completion_tokens_details.reasoning_tokens == 20


def test_the_sdks_chat_accumulator_and_the_effort_override(client):
    # no max_tokens: the engine's default length (256), a natural stop, which the SDK's
    # stream wrapper accepts (it refuses a "length" finish)
    with client.chat.completions.stream(model=MODEL, messages=HI,
                                        reasoning_effort="high") as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "stop"
    assert (message.model_extra or {}).get("reasoning_content") == " token" * 205  # 0.8 x 256
    assert message.content == " token" * 51
    low = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=10,
                                         reasoning_effort="low")
    assert low.usage.completion_tokens_details.reasoning_tokens == 2
    none = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=10,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert none.choices[0].message.content == " token" * 10
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=10,
                                       reasoning_effort="extreme")


def test_responses_streams_a_reasoning_item_before_the_message(client):
    # no max_output_tokens: the engine's default length (256), `completed`, which the
    # SDK's stream wrapper needs (its accumulator finishes on response.completed)
    with client.responses.stream(model=MODEL, input="hi", reasoning={"effort": "low"}) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_response()
    reasoning, message = final.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == " token" * 51  # 0.2
    assert message.type == "message" and message.content[0].text == " token" * 205
    assert final.usage.output_tokens_details.reasoning_tokens == 51
    assert events.count("response.reasoning_text.delta") == 51
    assert events.count("response.output_text.delta") == 205
    first_text = events.index("response.output_text.delta")
    assert events.index("response.reasoning_text.done") < first_text
    assert events[-1] == "response.completed"
    capped = client.responses.create(model=MODEL, input="hi", max_output_tokens=4)
    assert [item.type for item in capped.output] == ["reasoning", "message"]
    assert capped.status == "incomplete" and capped.output[1].content[0].text == " token" * 2


def test_messages_shows_thinking_only_when_the_request_enables_it(lab):
    client = anthropic.Anthropic(base_url=lab.base, api_key="unused", max_retries=0)
    with client.messages.stream(model=MODEL, max_tokens=2048, messages=HI,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        kinds = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    thinking, text = final.content
    assert thinking.type == "thinking" and thinking.thinking == " token" * 1024
    assert thinking.signature and text.type == "text" and text.text == " token" * 1024
    assert kinds == ["thinking_delta"] * 1024 + ["signature_delta"] + ["text_delta"] * 1024
    assert final.usage.output_tokens == 2048
    plain = client.messages.create(model=MODEL, max_tokens=8, messages=HI)
    assert [block.type for block in plain.content] == ["text"]
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        client.messages.create(model=MODEL, max_tokens=2048, messages=HI,
                               thinking={"type": "enabled", "budget_tokens": 10})


def test_without_the_flag_only_a_request_that_asks_gets_reasoning():
    with serve() as served:
        client = openai.OpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0)
        plain = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=6)
        assert plain.choices[0].message.content == " token" * 6
        assert plain.usage.completion_tokens_details is None
        asked = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=10,
                                               reasoning_effort="medium")
        assert asked.usage.completion_tokens_details.reasoning_tokens == 5

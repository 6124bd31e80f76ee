"""Forced tool calls through the official SDKs, against the real `serve` (gateway and
engine): OpenAI chat (`tool_choice` "required" or a named function), Anthropic Messages
(`{"type": "any"}` or a named tool) and OpenAI Responses, streamed and not. The SDK parses
the call, its arguments are JSON satisfying the tool's schema, the stop reason says so, the
SDK's stream accumulators rebuild the same call, and the token count is the engine's.
"auto" keeps text; a named tool that is not in `tools` is a 400 naming the field."""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import jsonschema
import openai
import pydantic
import pytest

from inference_lab.testing.launch import serve

MODEL = "gpt-oss-20b"
HELLO = [{"role": "user", "content": "what is the weather?"}]
WEATHER = {"type": "object", "properties": {
    "location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "hours": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 23}},
    "note": {"type": "string"}},
    "required": ["location", "unit", "days", "hours"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}},
              {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
MESSAGES_TOOLS = [{"name": "get_weather", "input_schema": WEATHER},
                  {"name": "lookup", "input_schema": {"type": "object"}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER},
                   {"type": "function", "name": "lookup", "parameters": None}]


class Forecast(pydantic.BaseModel):  # a strict tool, as `openai.pydantic_function_tool` makes
    city: str
    unit: Literal["celsius", "fahrenheit"]
    days: int = pydantic.Field(ge=1, le=7)


@pytest.fixture(scope="module")
def served():
    with serve() as s:
        yield s


def weather_ok(arguments: dict, tokens: int) -> None:
    """The arguments satisfy WEATHER; the free string grew one placeholder per token."""
    jsonschema.validate(arguments, WEATHER)
    assert arguments["location"] == " token" * tokens and arguments["unit"] == "celsius"


# ---- OpenAI chat completions ---------------------------------------------------------------


def test_chat_required_and_named_answer_a_tool_call_with_the_engines_token_count(oai):
    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = oai.chat.completions.create(model=MODEL, messages=HELLO, tools=CHAT_TOOLS,
                                        tool_choice=named, max_tokens=5, n=2)
    assert [c.finish_reason for c in reply.choices] == ["tool_calls"] * 2
    calls = [c.message.tool_calls for c in reply.choices]
    assert all(len(c) == 1 and c[0].type == "function" for c in calls)
    assert calls[0][0].id.startswith("call_") and calls[0][0].id != calls[1][0].id
    assert reply.choices[0].message.content is None
    call = calls[0][0].function
    assert call.name == "get_weather"
    weather_ok(json.loads(call.arguments), 5)
    assert calls[1][0].function.arguments == call.arguments  # seeded: the same arguments
    assert reply.usage.completion_tokens == 10  # the engine's: 5 per choice
    first = oai.chat.completions.create(model=MODEL, messages=HELLO, tools=CHAT_TOOLS,
                                        tool_choice="required", max_tokens=3)
    call = first.choices[0].message.tool_calls[0].function
    assert (call.name, call.arguments) == ("lookup", "{   }")  # the first tool; no schema: {}


def test_chat_streams_the_call_as_openai_does_and_the_deltas_rebuild_it(oai):
    kwargs = dict(model=MODEL, messages=HELLO, tools=CHAT_TOOLS, max_tokens=6,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = oai.chat.completions.create(**kwargs).choices[0].message.tool_calls[0]
    chunks = list(oai.chat.completions.create(**kwargs, stream=True,
                                              stream_options={"include_usage": True}))
    head = chunks[0].choices[0].delta
    assert head.role == "assistant" and head.content is None
    (opened,) = head.tool_calls
    assert (opened.index, opened.type, opened.function.name, opened.function.arguments) == (
        0, "function", "get_weather", "")
    assert opened.id.startswith("call_")
    fragments = [c.choices[0].delta.tool_calls[0] for c in chunks[1:] if c.choices
                 and c.choices[0].delta.tool_calls]
    # one fragment per generated token (the first opens the object), then the closing one
    assert len(fragments) == 6 + 1 and all(f.index == 0 and f.id is None for f in fragments)
    assert "".join(f.function.arguments for f in fragments) == whole.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == 6


def test_chat_stream_helper_parses_a_strict_pydantic_tool(oai):
    tool = openai.pydantic_function_tool(Forecast)
    with oai.chat.completions.stream(model=MODEL, messages=HELLO, tools=[tool], max_tokens=4,
                                     tool_choice="required") as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls" and call.function.name == "Forecast"
    parsed = call.function.parsed_arguments  # validated by the pydantic model
    assert isinstance(parsed, Forecast) and parsed.city == " token" * 4 and parsed.unit == "celsius"
    assert len(done) == 1 and done[0].parsed_arguments == parsed
    assert final.usage is None or final.usage.completion_tokens == 4


def test_chat_auto_none_and_absent_keep_text(oai):
    for choice in ("auto", "none", openai.omit):
        reply = oai.chat.completions.create(model=MODEL, messages=HELLO, tools=CHAT_TOOLS,
                                            tool_choice=choice, max_tokens=3)
        message = reply.choices[0].message
        assert message.content == " token" * 3 and message.tool_calls is None
        assert reply.choices[0].finish_reason == "length"


# ---- Anthropic Messages -------------------------------------------------------------------------


def test_messages_any_and_named_answer_a_tool_use_block(claude):
    msg = claude.messages.create(model=MODEL, max_tokens=5, messages=HELLO, tools=MESSAGES_TOOLS,
                                 tool_choice={"type": "any"})
    (block,) = msg.content
    assert block.type == "tool_use" and block.id.startswith("toolu_") and block.name == "get_weather"
    weather_ok(block.input, 5)
    assert msg.stop_reason == "tool_use" and msg.usage.output_tokens == 5
    named = claude.messages.create(model=MODEL, max_tokens=2, messages=HELLO, tools=MESSAGES_TOOLS,
                                   tool_choice={"type": "tool", "name": "lookup"})
    assert (named.content[0].name, named.content[0].input) == ("lookup", {})
    auto = claude.messages.create(model=MODEL, max_tokens=2, messages=HELLO, tools=MESSAGES_TOOLS,
                                  tool_choice={"type": "auto"})
    assert auto.content[0].type == "text" and auto.stop_reason == "max_tokens"


def test_messages_stream_sends_input_json_deltas_and_the_accumulator_rebuilds_the_call(claude):
    with claude.messages.stream(model=MODEL, max_tokens=6, messages=HELLO, tools=MESSAGES_TOOLS,
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(e for e in events if e.type == "content_block_start")
    assert start.content_block.type == "tool_use" and start.content_block.input == {}
    deltas = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert len(deltas) == 6 + 1  # one per token (the first opens the object), then the close
    (block,) = final.content
    assert block.type == "tool_use" and block.id == start.content_block.id
    assert block.input == json.loads("".join(deltas))
    weather_ok(block.input, 6)
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 6


def test_the_sdks_tool_runner_runs_an_agent_loop_of_forced_calls(claude):
    """The anthropic SDK's `beta.messages.tool_runner` asks for a server-held thread by
    default and sends later turns without the history and tools; the lab refuses `thread`
    with the error code on which the SDK resends the whole conversation (before: turn 2 was
    a 400, "`tools` holds no function tool")."""
    calls = []

    @anthropic.beta_tool
    def get_weather(location: str) -> str:
        """The weather at a place."""
        calls.append(location)
        return "sunny"

    runner = claude.beta.messages.tool_runner(
        model=MODEL, max_tokens=3, messages=HELLO, tools=[get_weather],
        tool_choice={"type": "any"}, max_iterations=3)
    replies = list(runner)
    assert [m.stop_reason for m in replies] == ["tool_use"] * 3 and len(calls) == 3
    prompts = [m.usage.input_tokens for m in replies]
    assert prompts[0] < prompts[1] < prompts[2]  # each turn sends the whole, longer history
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.beta.messages.create(model=MODEL, max_tokens=2, messages=HELLO,
                                    thread={"type": "create"})
    assert refused.value.body["error"]["details"]["error_code"] == "thread_unsupported_request"
    assert "`$.thread`" in refused.value.body["error"]["message"]


# ---- OpenAI Responses ---------------------------------------------------------------------------


def test_responses_required_answers_a_function_call_item(oai):
    response = oai.responses.create(model=MODEL, input="weather?", tools=RESPONSES_TOOLS,
                                    tool_choice="required", max_output_tokens=5)
    (item,) = response.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.id.startswith("fc_") and item.call_id.startswith("call_")
    assert item.status == "completed" and response.status == "completed"
    weather_ok(json.loads(item.arguments), 5)
    assert response.usage.output_tokens == 5 and response.tool_choice == "required"
    # the agent loop goes on: the call's output, continuing the stored response
    after = oai.responses.create(model=MODEL, previous_response_id=response.id, max_output_tokens=2,
                                 input=[{"type": "function_call_output", "call_id": item.call_id,
                                         "output": "sunny"}])
    assert after.output[0].type == "message" and after.output_text == " token" * 2


def test_responses_stream_sends_the_function_call_events_and_the_accumulator_rebuilds_it(oai):
    with oai.responses.stream(model=MODEL, input="weather?", tools=RESPONSES_TOOLS,
                              tool_choice={"type": "function", "name": "get_weather"},
                              max_output_tokens=4) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds == (["response.created", "response.in_progress", "response.output_item.added"]
                     + ["response.function_call_arguments.delta"] * (4 + 1)
                     + ["response.function_call_arguments.done", "response.output_item.done",
                        "response.completed"])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = events[2].item
    assert added.type == "function_call" and added.arguments == "" and added.status == "in_progress"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (item,) = final.output
    assert item.arguments == deltas == events[-3].arguments and item.call_id == added.call_id
    weather_ok(json.loads(item.arguments), 4)
    assert final.usage.output_tokens == 4


# ---- a named tool that is not there ---------------------------------------------------------


def test_a_named_tool_not_in_tools_is_a_400_naming_the_field(oai, claude):
    with pytest.raises(openai.BadRequestError) as chat:
        oai.chat.completions.create(model=MODEL, messages=HELLO, tools=CHAT_TOOLS, max_tokens=2,
                                    tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "$.tool_choice.function.name" in chat.value.message and "'nope'" in chat.value.message
    with pytest.raises(anthropic.BadRequestError) as messages:
        claude.messages.create(model=MODEL, max_tokens=2, messages=HELLO, tools=MESSAGES_TOOLS,
                               tool_choice={"type": "tool", "name": "nope"})
    assert messages.value.body["error"]["type"] == "invalid_request_error"
    assert "$.tool_choice.name" in messages.value.message
    with pytest.raises(openai.BadRequestError) as responses:
        oai.responses.create(model=MODEL, input="hi", tools=RESPONSES_TOOLS, max_output_tokens=2,
                             tool_choice={"type": "function", "name": "nope"})
    assert "$.tool_choice.name" in responses.value.message


def test_a_fault_directive_on_a_forced_tool_call_is_a_400_that_says_so(oai):
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model=MODEL, messages=HELLO, tools=CHAT_TOOLS, max_tokens=2,
                                    tool_choice="required", extra_headers={
                                        "x-inference-lab-fault": "cut_between_frames"})
    assert "not to a forced tool call" in caught.value.message

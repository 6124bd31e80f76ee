"""Forced tool calls' arguments (gateway.toolcalls): synthesized from the tool's JSON
schema, they validate against it at every token count, grow by one fragment per token,
and are the same for the same seed; which tool each API's `tool_choice` forces, and the
400 that names the field when it names a tool `tools` lacks."""

from __future__ import annotations

import json

import jsonschema
import pytest

from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.gateway.toolcalls import (
    chat_forced, messages_forced, responses_forced, synthesize,
)

FRAGMENT = " token"
WEATHER = {"type": "object", "properties": {
    "location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}, "note": {"type": "string"}},
    "required": ["location", "unit", "days"]}

SCHEMAS = {
    "weather": WEATHER,
    "nested, with $defs and anyOf": {
        "type": "object", "required": ["items", "when", "ratio", "flag", "maybe"],
        "properties": {
            "items": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/Item"}},
            "when": {"type": "string", "format": "date-time"},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "flag": {"type": "boolean"},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "integer", "multipleOf": 5,
                                                   "minimum": 12, "maximum": 40}]}},
        "$defs": {"Item": {"type": "object", "additionalProperties": False,
                           "required": ["sku", "qty"],
                           "properties": {"sku": {"type": "string", "minLength": 8},
                                          "qty": {"type": "integer", "exclusiveMinimum": 0}}}}},
    "allOf and const": {"allOf": [
        {"type": "object", "properties": {"kind": {"const": "search"}}, "required": ["kind"]},
        {"properties": {"query": {"type": "string"}, "limit": {"type": ["integer", "null"]}},
         "required": ["query", "limit"]}]},
    "no strings": {"type": "object", "properties": {"n": {"type": "integer", "maximum": -3},
                                                    "tags": {"type": "array", "maxItems": 0}},
                   "required": ["n", "tags"]},
    "bounded strings only": {"type": "object", "required": ["code"], "properties": {
        "code": {"type": "string", "maxLength": 3}}},
    "empty": {},
}


@pytest.mark.parametrize("schema", SCHEMAS.values(), ids=SCHEMAS.keys())
def test_the_arguments_validate_against_the_schema_at_every_token_count(schema):
    args = synthesize(schema, "0:f", FRAGMENT)
    for tokens in (0, 1, 2, 17, 300):
        text = args.text(tokens)
        jsonschema.validate(json.loads(text), schema)
        # each generated token adds one fragment of text, nothing else
        assert len(text) == len(args.prefix) + len(args.suffix) + tokens * len(args.fragment)


def test_the_first_plain_required_string_grows_one_placeholder_per_token():
    args = synthesize(WEATHER, "0:get_weather", FRAGMENT)
    value = args.value(3)
    # required only, in the schema's order; the enum takes its first value
    assert list(value) == ["location", "unit", "days"]
    assert value["location"] == " token token token" and value["unit"] == "celsius"
    assert args.prefix == '{"location":"' and args.fragment == FRAGMENT


def test_without_a_plain_string_the_tokens_are_whitespace_before_the_closing_brace():
    assert synthesize(None, "0:f", FRAGMENT).text(3) == "{   }"
    args = synthesize(SCHEMAS["no strings"], "0:f", FRAGMENT)
    assert args.fragment == " " and args.suffix == "}" and args.text(2).endswith("  }")
    assert json.loads(args.text(2))["tags"] == []


def test_the_same_seed_gives_the_same_arguments_and_the_seed_picks_the_draws():
    schema = {"type": "object", "required": [f"n{i}" for i in range(8)],
              "properties": {f"n{i}": {"type": "integer"} for i in range(8)}}
    assert synthesize(schema, "1:f", FRAGMENT) == synthesize(schema, "1:f", FRAGMENT)
    assert synthesize(schema, "1:f", FRAGMENT) != synthesize(schema, "2:f", FRAGMENT)


def test_a_recursive_schema_is_cut_at_a_sane_depth():
    schema = {"type": "object", "required": ["child"], "properties": {"child": {"$ref": "#"}}}
    text = synthesize(schema, "0:f", FRAGMENT).text(1)
    assert text.count("child") == 8 and json.loads(text)



@pytest.mark.parametrize("schema", [
    # a $ref cycle through anyOf (recursed until RecursionError: a 500 after 50 s)
    {"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}]}}, "$ref": "#/$defs/A"},
    # 16 ** 6 integers (an array of arrays at every level: minutes of the gateway's loop)
    {"type": "object", "required": ["x"], "properties": {"x": {
        "type": "array", "minItems": 16, "items": {"type": "array", "minItems": 16, "items": {
            "type": "array", "minItems": 16, "items": {"type": "array", "minItems": 16, "items": {
                "type": "array", "minItems": 16, "items": {"type": "array", "minItems": 16,
                                                           "items": {"type": "integer"}}}}}}}}},
    # a 100 MB string
    {"type": "object", "required": ["x"], "properties": {"x": {"type": "string",
                                                               "minLength": 10 ** 8}}},
    # a 20 KB const, repeated in 16 items of 16 items
    {"type": "object", "required": ["x"], "properties": {"x": {"type": "array", "minItems": 16,
        "items": {"type": "array", "minItems": 16, "items": {"const": "c" * 20000}}}}},
])
def test_a_schema_asking_for_a_huge_or_endless_value_is_cut_short(schema):
    text = synthesize(schema, "0:f", FRAGMENT).text(3)
    assert isinstance(json.loads(text), dict) and len(text) < 64 * 1024


@pytest.mark.parametrize("number", [
    {"type": "number", "minimum": -1e308, "multipleOf": 0.5},  # low / step overflows
    {"type": "number", "multipleOf": 1e-320},  # high / step overflows
])
def test_a_multiple_of_that_overflows_still_gives_a_number_in_bounds(number):
    schema = {"type": "object", "required": ["x"], "properties": {"x": number}}
    value = json.loads(synthesize(schema, "0:f", FRAGMENT).text(1))["x"]
    assert isinstance(value, (int, float)) and value >= number.get("minimum", 0)


CHAT_TOOLS = [{"type": "function", "function": {"name": "a", "parameters": WEATHER}},
              {"type": "function", "function": {"name": "b"}}]


def test_chat_forces_a_call_only_when_required_or_named():
    for choice in (None, "auto", "none", {"type": "allowed_tools",
                                          "allowed_tools": {"mode": "auto", "tools": []}}):
        assert chat_forced(CHAT_TOOLS, choice, 0, FRAGMENT) is None
    assert chat_forced(CHAT_TOOLS, "required", 0, FRAGMENT).name == "a"  # the first
    named = chat_forced(CHAT_TOOLS, {"type": "function", "function": {"name": "b"}}, 0, FRAGMENT)
    assert named.name == "b" and named.arguments.text(2) == "{  }"  # no parameters: {}
    allowed = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "b"}}]}}
    assert chat_forced(CHAT_TOOLS, allowed, 0, FRAGMENT).name == "b"


@pytest.mark.parametrize("forced, tools, choice, where", [
    (chat_forced, CHAT_TOOLS, {"type": "function", "function": {"name": "zz"}},
     "$.tool_choice.function.name"),
    (chat_forced, None, "required", "$.tool_choice"),
    (chat_forced, CHAT_TOOLS, "always", "$.tool_choice"),
    (chat_forced, {"a": 1}, "required", "$.tools"),
    (chat_forced, CHAT_TOOLS, {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": 5}}, "$.tool_choice.allowed_tools.tools"),  # was a 500
    (chat_forced, CHAT_TOOLS, {"type": "allowed_tools", "allowed_tools": {  # was a 500
        "mode": "required", "tools": [{"type": "function", "function": {"name": ["a"]}}]}},
     "$.tool_choice.allowed_tools.tools"),
    (responses_forced, [{"type": "function", "name": "a"}], {
        "type": "allowed_tools", "mode": "required", "tools": {"a": 1}}, "$.tool_choice.tools"),
    (messages_forced, [{"name": "a", "input_schema": WEATHER}], {"type": "tool", "name": "zz"},
     "$.tool_choice.name"),
    (messages_forced, [{"type": "web_search_20250305", "name": "web_search"}], {"type": "any"},
     "$.tool_choice"),
    (messages_forced, [], {"type": "sometimes"}, "$.tool_choice.type"),
    (responses_forced, [{"type": "function", "name": "a"}], {"type": "function", "name": "zz"},
     "$.tool_choice.name"),
    (responses_forced, [{"type": "function", "name": "a"}], {"type": "file_search"},
     "$.tool_choice.type"),
])
def test_a_forced_call_that_cannot_be_made_is_a_400_naming_the_field(forced, tools, choice, where):
    with pytest.raises(GatewayError) as caught:
        forced(tools, choice, 0, FRAGMENT)
    assert caught.value.kind is ErrorKind.INVALID_REQUEST
    assert caught.value.message.endswith(f"- at `{where}`")


def test_allowed_tools_none_of_which_is_in_tools_is_a_400_that_says_so():
    choice = {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "function", "function": {"name": "zz"}}]}}
    with pytest.raises(GatewayError) as caught:  # (was: "`tools` holds no function tool")
        chat_forced(CHAT_TOOLS, choice, 0, FRAGMENT)
    assert "allows only tools that are not in `tools`" in caught.value.message


def test_messages_any_forces_the_first_client_tool_and_responses_reads_its_own_shapes():
    tools = [{"type": "web_search_20250305", "name": "web_search"},
             {"name": "lookup", "input_schema": WEATHER}]
    assert messages_forced(tools, {"type": "any"}, 0, FRAGMENT).name == "lookup"
    assert messages_forced(tools, {"type": "auto"}, 0, FRAGMENT) is None
    rtools = [{"type": "web_search"}, {"type": "function", "name": "f", "parameters": WEATHER}]
    assert responses_forced(rtools, "required", 0, FRAGMENT).name == "f"
    assert responses_forced(rtools, "none", 0, FRAGMENT) is None
    assert responses_forced(rtools, {"type": "allowed_tools", "mode": "required",
                                     "tools": [{"type": "function", "name": "f"}]},
                            0, FRAGMENT).name == "f"

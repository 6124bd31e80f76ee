"""The hardening fuzz's generated inputs (tests/e2e/test_hardening_fuzz.py): JSON values
with the integers that break parsers, enormous prompts, each API's request objects with
junk in any field and unknown fields beside them, bodies mangled (not UTF-8, truncated, a
byte flipped, garbage), content types, header bytes, and the gRPC API's messages.

Knows what a bad input looks like, not what the lab answers to it: the tests judge that.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from inference_lab.v1 import engine_pb2 as pb

MODEL = "gpt-oss-20b"
MAX_MODEL_LEN = 131072
MAX_BATCHED = 8192  # max_num_batched_tokens of the embedded deployment: the max_num_seqs cap

# ---- HTTP -------------------------------------------------------------------------------------

SPECIAL_INTS = [-(2**63), -(2**31) - 1, -(2**31), -1, 0, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
                2**53 + 1, 2**63, 2**64, 10**12, 10**30, MAX_MODEL_LEN, MAX_MODEL_LEN + 1]
ints = st.sampled_from(SPECIAL_INTS) | st.integers(-3, 8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def sometimes_junk(good):
    return st.one_of(good, good, json_values)


# Enormous prompts, always beyond max_model_len (4 bytes a token): far over 131072 tokens
# but under the body limit, so the engine (not the size limit) refuses them.
enormous_text = st.sampled_from([4 * MAX_MODEL_LEN + 4, 700_000, 1_000_000]).map(lambda n: "x" * n)
enormous_ids = st.sampled_from([MAX_MODEL_LEN + 1, 200_000]).map(lambda n: [7] * n)
texts = st.text(max_size=40) | st.just("") | enormous_text

content = st.one_of(
    texts, st.none(), json_values,
    st.lists(st.fixed_dictionaries({"type": sometimes_junk(st.just("text"))},
                                   optional={"text": sometimes_junk(st.text(max_size=20))}),
             max_size=3),
)
message = st.fixed_dictionaries(
    {"role": sometimes_junk(st.sampled_from(["user", "system", "assistant"]))},
    optional={"content": content, "name": st.text(max_size=5)},
)
common_fields = {
    "stream": sometimes_junk(st.booleans()),
    "stream_options": sometimes_junk(st.fixed_dictionaries(
        {}, optional={"include_usage": sometimes_junk(st.booleans())})),
    "max_tokens": sometimes_junk(ints),
    "max_completion_tokens": sometimes_junk(ints),
    "n": sometimes_junk(st.just(1) | st.integers(1, 4) | ints | st.just(129)),
    "priority": sometimes_junk(ints),
    "temperature": json_values,  # accepted and ignored, like other OpenAI fields
}
model_name = st.one_of(st.just(MODEL), st.just(MODEL), st.text(max_size=12), json_values)
unknown_fields = st.dictionaries(st.sampled_from(["bogus", "x", "", "Model", "\u00e9"]),
                                 json_values, max_size=2)


def with_unknown(objects):
    return st.tuples(objects, unknown_fields).map(lambda pair: {**pair[1], **pair[0]})


chat_objects = with_unknown(st.fixed_dictionaries(
    {}, optional={"model": model_name, "messages": sometimes_junk(st.lists(message, max_size=3)),
                  **common_fields}))
completion_objects = with_unknown(st.fixed_dictionaries(
    {}, optional={"model": model_name,
                  "prompt": st.one_of(texts, enormous_ids, json_values,
                                      st.lists(st.integers(-5, 2**65), max_size=5),
                                      st.lists(st.text(max_size=5), max_size=3),
                                      st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=2)),
                  "echo": sometimes_junk(st.booleans()),
                  **common_fields}))
anthropic_block = st.fixed_dictionaries({"type": sometimes_junk(st.just("text"))},
                                        optional={"text": sometimes_junk(st.text(max_size=20))})
anthropic_message = st.fixed_dictionaries(
    {"role": sometimes_junk(st.sampled_from(["user", "assistant"]))},
    optional={"content": st.one_of(texts, json_values, st.lists(anthropic_block, max_size=3))},
)
messages_objects = with_unknown(st.fixed_dictionaries(
    {}, optional={"model": model_name,
                  "messages": sometimes_junk(st.lists(anthropic_message, max_size=3)),
                  "max_tokens": sometimes_junk(ints),
                  "system": sometimes_junk(texts | st.lists(anthropic_block, max_size=2)),
                  "stream": sometimes_junk(st.booleans()),
                  "temperature": json_values}))
response_item = st.fixed_dictionaries(
    {"role": sometimes_junk(st.sampled_from(["user", "assistant", "system", "developer"]))},
    optional={"content": st.one_of(texts, json_values, st.lists(st.fixed_dictionaries(
        {"type": sometimes_junk(st.sampled_from(["input_text", "output_text"]))},
        optional={"text": sometimes_junk(st.text(max_size=20))}), max_size=3)),
        "type": sometimes_junk(st.just("message"))},
)
responses_objects = with_unknown(st.fixed_dictionaries(
    {}, optional={"model": model_name,
                  "input": st.one_of(texts, json_values, st.lists(response_item, max_size=3)),
                  "instructions": sometimes_junk(texts),
                  "max_output_tokens": sometimes_junk(ints),
                  "stream": sometimes_junk(st.booleans()),
                  "store": json_values}))
capacity_objects = with_unknown(st.fixed_dictionaries(
    {}, optional={"model": st.one_of(st.just(MODEL), st.just(""), st.text(max_size=8), json_values),
                  "max_num_seqs": sometimes_junk(ints | st.integers(1, MAX_BATCHED + 1)),
                  "max_waiting": sometimes_junk(ints)}))


@st.composite
def bodies(draw, objects):
    """A JSON object, or one mangled: not UTF-8, truncated, a byte flipped, garbage."""
    how = draw(st.sampled_from(["json", "json", "json", "json", "utf16", "latin1", "truncated",
                                "flipped", "garbage", "empty", "array", "scalar"]))
    if how == "garbage":
        return draw(st.binary(max_size=64))
    if how == "empty":
        return b""
    obj = draw(objects)
    if how == "array":
        obj = [obj]
    elif how == "scalar":
        obj = draw(json_values)
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    if how == "utf16":
        return text.encode("utf-16")
    raw = text.encode("utf-8", "surrogatepass")
    if how == "latin1":
        return raw.replace(b'"', b'"\xe9', 1)
    if how == "truncated" and raw:
        return raw[:draw(st.integers(0, len(raw) - 1))]
    if how == "flipped" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        return raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
    return raw


content_types = st.one_of(
    st.just("application/json"), st.just("application/json"), st.just("application/json"),
    st.sampled_from([None, "application/json; charset=utf-8", "application/vnd.api+json",
                     "application/octet-stream", "text/plain", "text/json",
                     "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                     "application/xml", "text/html; charset=latin-1", "", "json", ";;",
                     "application/", "application/json/x", "*/*"]),
)
# What aiohttp's HTTP parser lets through to the application in a header value.
header_bytes = st.binary(max_size=48).map(
    lambda b: bytes(c for c in b if c in (9, 32) or 33 <= c <= 126 or c >= 128))


# ---- gRPC ------------------------------------------------------------------------------------

U32_SPECIAL = [0, 1, 2, 3, 8, 4096, MAX_MODEL_LEN - 1, MAX_MODEL_LEN, MAX_MODEL_LEN + 1,
               2**31, 2**32 - 1]
I64_SPECIAL = [-(2**63), -(2**31), -1, 0, 1, 2, 256, MAX_BATCHED, MAX_BATCHED + 1, 2**32 - 1,
               2**32, 2**63 - 1]
grpc_model = st.sampled_from(["", MODEL]) | st.text(max_size=12)

session_request = st.builds(
    pb.SubmitRequest, model=st.sampled_from(["", MODEL, "nope"]),
    prompt_tokens=st.sampled_from([0, 1, 16, MAX_MODEL_LEN, 2**32 - 1]),
    max_tokens=st.sampled_from([0, 1, 3, 8, MAX_MODEL_LEN, 2**32 - 1]))
session_action = st.one_of(
    st.builds(lambda tag, req: pb.SessionAction(open=pb.Open(tag=tag, request=req)),
              st.integers(0, 4) | st.just(2**64 - 1), session_request),
    st.builds(lambda tag: pb.SessionAction(cancel=pb.Cancel(tag=tag)),
              st.integers(0, 4) | st.just(2**64 - 1)),
)

"""Pure unit tests of the gateway: the error table, prompt lengths, bytes."""

from __future__ import annotations

import json
import uuid

import grpc
import pytest

from inference_lab.gateway.errors import (
    ERRORS,
    ErrorKind,
    GatewayError,
    envelope,
    from_rejected,
    sse_error_frame,
)
from inference_lab.common.tokenizer import ByteTokenizer
from inference_lab.gateway.protocols.base import Outcome, random_id
from inference_lab.gateway.protocols.openai import COMPLETIONS
from inference_lab.gateway.protocols.openai.render import Completion
from inference_lab.gateway.protocols.openai.schemas import (
    ChatMessage,
    ContentPart,
    chat_prompt,
    completion_prompt,
    decode_request,
)

TOK = ByteTokenizer()


def chat_tokens(messages):
    return len(chat_prompt(TOK, messages))


def prompt_tokens(prompt):
    return len(completion_prompt(TOK, prompt))


def text_tokens(text):
    return prompt_tokens(text)

SATURATED = (
    "Server is at capacity: 64 requests waiting (max_waiting = 64). "
    "Retry with reduced concurrency."
)


# ---- the error table ----------------------------------------------------------------------


def test_queue_saturated_maps_to_529_overloaded_with_the_reference_message():
    err = from_rejected(8, "QUEUE_SATURATED", SATURATED,
                        {"model": "m", "waiting": "64", "max_waiting": "64"})
    assert err.spec.status == 529
    assert json.loads(envelope(err)) == {
        "error": {"message": SATURATED, "type": "overloaded_error", "code": "queue_saturated"}
    }


def test_the_refusal_text_is_the_engines_never_rewritten():
    err = from_rejected(8, "QUEUE_SATURATED", "the engine's words", {"waiting": "7"})
    assert (err.kind, err.message) == (ErrorKind.QUEUE_SATURATED, "the engine's words")


@pytest.mark.parametrize(
    ("code", "reason", "status", "etype", "ecode"),
    [
        (3, "INVALID_REQUEST", 400, "invalid_request_error", "invalid_request"),
        (5, "MODEL_NOT_FOUND", 404, "invalid_request_error", "model_not_found"),
        (14, "SHUTTING_DOWN", 503, "server_error", "engine_unavailable"),
        (13, "BOOM", 500, "server_error", "internal_error"),
    ],
)
def test_each_rejection_code_maps_once(code, reason, status, etype, ecode):
    err = from_rejected(code, reason, "why", {})
    assert (err.spec.status, err.spec.type, err.spec.code) == (status, etype, ecode)


def test_invalid_request_keeps_the_engines_message():
    err = from_rejected(3, "INVALID_REQUEST", "prompt too long", {})
    assert err.message == "prompt too long"


def test_every_kind_has_a_distinct_status_and_code_pair():
    pairs = {(spec.status, spec.code) for spec in ERRORS.values()}
    assert len(pairs) == len(ERRORS)
    assert ERRORS[ErrorKind.BODY_TOO_LARGE].status == 413
    assert ERRORS[ErrorKind.UNAUTHORIZED].status == 401
    assert ERRORS[ErrorKind.QUEUE_SATURATED].grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED.name


def test_sse_error_frame_is_an_error_then_done():
    frame = sse_error_frame(GatewayError(ErrorKind.ENGINE_UNAVAILABLE, "gone"))
    first, second, rest = frame.split(b"\n\n")
    assert json.loads(first.removeprefix(b"data: "))["error"]["code"] == "engine_unavailable"
    assert second == b"data: [DONE]" and rest == b""


# ---- prompt lengths --------------------------------------------------------------------------


def test_text_tokens_are_utf8_bytes_over_four_rounded_up_at_least_one():
    assert text_tokens("") == 1
    assert text_tokens("abcd") == 1
    assert text_tokens("abcde") == 2
    assert text_tokens("é" * 3) == 2  # 6 bytes -> ceil(6/4) = 2


def test_chat_tokens_add_three_per_message_and_three_for_the_reply():
    messages = [ChatMessage("system", "abcd"), ChatMessage("user", "abcdefgh9")]
    # (3 + 1) + (3 + 3) + 3 = 13
    assert chat_tokens(messages) == 13


def test_chat_tokens_read_text_parts_and_empty_content():
    messages = [ChatMessage("user", [ContentPart("text", "abcd"), ContentPart("text", "efgh")]),
                ChatMessage("assistant", None)]
    # (3 + ceil(8/4)) + (3 + 0) + 3 = 11
    assert chat_tokens(messages) == 11


def test_completion_prompt_forms():
    assert prompt_tokens("abcdefgh") == 2
    assert prompt_tokens(["abcdefgh"]) == 2
    assert prompt_tokens([1, 2, 3]) == 3
    assert prompt_tokens([[1, 2, 3, 4]]) == 4


@pytest.mark.parametrize("prompt", [[], ["a", "b"], [1, "a"], [[1], [2]], [[]], [1, -1],
                                    [[2**32]]])
def test_batched_or_empty_prompts_are_refused(prompt):
    with pytest.raises(GatewayError) as info:
        prompt_tokens(prompt)
    assert info.value.spec.status == 400
    assert "$.prompt" in info.value.message


# ---- request decoding -------------------------------------------------------------------------


def test_decode_names_the_bad_field():
    with pytest.raises(GatewayError) as info:
        decode_request(b'{"model": "m", "messages": [], "max_tokens": 0}', chat=True)
    assert "$.messages" in info.value.message


def test_decode_rejects_zero_max_tokens_naming_it():
    with pytest.raises(GatewayError) as info:
        decode_request(b'{"model": "m", "messages": [{"role": "user", "content": "x"}], '
                       b'"max_tokens": 0}', chat=True)
    assert info.value.message == "Invalid request body: Expected `int` >= 1 - at `$.max_tokens`"
    # completions: 0 is the prompt only (echo's logprobs, as vLLM takes it), so echo it must
    with pytest.raises(GatewayError) as info:
        COMPLETIONS.parse(b'{"model": "m", "prompt": "x", "max_tokens": 0}', ByteTokenizer())
    assert info.value.message == ("max_tokens 0 needs echo: true (the prompt only, with its "
                                  "logprobs) - at `$.max_tokens`")
    with pytest.raises(GatewayError) as info:
        decode_request(b'{"model": "m", "prompt": "x", "max_tokens": -1}', chat=False)
    assert info.value.message == "Invalid request body: Expected `int` >= 0 - at `$.max_tokens`"


def test_decode_ignores_unknown_openai_fields():
    req = decode_request(b'{"model": "m", "prompt": "x", "temperature": 0.2, "top_p": 1}',
                         chat=False)
    assert req.model == "m"


def test_decode_refuses_n_out_of_range_and_bad_json():
    with pytest.raises(GatewayError, match=r"\$\.n"):
        decode_request(b'{"model": "m", "prompt": "x", "n": 129}', chat=False)
    with pytest.raises(GatewayError, match=r"\$\.n"):
        decode_request(b'{"model": "m", "prompt": "x", "n": 0}', chat=False)
    with pytest.raises(GatewayError, match="Invalid JSON"):
        decode_request(b"{nope", chat=False)


# ---- response bytes ---------------------------------------------------------------------------


def test_stream_templates_repeat_per_token_and_end_with_usage_then_done():
    c = Completion(chat=True, model="m", include_usage=True, cap=3)
    frames = (c.opening() + c.tokens(0, 3) + c.closing(Outcome(5, [3]))).split(b"\n\n")
    assert frames[-1] == b""
    payloads = [f.removeprefix(b"data: ") for f in frames[:-1]]
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [ch["choices"][0]["delta"]["content"] for ch in chunks[1:4]] == [" token"] * 3
    assert chunks[4]["choices"][0]["finish_reason"] == "length"
    assert chunks[5]["choices"] == []
    assert chunks[5]["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                                  "prompt_tokens_details": {"cached_tokens": 0}}


def test_non_stream_body_has_exactly_the_token_count():
    body = json.loads(Completion(chat=False, model="m").body(Outcome(4, [6])))
    assert body["choices"][0]["text"] == " token" * 6
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert body["object"] == "text_completion"


def test_n_choices_stream_by_index_and_usage_counts_them_all():
    c = Completion(chat=False, model="m", include_usage=True, n=2, echo="Hi", cap=2)
    data = c.opening() + c.tokens(1, 2) + c.tokens(0, 1) + c.closing(Outcome(3, [1, 2]))
    chunks = [json.loads(p.removeprefix(b"data: ")) for p in data.split(b"\n\n")[:-2]]
    texts = [(ch["choices"][0]["index"], ch["choices"][0]["text"]) for ch in chunks[:-1]]
    assert texts[:5] == [(0, "Hi"), (1, "Hi"), (1, " token"), (1, " token"), (0, " token")]
    # choice 1 reached the cap of 2, choice 0 ended at 1 (the engine's choice)
    assert [ch["choices"][0]["finish_reason"] for ch in chunks[5:7]] == ["stop", "length"]
    usage = chunks[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (3, 3, 6)
    body = json.loads(c.body(Outcome(3, [2, 2])))
    assert [ch["text"] for ch in body["choices"]] == ["Hi token token"] * 2


def test_the_gateways_own_series_are_prometheus_clients_text_with_the_numbers_filled_in():
    from inference_lab.common.exposition import render  # prometheus_client's generate_latest
    from inference_lab.gateway.metrics import GatewayMetrics

    metrics = GatewayMetrics({"a": 1, "b": 2})
    metrics.observe("/v1/chat/completions", 200, 0.02)
    first = metrics.exposition()
    for seconds in (0.003, 7.0):
        metrics.observe("/metrics", 200, seconds)  # a new route: its lines are rendered anew
    metrics.observe("/v1/chat/completions", 529, 0.001)
    metrics.engine_up = 1
    own = metrics.exposition().split(b"# HELP process_", 1)[0]
    assert own == render(metrics.families())
    assert b'inference_lab_gateway_http_request_duration_seconds_count{route="/metrics"} 2.0' in own
    assert b'inference_lab_gateway_http_request_duration_seconds_bucket{le="5.0",route="/metrics"} 1.0' in own
    assert b"inference_lab_gateway_inflight_requests 2.0" in own
    assert b"inference_lab_gateway_engine_metrics_up 1.0" in own
    assert b"inference_lab_gateway_engine_metrics_up 0.0" in first
    assert b"process_" in metrics.exposition() or b"python_info" in metrics.exposition()


def test_the_process_series_are_one_render_shared_by_every_port_until_it_is_too_old():
    import gc
    import re

    from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR
    from prometheus_client import CollectorRegistry, generate_latest

    from inference_lab.gateway.metrics import PROCESS, GatewayMetrics, ProcessText

    assert GatewayMetrics({}).process is GatewayMetrics({}).process is PROCESS
    registry = CollectorRegistry(auto_describe=False)
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    text = ProcessText(max_age=3600.0)
    first = text.text()
    names = re.compile(rb"^# TYPE (\S+)", re.M)
    assert names.findall(first) == names.findall(generate_latest(registry))
    assert b"process_open_fds" in first and b"python_gc_collections_total" in first
    gc.collect()  # the generation-2 count moves
    assert text.text() is first  # younger than max_age: the same render
    text.max_age = 0.0
    again = text.text()
    gen2 = re.compile(rb'^python_gc_collections_total\{generation="2"\} (\S+)$', re.M)
    assert float(gen2.search(again).group(1)) > float(gen2.search(first).group(1))


async def test_a_batchs_relay_writes_a_chunk_per_loop_iteration_so_other_work_goes_between():
    import asyncio

    from inference_lab.gateway import streams as relay

    order: list = []

    class Stream:  # the dispatcher's side of a RequestStream: relay writes its tokens
        def __init__(self, i: int) -> None:
            self.i = i

        def relay(self) -> None:
            order.append(self.i)

    chunk = relay.RELAY_CHUNK
    streams = [Stream(i) for i in range(2 * chunk + 5)]
    loop = asyncio.get_running_loop()
    loop.call_soon(relay.relay_all, streams)
    loop.call_soon(order.append, "other")  # e.g. a scrape's handler, ready meanwhile
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert order[:chunk + 1] == [*range(chunk), "other"]
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == [*range(chunk), "other", *range(chunk, 2 * chunk + 5)]


def test_random_ids_are_uuid4_hex_like_uuid4_hex():
    ids = {random_id() for _ in range(2000)}
    assert len(ids) == 2000
    for rid in ids:
        parsed = uuid.UUID(hex=rid)
        assert len(rid) == 32 and parsed.hex == rid
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


async def test_the_lane_acknowledges_only_once_every_overlapping_relay_is_written():
    """Two batches whose relays overlap (each over RELAY_CHUNK streams): the engine's
    window moves only after the last write of both, not when the first relay ends."""
    import asyncio

    from inference_lab.gateway.streams import RELAY_CHUNK
    from inference_lab.gateway.transport.lane import LaneSession
    from inference_lab.v1 import engine_pb2 as pb

    written: list[int] = []
    acks: list[int] = []  # relays written at each acknowledgement

    class Link:  # the lane connection's side the Session uses
        def start(self, deliver, on_lost) -> None:
            self.deliver = deliver

        def ack_due(self) -> bool:
            return True

        def acknowledge_read(self) -> None:
            acks.append(len(written))

        def close(self) -> None:
            pass

    class Stream:  # a RequestStream with a writer, past its first token
        writer = object()
        total = 1
        replica = 0

        def __init__(self, tag: int) -> None:
            self.tag = tag

        def relay(self) -> None:
            written.append(self.tag)

    link = Link()
    session = LaneSession(link, lambda s: None)
    n = RELAY_CHUNK + 4
    for tag in range(2 * n):
        session.routes[tag] = Stream(tag)
    for first in (0, n):  # two batches read before the loop runs the first relay
        tags = list(range(first, first + n))
        batch = pb.ProgressBatch(token_tags=tags, token_totals=[2] * n)
        link.deliver(batch.SerializeToString())
    for _ in range(6):
        await asyncio.sleep(0)
    assert sorted(written) == list(range(2 * n))
    assert acks == [2 * n]
    session.routes.clear()
    session.close("test over", shutdown=True)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL,
                                  grpc.StatusCode.DATA_LOSS])
def test_an_engine_failure_outside_the_table_is_a_500_without_its_text(code):
    from grpc.aio import AioRpcError, Metadata

    from inference_lab.gateway.errors import from_grpc_error

    exc = AioRpcError(code, Metadata(), Metadata(),
                      details="Unexpected <class 'LoraError'>: secret internals")
    err = from_grpc_error(exc)
    assert err.kind is ErrorKind.INTERNAL and err.spec.status == 500
    assert "LoraError" not in err.message and "internals" not in err.message


def test_the_stored_responses_cap_counts_what_is_stored_tools_included():
    """The cap counts the stored JSON itself, not the conversation text alone: 30
    responses each echoing 180 KB of tools would otherwise pass a cap of a few MB."""
    from inference_lab.gateway.protocols.responses import ResponseStore

    tools = [{"type": "function", "name": f"f{i}", "description": "x" * 1000,
              "parameters": {"type": "object", "properties": {}}} for i in range(180)]
    store = ResponseStore(1 << 20)  # 1 MiB
    for i in range(30):
        store.put(f"resp_{i}", [("user", "hi"), ("assistant", " token")],
                  {"id": f"resp_{i}", "tools": tools, "instructions": "be brief"})
    held = [i for i in range(30) if store.response(f"resp_{i}") is not None]
    assert held == list(range(25, 30))  # five of ~185 KB fit in 1 MiB: the newest
    assert json.loads(store.response("resp_29"))["tools"] == tools  # as GET answers it
    assert store.get("resp_29") == [("user", "hi"), ("assistant", " token")]
    assert store.delete("resp_29") and not store.delete("resp_29")
    assert store.response("resp_29") is None


@pytest.mark.parametrize("prompts, n, ok", [(1024, 1, True), (8, 128, True), (1, 128, True),
                                            (1024, 2, False), (9, 128, False),
                                            (1024, 128, False)])
def test_a_request_asks_for_at_most_1024_sequences_prompts_times_n(prompts, n, ok):
    """vLLM bounds each factor alone: 1,024 prompts x n = 128 would be 131,072 sequences."""
    body = json.dumps({"model": "m", "prompt": [[1, 2]] * prompts, "n": n,
                       "max_tokens": 1}).encode()
    if ok:
        COMPLETIONS.parse(body, ByteTokenizer())
    else:
        with pytest.raises(GatewayError) as info:
            COMPLETIONS.parse(body, ByteTokenizer())
        assert info.value.spec.status == 400 and "at most 1024" in info.value.message

"""Bad input, property-based: every HTTP endpoint and every RPC, fed generated garbage.

Against the real engine and real gateways in this process (served from a background loop
over real sockets): malformed JSON, wrong types, missing and unknown fields, negative, zero
and huge numbers, empty and enormous prompts, prompts beyond max_model_len, non-UTF-8
bodies, wrong content types, bodies over the limit, and bad Authorization headers. Every
answer is a success or a 4xx carrying the error envelope {"error": {"message", "type",
"code"}} (gRPC: INVALID_ARGUMENT or NOT_FOUND with a message), never a 5xx or a stack
trace, and after each test /health is 200, a normal request is served and nothing is left
waiting or running. The number of generated inputs tried is printed at the end.
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
import urllib.parse

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hardening_helpers import (
    ThreadedLab,
    assert_anthropic_envelope,
    assert_error_envelope,
    content_tokens,
    http,
    named_events,
    sse_frames,
)
from hardening_inputs import (
    I64_SPECIAL,
    MAX_BATCHED,
    MAX_MODEL_LEN,
    MODEL,
    U32_SPECIAL,
    bodies,
    capacity_objects,
    chat_objects,
    completion_objects,
    content_types,
    grpc_model,
    header_bytes,
    messages_objects,
    responses_objects,
    session_action,
)
from inference_lab.testing.poll import wait_until
from inference_lab.engine.sim.lengths import OutputLength
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.v1 import engine_pb2_grpc

BODY_LIMIT = 1 << 20  # the gateway's default
API_KEY, CONTROL_TOKEN = "sk-fuzz-0123456789", "ct-fuzz-9876543210"
TRIED: collections.Counter[str] = collections.Counter()

_BASE = settings(deadline=None, database=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much, HealthCheck.large_base_example])


def fuzz(max_examples: int) -> settings:
    return settings(_BASE, max_examples=max_examples)


# ---- the lab ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab(request):
    lab = ThreadedLab({
        "open": {},
        "locked": {"api_key": API_KEY, "control_token": CONTROL_TOKEN},
    }, engine_kwargs={"lengths": OutputLength(4)})
    try:
        lab.start()
        with grpc.insecure_channel(f"127.0.0.1:{lab.engine.port}") as channel:
            lab.channel = channel
            lab.stub = engine_pb2_grpc.EngineStub(channel)
            yield lab
    finally:
        lab.stop()
        report_tried(request.config)


def report_tried(config) -> None:
    """Print the number of generated inputs tried, past pytest's output capture."""
    if not TRIED:
        return
    lines = [f"hardening fuzz: {sum(TRIED.values())} generated inputs tried"]
    lines += [f"  {count:6d}  {name}" for name, count in sorted(TRIED.items())]
    capture = config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print("\n" + "\n".join(lines), flush=True)


@pytest.fixture(autouse=True)
def still_serving(lab):
    """After every test: healthy, a normal request is served, nothing left in the engine,
    and capacity is back at its defaults."""
    yield
    port = lab.ports["open"]
    status, _, body = http(port, "GET", "/health")
    assert status == 200, body
    status, _, body = http(port, "POST", "/v1/chat/completions", json.dumps({
        "model": MODEL, "messages": [{"role": "user", "content": "still there?"}],
        "max_tokens": 3}).encode(), {"Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3, body

    def idle():
        cap = lab.stub.GetCapacity(pb.GetCapacityRequest(), timeout=5).models[0]
        return (cap.waiting, cap.running, cap.max_num_seqs, cap.max_waiting) == (0, 0, 256, 0)

    wait_until(idle, timeout=10)


def restore_capacity(lab) -> None:
    lab.stub.SetCapacity(pb.SetCapacityRequest(max_num_seqs=256, max_waiting=0), timeout=5)


def headers_for(ctype: str | None) -> dict:
    return {} if ctype is None else {"Content-Type": ctype}


# ---- HTTP: generation -------------------------------------------------------------------------


def _echo(body: bytes) -> bool:
    try:
        doc = json.loads(body)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("echo") is True


def check_generation(status: int, headers: dict, data: bytes, echo: bool = False) -> None:
    """200 with a well-formed response (stream or not; n choices), or a 4xx envelope."""
    if status != 200:
        assert_error_envelope(status, headers, data, allowed=(400, 404, 413, 415))
        return
    if headers.get("content-type", "").startswith("text/event-stream"):
        frames = sse_frames(data)
        assert frames[-1] == b"[DONE]" and b'"error"' not in data, data[-300:]
        usage = [json.loads(f)["usage"] for f in frames[:-1] if json.loads(f).get("usage")]
        if usage:
            assert usage[-1]["completion_tokens"] == content_tokens(frames, echo)
        assert content_tokens(frames, echo) >= 1
    else:
        doc = json.loads(data)
        choices = doc["choices"]
        assert [c["index"] for c in choices] == list(range(len(choices)))
        each, rest = divmod(doc["usage"]["completion_tokens"], len(choices))
        assert rest == 0 and each >= 1  # every choice has the same length
        for choice in choices:
            text = choice["message"]["content"] if "message" in choice else choice["text"]
            assert text.endswith(" token" * each) and (echo or text == " token" * each)


@fuzz(550)
@given(body=bodies(chat_objects), ctype=content_types)
@example(body=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 600_000}]}).encode(),
         ctype="application/json")
@example(body=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                          "max_tokens": 10**12}).encode(), ctype="application/json")
@example(body=json.dumps({"model": MODEL, "messages": []}).encode(), ctype="application/json")
@example(body=b'{"model": "gpt-oss-20b", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
         ctype="application/json")
@example(body=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                          "max_tokens": 2}).encode(), ctype="text/plain")
def test_chat_completions_answers_any_body_with_200_or_a_4xx_envelope(lab, body, ctype):
    TRIED["HTTP POST /v1/chat/completions"] += 1
    check_generation(*http(lab.ports["open"], "POST", "/v1/chat/completions", body,
                           headers_for(ctype)))


@fuzz(450)
@given(body=bodies(completion_objects), ctype=content_types)
@example(body=json.dumps({"model": MODEL, "prompt": [1] * (MAX_MODEL_LEN + 1)}).encode(),
         ctype="application/json")
@example(body=json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2**32 - 1}).encode(),
         ctype="application/json")
@example(body=json.dumps({"model": MODEL, "prompt": ""}).encode(), ctype=None)
@example(body=json.dumps({"model": MODEL, "prompt": []}).encode(), ctype="application/json")
def test_completions_answers_any_body_with_200_or_a_4xx_envelope(lab, body, ctype):
    TRIED["HTTP POST /v1/completions"] += 1
    check_generation(*http(lab.ports["open"], "POST", "/v1/completions", body,
                           headers_for(ctype)), echo=_echo(body))


def check_message(status: int, headers: dict, data: bytes) -> None:
    """Anthropic Messages: 200 with a message or its full event stream, or a 4xx in
    Anthropic's envelope."""
    if status != 200:
        assert_anthropic_envelope(status, headers, data, allowed=(400, 404, 413, 415))
        return
    if headers.get("content-type", "").startswith("text/event-stream"):
        events = named_events(data)
        names = [name for name, _ in events]
        assert names[:3] == ["message_start", "content_block_start", "ping"], names
        assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
        deltas = names.count("content_block_delta")
        assert deltas >= 1 and events[-2][1]["usage"]["output_tokens"] == deltas
    else:
        doc = json.loads(data)
        assert doc["type"] == "message"
        assert doc["content"][0]["text"].count(" token") == doc["usage"]["output_tokens"] >= 1


def check_response(status: int, headers: dict, data: bytes) -> None:
    """OpenAI Responses: 200 with a response or its typed stream, or a 4xx envelope."""
    if status != 200:
        assert_error_envelope(status, headers, data, allowed=(400, 404, 413, 415))
        return
    if headers.get("content-type", "").startswith("text/event-stream"):
        events = named_events(data)
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        assert events[-1][0] in ("response.completed", "response.incomplete"), events[-1][0]
        deltas = sum(1 for name, _ in events if name == "response.output_text.delta")
        assert deltas >= 1 and events[-1][1]["response"]["usage"]["output_tokens"] == deltas
    else:
        doc = json.loads(data)
        text = doc["output"][0]["content"][0]["text"]
        assert text.count(" token") == doc["usage"]["output_tokens"] >= 1


@fuzz(300)
@given(body=bodies(messages_objects), ctype=content_types)
@example(body=json.dumps({"model": MODEL, "max_tokens": 3, "stream": True,
                          "messages": [{"role": "user", "content": "hi"}]}).encode(),
         ctype="application/json")
@example(body=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode(),
         ctype="application/json")
@example(body=json.dumps({"model": MODEL, "max_tokens": 3, "system": "x" * 600_000,
                          "messages": [{"role": "user", "content": "hi"}]}).encode(),
         ctype="application/json")
def test_messages_answers_any_body_with_200_or_a_4xx_anthropic_envelope(lab, body, ctype):
    TRIED["HTTP POST /v1/messages"] += 1
    check_message(*http(lab.ports["open"], "POST", "/v1/messages", body, headers_for(ctype)))


@fuzz(300)
@given(body=bodies(responses_objects), ctype=content_types)
@example(body=json.dumps({"model": MODEL, "input": "hi", "stream": True}).encode(),
         ctype="application/json")
@example(body=json.dumps({"model": MODEL, "input": []}).encode(), ctype="application/json")
@example(body=json.dumps({"model": MODEL, "input": "hi", "max_output_tokens": 2**31}).encode(),
         ctype="application/json")
def test_responses_answers_any_body_with_200_or_a_4xx_envelope(lab, body, ctype):
    TRIED["HTTP POST /v1/responses"] += 1
    check_response(*http(lab.ports["open"], "POST", "/v1/responses", body, headers_for(ctype)))


@fuzz(6)
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/control/capacity",
                             "/v1/messages", "/v1/responses"]),
       size=st.integers(BODY_LIMIT + 1, 2 * BODY_LIMIT), chunked=st.booleans())
def test_bodies_over_the_limit_are_413_with_or_without_a_content_length(lab, path, size, chunked):
    TRIED["HTTP POST over the body limit"] += 1
    body = b'{"model": "' + b"x" * size + b'"}'
    status, headers, data = http(lab.ports["open"], "POST", path, body,
                                 {"Content-Type": "application/json"}, chunked=chunked)
    if path == "/v1/messages":
        assert assert_anthropic_envelope(status, headers, data, allowed=(413,))["type"] == \
            "request_too_large"
    else:
        assert assert_error_envelope(status, headers, data, allowed=(413,))["code"] == \
            "request_too_large"


@pytest.mark.parametrize("ctype, status", [
    (None, 200), ("application/json", 200), ("application/json; charset=utf-8", 200),
    ("application/vnd.api+json", 200), ("application/octet-stream", 200),
    ("application/x-www-form-urlencoded", 200),  # what `curl -d` sends by default
    ("text/plain", 415), ("text/json", 415), ("multipart/form-data; boundary=x", 415),
    ("application/xml", 415), ("", 415), (";;", 415), ("application/json/x", 415),
])
def test_json_or_unlabelled_bodies_are_read_and_other_content_types_are_415(lab, ctype, status):
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()
    got, headers, data = http(lab.ports["open"], "POST", "/v1/completions", body, headers_for(ctype))
    assert got == status, data
    if status == 415:
        err = assert_error_envelope(got, headers, data)
        assert err["code"] == "unsupported_media_type" and "application/json" in err["message"]


# ---- HTTP: capacity, reads, methods, routes ---------------------------------------------------


@fuzz(350)
@given(body=bodies(capacity_objects), ctype=content_types)
@example(body=b'{"max_waiting": 1099511627776}', ctype="application/json")
@example(body=b'{"max_num_seqs": 18446744073709551616}', ctype="application/json")
def test_post_capacity_answers_any_body_with_200_or_a_4xx_envelope(lab, body, ctype):
    TRIED["HTTP POST /control/capacity"] += 1
    status, headers, data = http(lab.ports["open"], "POST", "/control/capacity", body,
                                 headers_for(ctype))
    if status == 200:
        rows = json.loads(data)
        restore_capacity(lab)
        assert [r["model"] for r in rows] == [MODEL]
    else:
        assert_error_envelope(status, headers, data, allowed=(400, 404, 413, 415))


@fuzz(300)
@given(path=st.sampled_from(["/v1/models", "/health", "/metrics", "/control/capacity",
                             "/v1/chat/completions", "/v1/completions", "/v1/nope", "/",
                             "/v1/messages", "/v1/responses", "/v1/messages/count_tokens",
                             "/control", "/control/capacity/x", "/v1//models", "/%ff"]),
       method=st.sampled_from(["GET", "GET", "GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
       query=st.one_of(st.just(""), st.dictionaries(st.sampled_from(["model", "x", ""]),
                                                    st.text(max_size=10), max_size=2)
                       .map(urllib.parse.urlencode), st.just("model=%ff%zz&&=")),
       body=st.none() | st.binary(max_size=32))
def test_every_route_and_method_answers_with_success_or_a_4xx_envelope(lab, path, method, query,
                                                                        body):
    TRIED["HTTP any method, any route"] += 1
    target = path + ("?" + query if query else "")
    status, headers, data = http(lab.ports["open"], method, target, body,
                                 {"Content-Type": "application/json"} if body is not None else {})
    if status == 302:  # the dashboard's front door (docs/dashboard.md)
        assert (method, path, headers.get("location")) == ("GET", "/", "/dashboard")
    elif status == 200:
        assert method == "GET" or (method == "POST" and path == "/control/capacity")
        if method == "POST":
            restore_capacity(lab)
        if path != "/metrics":
            json.loads(data)
    elif path.startswith("/v1/messages"):
        assert_anthropic_envelope(status, headers, data, allowed=(400, 404, 405, 413, 415))
    else:
        assert_error_envelope(status, headers, data, allowed=(400, 404, 405, 413, 415))


@fuzz(200)
@given(auth=st.one_of(header_bytes, header_bytes.map(lambda b: b"Bearer " + b),
                      st.sampled_from([None, b"", b"Bearer", b"Bearer ", b"Basic " + API_KEY.encode(),
                                       b"Bearer " + API_KEY.encode() + b"x",
                                       b"Bearer " + API_KEY[:-1].encode(),
                                       b"Bearer " + CONTROL_TOKEN.encode(),
                                       b"Bearer  " + API_KEY.encode()])),
       path=st.sampled_from(["/v1/models", "/v1/completions", "/control/capacity",
                             "/v1/messages"]),
       x_api_key=st.booleans())
def test_a_wrong_or_missing_secret_is_401_with_the_envelope(lab, auth, path, x_api_key):
    TRIED["HTTP bad Authorization"] += 1
    if x_api_key and not path.startswith("/control") and auth is not None:
        headers = {"x-api-key": auth}  # Anthropic's header, on every /v1 route
        auth = b"Bearer " + auth
    else:
        headers = {} if auth is None else {"Authorization": auth}
    status, resp_headers, data = http(lab.ports["locked"], "GET", path, None, headers)
    secret = CONTROL_TOKEN if path.startswith("/control") else API_KEY
    scheme, _, credentials = (auth or b"").partition(b" ")
    if scheme.lower() == b"bearer" and credentials == secret.encode():  # generated right
        assert status in (200, 405)
        return
    if path == "/v1/messages":
        err = assert_anthropic_envelope(status, resp_headers, data, allowed=(401,))
        assert err["type"] == "authentication_error"
        return
    err = assert_error_envelope(status, resp_headers, data, allowed=(401,))
    assert err["type"] == "authentication_error" and resp_headers["www-authenticate"] == "Bearer"
    assert err["code"] == ("invalid_control_token" if path.startswith("/control") else "invalid_api_key")


def test_the_right_secrets_open_their_routes_only(lab):
    port = lab.ports["locked"]
    api = {"Authorization": f"Bearer {API_KEY}"}
    control = {"Authorization": f"bearer {CONTROL_TOKEN}"}  # the scheme is case-insensitive
    assert http(port, "GET", "/v1/models", None, api)[0] == 200
    assert http(port, "GET", "/control/capacity", None, control)[0] == 200
    assert http(port, "GET", "/control/capacity", None, api)[0] == 401
    assert http(port, "GET", "/v1/models", None, control)[0] == 401
    assert http(port, "GET", "/health")[0] == 200 and http(port, "GET", "/metrics")[0] == 200


# ---- gRPC ------------------------------------------------------------------------------------

REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)


def expected_submit(model: str, prompt: int, max_tokens: int, n: int = 1) -> grpc.StatusCode:
    if model not in ("", MODEL):
        return grpc.StatusCode.NOT_FOUND
    if prompt < 1 or max_tokens < 1 or prompt + max_tokens > MAX_MODEL_LEN or n > 256:
        return grpc.StatusCode.INVALID_ARGUMENT  # (256: max_num_seqs)
    return grpc.StatusCode.OK


@fuzz(350)
@given(model=grpc_model, prompt=st.sampled_from([0, 1, 2, 16, 4096, MAX_MODEL_LEN,
                                                  MAX_MODEL_LEN + 1, 2**31, 2**32 - 1]),
       max_tokens=st.sampled_from(U32_SPECIAL), priority=st.integers(-(2**31), 2**31 - 1),
       request_id=st.text(max_size=20), n=st.sampled_from([0, 1, 1, 2, 3, 257, 2**32 - 1]))
def test_submit_admits_exactly_the_valid_requests_and_refuses_the_rest_with_a_message(
        lab, model, prompt, max_tokens, priority, request_id, n):
    TRIED["gRPC Submit"] += 1
    call = lab.stub.Submit(pb.SubmitRequest(model=model, prompt_tokens=prompt, max_tokens=max_tokens,
                                            priority=priority, request_id=request_id, n=n),
                           timeout=20)
    expected = expected_submit(model, prompt, max_tokens, n)
    try:
        first = next(call)
    except grpc.RpcError as err:
        assert err.code() is expected and err.code() in REFUSALS and err.details()
        return
    assert expected is grpc.StatusCode.OK and first.HasField("admitted")
    if max_tokens > 8:
        call.cancel()  # admitted is what is under test; do not wait for thousands of tokens
        return
    events = list(call)
    finished = [e.finished for e in events if e.HasField("finished")]
    assert sorted(f.index for f in finished) == list(range(max(n, 1)))
    assert all(f.completion_tokens == max_tokens for f in finished)
    assert sum(e.tokens.new_tokens for e in events if e.HasField("tokens")) == max_tokens * max(n, 1)


@fuzz(250)
@given(model=st.none() | grpc_model, seqs=st.none() | st.sampled_from(I64_SPECIAL),
       waiting=st.none() | st.sampled_from(I64_SPECIAL))
def test_set_capacity_changes_exactly_the_valid_settings_and_never_poisons_the_state(
        lab, model, seqs, waiting):
    TRIED["gRPC SetCapacity"] += 1
    fields = {k: v for k, v in (("model", model), ("max_num_seqs", seqs), ("max_waiting", waiting))
              if v is not None}
    if seqs is None and waiting is None:
        expected = grpc.StatusCode.INVALID_ARGUMENT
    elif model not in (None, "", MODEL):
        expected = grpc.StatusCode.NOT_FOUND
    elif (seqs is not None and not 1 <= seqs <= MAX_BATCHED) or \
            (waiting is not None and not 0 <= waiting <= 2**32 - 1):
        expected = grpc.StatusCode.INVALID_ARGUMENT
    else:
        expected = grpc.StatusCode.OK
    try:
        reply = lab.stub.SetCapacity(pb.SetCapacityRequest(**fields), timeout=5)
    except grpc.RpcError as err:
        assert err.code() is expected and err.code() in REFUSALS and err.details()
    else:
        assert expected is grpc.StatusCode.OK
        assert reply.models[0].max_num_seqs == (seqs if seqs is not None else 256)
        restore_capacity(lab)
    lab.stub.GetCapacity(pb.GetCapacityRequest(), timeout=5)  # still answers


@fuzz(60)
@given(model=grpc_model)
def test_get_capacity_knows_the_served_model_and_refuses_others_with_not_found(lab, model):
    TRIED["gRPC GetCapacity"] += 1
    try:
        reply = lab.stub.GetCapacity(pb.GetCapacityRequest(model=model), timeout=5)
    except grpc.RpcError as err:
        assert model not in ("", MODEL) and err.code() is grpc.StatusCode.NOT_FOUND and err.details()
    else:
        assert model in ("", MODEL) and [m.model for m in reply.models] == [MODEL]


RAW_METHODS = {"GetCapacity": "unary", "SetCapacity": "unary", "ListModels": "unary",
               "Submit": "server_stream", "Session": "bidi"}


@fuzz(450)
@given(method=st.sampled_from(sorted(RAW_METHODS)),
       raw=st.binary(max_size=48) | st.sampled_from([b"\xff\xff\xff", b"\x0a\x02\xff\xfe",
                                                     b"\x10", b"\x12\x05abc"]))
def test_any_bytes_on_any_rpc_get_an_answer_or_invalid_argument_never_unknown(lab, method, raw):
    TRIED["gRPC raw bytes, any RPC"] += 1
    path = f"/inference_lab.v1.Engine/{method}"
    kind = RAW_METHODS[method]
    try:
        if kind == "unary":
            lab.channel.unary_unary(path)(raw, timeout=5)
            if method == "SetCapacity":
                restore_capacity(lab)
        elif kind == "server_stream":
            call = lab.channel.unary_stream(path)(raw, timeout=10)
            next(call, None)  # admitted (then cancelled) or a refusal
            call.cancel()
        else:
            call = lab.channel.stream_stream(path)(iter([raw]), timeout=10)
            for batch in call:  # until the session ends, or stop at the first admission
                if any(e.HasField("admitted") for e in pb.ProgressBatch.FromString(batch).events):
                    call.cancel()
                    break
    except grpc.RpcError as err:
        assert err.code() in REFUSALS + (grpc.StatusCode.CANCELLED,), (err.code(), err.details())
        assert err.details()
        if err.code() is not grpc.StatusCode.CANCELLED:
            assert "Traceback" not in err.details() and "<class" not in err.details()


@fuzz(150)
@given(actions=st.lists(session_action, max_size=8), per_message=st.integers(1, 3),
       garbage=st.booleans())
def test_a_session_answers_every_open_once_and_a_malformed_action_ends_it_with_invalid_argument(
        lab, actions, per_message, garbage):
    TRIED["gRPC Session Open/Cancel"] += 1
    messages = [pb.SessionActions(actions=actions[i:i + per_message]).SerializeToString()
                for i in range(0, len(actions), per_message)]
    messages += [b"\xff\xff\xff"] if garbage else []
    call = lab.channel.stream_stream("/inference_lab.v1.Engine/Session")(iter(messages), timeout=20)
    finals: collections.Counter[int] = collections.Counter()
    try:
        for raw in call:
            for event in pb.ProgressBatch.FromString(raw).events:
                kind = event.WhichOneof("event")
                if kind == "rejected":
                    r = event.rejected
                    assert r.code in (3, 5) and r.message and r.reason in ("INVALID_REQUEST",
                                                                            "MODEL_NOT_FOUND")
                    finals[event.tag] += 1
                elif kind == "finished":
                    finals[event.tag] += 1
    except grpc.RpcError as err:
        assert garbage and err.code() is grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
        assert "malformed" in err.details()
        return
    assert not garbage
    opened = collections.Counter(a.open.tag for a in actions if a.HasField("open"))
    assert finals == opened  # every Open answered once: admitted and finished, or rejected


def test_a_burst_of_refused_requests_leaves_nothing_in_the_engine(lab):
    """Bad input must not leak work: 200 refusals in a row, then nothing waits or runs."""
    port = lab.ports["open"]
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2**31 - 1}).encode()
    started = time.monotonic()
    for _ in range(200):
        status, headers, data = http(port, "POST", "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        assert_error_envelope(status, headers, data, allowed=(400,))
    assert time.monotonic() - started < 20
    cap = lab.stub.GetCapacity(pb.GetCapacityRequest(), timeout=5).models[0]
    assert (cap.waiting, cap.running) == (0, 0)

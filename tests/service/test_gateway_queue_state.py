"""The gateway refuses on the engine's announced queue state, without a round trip, and
forwards again as soon as the queue may have room (announcement, own capacity change, own
cancel). A narrow test against the fake engine: which Opens reach the engine is the point.
The 529 the edge writes on a kept-alive connection (gateway.edge FAST_POSTS) is the
handler's, byte for byte and count for count; everything else on it is aiohttp's."""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
import re
import time
import uuid
from contextlib import asynccontextmanager

import pytest

from hardening_helpers import exchange as raw_exchange
from hardening_helpers import record_reads
from inference_lab.gateway import generation as gateway_app
from inference_lab.gateway import create_app
from inference_lab.gateway.app import STATE
from inference_lab.gateway.errors import Saturation
from inference_lab.gateway.server import start_gateway
from inference_lab.testing.fake_engine import FAKE_MODEL, saturated_state
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.testing.poll import until

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
FULL = saturated_state(FAKE_MODEL, waiting=7, max_waiting=7)
FREE = pb.QueueState(model=FAKE_MODEL, saturated=False)


def saturated(client) -> dict:
    session = client.server.app[STATE].engine._session
    return session.saturated if session is not None else {}


async def announce(client, fake, state: pb.QueueState) -> None:
    fake.announce(state)
    if state.saturated:
        await until(lambda: saturated(client).get(FAKE_MODEL) == state)
    else:
        await until(lambda: FAKE_MODEL not in saturated(client))


async def test_a_saturated_model_is_refused_at_the_gateway_and_counted_by_the_engine(client, fake):
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200  # session up
    await announce(client, fake, FULL)
    for stream in (False, True, False, True, False):
        resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert resp.status == 529
        assert resp.content_type == "application/json"
        assert (await resp.json())["error"] == {
            "message": "Server is at capacity: 7 requests waiting (max_waiting = 7). "
                       "Retry with reduced concurrency.",
            "type": "overloaded_error", "code": "queue_saturated"}
    assert len(fake.opened.items) == 1  # none of the five reached the engine
    await fake.refused.wait(1)
    await until(lambda: sum(r.count for r in fake.refused.items) >= 5)
    assert sum(r.count for r in fake.refused.items) == 5
    assert {r.model for r in fake.refused.items} == {FAKE_MODEL}
    # bad input is still a 400 first, also one only the engine can judge (too long)
    assert (await client.post("/v1/chat/completions", json={"model": FAKE_MODEL})).status == 400
    too_long = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5000})
    assert too_long.status == 400 and "max_model_len" in (await too_long.json())["error"]["message"]
    assert len(fake.opened.items) == 2  # that one went to the engine, which refused it
    # 16 + 2000 tokens: 126 blocks of 16 alone; 8 sequences need 126 + 7 x 125 > 1000
    # (streamed, and only the status read: the fake engine knows no n)
    async with client.post("/v1/chat/completions",
                           json={**CHAT, "max_tokens": 2000, "n": 8, "stream": True}) as too_many:
        assert too_many.status != 529  # the engine judges it
    assert len(fake.opened.items) == 3 and fake.opened.items[-1].request.n == 8
    fake.opened.items.pop()
    await announce(client, fake, FREE)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    assert len(fake.opened.items) == 3


async def test_a_capacity_change_through_the_gateway_applies_at_once(client, fake):
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    await announce(client, fake, FULL)
    resp = await client.post("/control/capacity", json={"max_waiting": 0})
    assert resp.status == 200
    assert saturated(client) == {}  # no announcement needed before the next request
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    assert len(fake.opened.items) == 2


async def test_a_capacity_reply_saying_full_is_not_taken_over_the_session(client, fake):
    # The engine's reply gives the queue at the change, before its next step; the Session
    # may already have announced the state after that step. Taking a stale "full" from the
    # reply refused every request here for good (the capacity step's 8 -> 32: 16 waiting
    # at the change, none a step later, nothing more to announce).
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    fake.capacity_reply_states = [FULL]
    resp = await client.post("/control/capacity", json={"max_num_seqs": 8})
    assert resp.status == 200
    assert saturated(client) == {}
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    assert len(fake.opened.items) == 2  # it reached the engine, the authority on admission


async def test_a_full_state_refuses_only_arrivals_inside_its_span(client, fake):
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    fake.mode = "reject"  # (what the engine answers once asked)
    now = time.monotonic()
    await announce(client, fake, saturated_state(FAKE_MODEL, 7, 7, since=now, until=now + 60))
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 529
    assert len(fake.opened.items) == 1  # refused here: inside the span
    # The span ended (the engine's step boundary): the next arrival is the engine's to judge.
    await announce(client, fake, saturated_state(FAKE_MODEL, 7, 7, since=now, until=now))
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 529
    assert len(await fake.opened.wait(2)) == 2  # it went to the engine, which refused it
    # A span that starts after the arrival does not cover it either.
    later = time.monotonic() + 60
    await announce(client, fake, saturated_state(FAKE_MODEL, 7, 7, since=later, until=later + 1))
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 529
    assert len(await fake.opened.wait(3)) == 3


async def test_a_full_state_without_a_span_is_left_to_the_engine(client, fake):
    # (an engine on another clock: the gateway cannot tell which arrivals it covers)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    fake.announce(pb.QueueState(model=FAKE_MODEL, saturated=True, waiting=7, max_waiting=7,
                                message="Server is at capacity: 7 requests waiting (max_waiting = 7)."))
    fake.announce(saturated_state("marker", 1, 1))  # (in order: the one above is applied)
    await until(lambda: "marker" in saturated(client))
    fake.mode = "reject"
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 529
    assert FAKE_MODEL not in saturated(client) and len(await fake.opened.wait(2)) == 2


async def test_a_cancel_keeps_refusing_inside_the_span(client, fake):
    # A place a hang-up frees counts from the engine's next step, where the span ends.
    fake.mode = "hold"
    held = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert held.status == 200
    await announce(client, fake, FULL)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 529
    held.close()  # the client leaves: its Cancel frees a place from the next step
    await fake.cancelled.wait(1)
    assert FAKE_MODEL in saturated(client)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 529
    assert len(fake.opened.items) == 1  # the held one; the 529s never left


async def test_a_lost_session_forgets_the_queue_state(client, fake):
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    await announce(client, fake, FULL)
    await fake.stop()
    await until(lambda: saturated(client) == {})
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 503  # not a 529 from a state nobody vouches for any more
    await fake.start(fake.port)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200


async def test_refusals_are_the_documented_bytes_echo_each_request_id_and_count_exactly(client, fake):
    # The refusal path is tuned for cost (gateway.app, gateway.errors): what a client and
    # the counters see must not move. 529, the OpenAI envelope byte for byte, a request id
    # per request (the client's own when sent, else a fresh UUID4), and exactly one count
    # per refusal in the gateway's series and in the engine's Refused reports.
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    await announce(client, fake, FULL)
    state = client.server.app[STATE]
    before = state.metrics.requests.get(("/v1/chat/completions", 529), 0)
    body = (b'{"error":{"message":"Server is at capacity: 7 requests waiting (max_waiting = 7). '
            b'Retry with reduced concurrency.","type":"overloaded_error","code":"queue_saturated"}}')
    generated = set()
    for i in range(6):
        headers = {"x-request-id": f"client-{i}"} if i % 2 else {}
        resp = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert resp.status == 529
        assert resp.headers["Content-Type"] == "application/json"
        assert await resp.read() == body
        rid = resp.headers["x-request-id"]
        if i % 2:
            assert rid == f"client-{i}"
        else:
            assert uuid.UUID(hex=rid).version == 4 and len(rid) == 32
            generated.add(rid)
    assert len(generated) == 3
    assert state.metrics.requests[("/v1/chat/completions", 529)] - before == 6
    await until(lambda: sum(r.count for r in fake.refused.items) >= 6)
    assert sum(r.count for r in fake.refused.items) == 6
    assert len(fake.opened.items) == 1  # none reached the engine


_MESSAGE = (b"Server is at capacity: 7 requests waiting (max_waiting = 7). "
            b"Retry with reduced concurrency.")
_OPENAI_529 = (b'{"error":{"message":"' + _MESSAGE
               + b'","type":"overloaded_error","code":"queue_saturated"}}')
_ANTHROPIC_529 = (b'{"type":"error","error":{"type":"overloaded_error","message":"'
                  + _MESSAGE + b'"}}')


_USER = [{"role": "user", "content": "hello"}]
DIALECT_CASES = [  # (route, a body its dialect refuses when saturated, the 529's body)
    ("/v1/chat/completions", CHAT, _OPENAI_529),
    ("/v1/completions", {"model": FAKE_MODEL, "prompt": "hello", "max_tokens": 2}, _OPENAI_529),
    ("/v1/responses", {"model": FAKE_MODEL, "input": "hello", "max_output_tokens": 2,
                       "stream": True}, _OPENAI_529),
    ("/v1/messages", {"model": FAKE_MODEL, "messages": _USER, "max_tokens": 2}, _ANTHROPIC_529),
]


async def test_every_dialect_refuses_in_its_own_envelope_with_the_same_headers(client, fake):
    # Each route's 529 is its dialect's envelope byte for byte, with the headers in the
    # order they always went out (the refusal is built without an exception: gateway.app)
    # and exactly one count per refusal in each route's series and the engine's reports.
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    await announce(client, fake, FULL)
    state = client.server.app[STATE]
    for path, body, expected in DIALECT_CASES:
        before = state.metrics.requests.get((path, 529), 0)
        resp = await client.post(path, json=body, headers={"x-request-id": "r-" + path})
        assert resp.status == 529, path
        assert await resp.read() == expected, path
        names = [name.lower() for name, _ in resp.raw_headers]
        assert names == [b"content-type", b"content-length", b"date", b"server",
                         b"x-request-id", b"x-inference-lab-replica",
                         b"x-inference-lab-model"], path
        assert resp.headers["x-request-id"] == "r-" + path
        assert (resp.headers["x-inference-lab-replica"],
                resp.headers["x-inference-lab-model"]) == ("0", FAKE_MODEL)
        assert state.metrics.requests[(path, 529)] - before == 1
        # bad input in the same dialect still gets its 400 first
        assert (await client.post(path, json={"model": FAKE_MODEL})).status == 400, path
    await until(lambda: sum(r.count for r in fake.refused.items) >= 4)
    assert sum(r.count for r in fake.refused.items) == 4
    assert len(fake.opened.items) == 1  # none reached the engine


# ---- the edge's 529 (gateway.edge FAST_POSTS): the real server over real TCP ---------------

@asynccontextmanager
async def serving(fake, monkeypatch, key: bytes = b"", **app_kwargs):
    """(port, state, paths of aiohttp's refusals) of the real gateway served as `serve`
    serves it (start_gateway: gateway.edge's connections) in front of the fake engine,
    the session up and the model saturated; `key` is a header line the warm-up sends."""
    slow: list[str] = []
    original = gateway_app.saturated_response

    def counted(message, request=None, render=None, saturation=None):
        slow.append(request.path)
        return original(message, request, render, saturation)

    monkeypatch.setattr(gateway_app, "saturated_response", counted)
    app = create_app(fake.target, **app_kwargs)
    runner, port = await start_gateway(app, port=0)
    try:
        state = app[STATE]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        [(status, _, _)] = await exchange(writer, reader, post("/v1/chat/completions", CHAT, key))
        writer.close()
        assert status == b"HTTP/1.1 200 OK"  # the session is up
        fake.announce(FULL)
        await until(lambda: FAKE_MODEL in (state.engine._session.saturated
                                           if state.engine._session is not None else {}))
        yield port, state, slow
    finally:
        await runner.cleanup()


@pytest.fixture
async def edge(fake, monkeypatch):
    async with serving(fake, monkeypatch) as served:
        yield served


def post(path: str, body: dict | bytes, extra: bytes = b"") -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(raw) + raw)


async def exchange(writer, reader, raw: bytes, answers: int = 1) -> list[tuple[bytes, dict, bytes]]:
    """(status line, headers, the response's bytes) of each of `answers` responses to `raw`."""
    return await raw_exchange(writer, reader, raw, answers, whole=True)


_DATE = re.compile(rb"\r\nDate: [A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT\r\n")
_ID = re.compile(rb"\r\nx-request-id: [0-9a-f]{32}\r\n")


def _same_second(raw: bytes, fresh_id: bool) -> bytes:
    """`raw` with its Date (checked for aiohttp's format) and, if generated, its x-request-id
    (checked for a uuid4's hex) in place holders."""
    raw, dates = _DATE.subn(b"\r\nDate: D\r\n", raw)
    assert dates == 1, raw
    if fresh_id:
        raw, ids = _ID.subn(b"\r\nx-request-id: ID\r\n", raw)
        assert ids == 1, raw
    return raw


@pytest.mark.fast_paths
async def test_the_edge_writes_every_dialects_529_byte_for_byte_as_aiohttp_and_counts_it(edge, fake):
    # The first request on a connection is aiohttp's (its handler's saturated_response);
    # the next ones on the kept-alive connection are answered at the edge, and must be the
    # same bytes (status line, headers in order, Date, Server, the echoed or a fresh id,
    # the dialect's envelope) with the same counts (route series, engine's reports).
    port, state, slow = edge
    refused_before = sum(r.count for r in fake.refused.items)
    for path, body, expected in DIALECT_CASES:
        before = state.metrics.requests.get((path, 529), 0)
        timed = state.metrics.durations[path].n if path in state.metrics.durations else 0
        for extra in (b"X-Request-ID: r-7\r\n", b"", b"Connection: keep-alive\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                calls = len(slow)
                answers = []
                for _ in range(3):
                    answers += await exchange(writer, reader, post(path, body, extra))
                assert len(slow) == calls + 1, path  # the first alone went through aiohttp
            finally:
                writer.close()
            first = answers[0][2]
            assert first.startswith(b"HTTP/1.1 529 \r\nContent-Type: application/json\r\n")
            assert first.endswith(b"\r\n\r\n" + expected), path
            echoed = b"r-7" in extra
            for status, headers, raw in answers[1:]:
                assert _same_second(raw, not echoed) == _same_second(first, not echoed), path
            ids = [headers["x-request-id"] for _, headers, _ in answers]
            assert ids == ["r-7"] * 3 if echoed else len(set(ids)) == 3
        assert state.metrics.requests[(path, 529)] - before == 9, path
        assert state.metrics.durations[path].n - timed == 9, path
    await until(lambda: sum(r.count for r in fake.refused.items) - refused_before >= 36)
    assert sum(r.count for r in fake.refused.items) - refused_before == 36
    assert len(fake.opened.items) == 1  # none reached the engine


@pytest.mark.fast_paths
async def test_pipelined_split_and_first_requests_are_aiohttps_and_answered_right(edge,
                                                                                   monkeypatch):
    port, state, slow = edge
    reads = record_reads(monkeypatch)
    path, body, expected = DIALECT_CASES[0]
    one = post(path, body)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert len(await exchange(writer, reader, one)) == 1 and len(slow) == 1  # the first
        for status, _, raw in await exchange(writer, reader, one + one, 2):  # pipelined
            assert status == b"HTTP/1.1 529 " and raw.endswith(expected)
        assert len(slow) == 3
        for split in (20, one.index(b"\r\n\r\n") + 4):  # in the head; at the body
            writer.write(one[:split])
            await writer.drain()
            await until(lambda: reads[-1:] == [one[:split]], what="the first part read alone")
            [(status, _, raw)] = await exchange(writer, reader, one[split:])
            assert status == b"HTTP/1.1 529 " and raw.endswith(expected)
        assert len(slow) == 5
        [(status, _, raw)] = await exchange(writer, reader, one)  # whole again: the edge's
        assert status == b"HTTP/1.1 529 " and raw.endswith(expected) and len(slow) == 5
        [(status, _, raw)] = await exchange(
            writer, reader, post(path, body, b"Connection: close\r\n"))
        assert status == b"HTTP/1.1 529 " and raw.endswith(expected) and len(slow) == 6
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, as aiohttp does
    finally:
        writer.close()
    assert state.metrics.requests[(path, 529)] == 7


@pytest.mark.fast_paths
async def test_what_the_handler_would_not_refuse_is_aiohttps(edge, fake):
    # On a kept-alive connection, where the edge would answer a refusal: a bad body gets
    # its dialect's 400, one only the engine can judge (too long) goes to the engine, an
    # unsupported Content-Type its 415, a fault header its 400; a refusal with anything
    # unusual (Origin, Connection, chunked, a header twice, a query) is aiohttp's 529.
    port, state, slow = edge
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await exchange(writer, reader, post("/v1/chat/completions", CHAT))  # aiohttp's
        assert len(slow) == 1
        for path, _, expected in DIALECT_CASES:
            [(status, headers, raw)] = await exchange(
                writer, reader, post(path, {"model": FAKE_MODEL}))
            assert status == b"HTTP/1.1 400 Bad Request", path
            envelope = json.loads(raw.partition(b"\r\n\r\n")[2])
            assert envelope["error"]["type"] == "invalid_request_error", path
            assert ("type" in envelope) == expected.startswith(b'{"type":"error"'), path
            [(status, _, _)] = await exchange(writer, reader, post(path, b"{not json"))
            assert status == b"HTTP/1.1 400 Bad Request", path
        [(status, _, raw)] = await exchange(
            writer, reader, post("/v1/chat/completions", {**CHAT, "max_tokens": 5000}))
        assert status == b"HTTP/1.1 400 Bad Request" and b"max_model_len" in raw
        assert len(fake.opened.items) == 2  # that one went to the engine
        [(status, _, _)] = await exchange(writer, reader, post(
            "/v1/chat/completions", CHAT).replace(b"application/json", b"text/plain"))
        assert status == b"HTTP/1.1 415 Unsupported Media Type"
        [(status, _, _)] = await exchange(writer, reader, post(
            "/v1/chat/completions", CHAT, b"x-inference-lab-fault: error=500\r\n"))
        assert status == b"HTTP/1.1 400 Bad Request"
        assert len(slow) == 1
        unusual = [(b"Origin: http://page.example\r\n", "access-control-allow-origin"),
                   (b"Connection: keep-alive, Upgrade\r\n", None),
                   (b"x-request-id: a\r\nX-Request-Id: b\r\n", None),
                   (b"Accept: \xc3\xa9\r\n", None)]
        for extra, header in unusual:
            [(status, headers, raw)] = await exchange(
                writer, reader, post("/v1/chat/completions", CHAT, extra))
            assert status == b"HTTP/1.1 529 " and raw.endswith(_OPENAI_529), extra
            if header is not None:
                assert headers[header] == "*"
        raw = json.dumps(CHAT).encode()
        chunked = (b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: h\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(raw), raw))
        [(status, _, _)] = await exchange(writer, reader, chunked)
        assert status == b"HTTP/1.1 529 "
        assert len(slow) == 1 + len(unusual) + 1  # each of them aiohttp's
        await exchange(writer, reader, post("/v1/chat/completions", CHAT))
        assert len(slow) == 1 + len(unusual) + 1  # and the connection still goes fast
        [(status, _, raw)] = await exchange(  # a header over aiohttp's limit: its 400
            writer, reader, post("/v1/chat/completions", CHAT, b"x-long: %s\r\n" % (b"a" * 9000)))
        assert status.endswith(b" 400 Bad Request") and b"8190" in raw
    finally:
        writer.close()


@pytest.mark.fast_paths
@pytest.mark.parametrize("options, key, body, answer", [
    # (the edge checks no keys: without one a kept-alive request is a 401, not a 529)
    ({"api_key": "sk-test"}, b"Authorization: Bearer sk-test\r\n", CHAT,
     b"HTTP/1.1 401 Unauthorized"),
    # (nor sizes: a body over the limit is a 413, with the reason phrase of the running
    # Python's http.HTTPStatus, as aiohttp writes it: "Content Too Large" from 3.13 on)
    ({"max_body_bytes": 300}, b"",
     {**CHAT, "messages": [{"role": "user", "content": "x" * 400}]},
     b"HTTP/1.1 413 " + HTTPStatus(413).phrase.encode()),
])
async def test_a_key_and_the_body_limit_are_checked_by_aiohttp(fake, monkeypatch, options, key,
                                                               body, answer):
    async with serving(fake, monkeypatch, key, **options) as (port, state, slow):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for sent, expected in (((CHAT, key), b"HTTP/1.1 529 "), ((body, b""), answer),
                                   ((CHAT, key), b"HTTP/1.1 529 ")):
                [(status, _, _)] = await exchange(
                    writer, reader, post("/v1/chat/completions", *sent))
                assert status == expected
            assert len(slow) == (2 if key else 1)  # with a key, every one is aiohttp's
        finally:
            writer.close()


@pytest.mark.fast_paths
async def test_the_openai_and_anthropic_sdks_get_the_edges_529(edge):
    # What a user's client meets: httpx keeps the connection alive (and says so in a
    # Connection header), so after its first request the refusals are the edge's.
    import anthropic
    import openai

    port, state, slow = edge
    base = f"http://127.0.0.1:{port}"
    oa = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    an = anthropic.AsyncAnthropic(base_url=base, api_key="unused", max_retries=0)
    try:
        for _ in range(3):
            with pytest.raises(openai.APIStatusError) as raised:
                await oa.chat.completions.create(model=FAKE_MODEL, messages=_USER, max_tokens=2)
            assert raised.value.status_code == 529 and raised.value.code == "queue_saturated"
            assert len(raised.value.response.headers["x-request-id"]) == 32
            with pytest.raises(anthropic.OverloadedError) as overloaded:
                await an.messages.create(model=FAKE_MODEL, messages=_USER, max_tokens=2)
            assert overloaded.value.body["error"]["type"] == "overloaded_error"
    finally:
        await oa.close()
        await an.close()
    assert slow == ["/v1/chat/completions", "/v1/messages"]  # each SDK's first alone
    assert state.metrics.requests[("/v1/chat/completions", 529)] == 3
    assert state.metrics.requests[("/v1/messages", 529)] == 3


# ---- the saturated status as a setting ---------------------------------------------------

_ANTHROPIC_429 = _ANTHROPIC_529.replace(b'"overloaded_error"', b'"rate_limit_error"')


@pytest.mark.parametrize("status, retry_after, served_by, line, anthropic", [
    (503, 2, True, b"HTTP/1.1 503 Service Unavailable", _ANTHROPIC_529),
    (429, None, False, b"HTTP/1.1 429 Too Many Requests", _ANTHROPIC_429),
])
async def test_the_saturated_status_is_a_setting_the_edge_writes_as_aiohttp(
        fake, monkeypatch, status, retry_after, served_by, line, anthropic):
    # The handler's refusal (the first on a connection) and the edge's (the next ones) are
    # the same bytes: the status asked for, its Retry-After, the names of the replica and
    # model only when asked for; the envelope is the route's, the code queue_saturated.
    saturation = Saturation(status, retry_after)
    async with serving(fake, monkeypatch, saturation=saturation, served_by=served_by) as (
            port, state, slow):
        for path, body, expected in [DIALECT_CASES[0], (*DIALECT_CASES[3][:2], anthropic)]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                answers = []
                for _ in range(3):
                    answers += await exchange(writer, reader, post(path, body))
            finally:
                writer.close()
            first = answers[0][2]
            assert first.startswith(line + b"\r\n") and first.endswith(b"\r\n\r\n" + expected)
            for _, headers, raw in answers:
                assert _same_second(raw, True) == _same_second(first, True), path
                assert headers.get("retry-after") == (str(retry_after) if retry_after else None)
                assert headers.get("x-inference-lab-model") == (FAKE_MODEL if served_by else None)
            assert state.metrics.requests[(path, status)] == 3
        assert 529 not in {s for (_, s) in state.metrics.requests}
        assert len(slow) == 2  # one per connection: the others were the edge's
        # a refusal raised through the edge middleware (faults set) gets the status too,
        # and a fault's retry hint wins over the setting's Retry-After
        assert (await _post_json(port, "/control/faults", {"retry_after": 7}))[0] == 200
        got, headers = await _post_json(port, "/v1/chat/completions", CHAT)
        assert (got, headers.get("retry-after")) == (status, "7")


async def _post_json(port: int, path: str, body: dict) -> tuple[int, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        [(status, headers, _)] = await exchange(writer, reader, post(path, body))
    finally:
        writer.close()
    return int(status.split()[1]), headers


def test_a_saturated_status_outside_the_three_is_refused():
    with pytest.raises(ValueError, match="one of 529, 503, 429"):
        Saturation(500)
    with pytest.raises(ValueError, match="0..86400"):
        Saturation(503, -1)

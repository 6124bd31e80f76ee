"""The gateway refuses on the engine's announced queue state, without a round trip, and
forwards again as soon as the queue may have room (announcement, own capacity change, own
cancel). A narrow test against the fake engine: which Opens reach the engine is the point."""

from __future__ import annotations

import uuid

from inference_lab.gateway.app import STATE
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
    await until(lambda: (FAKE_MODEL in saturated(client)) == state.saturated)


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


async def test_a_cancel_sends_the_next_request_to_the_engine(client, fake):
    fake.mode = "hold"
    held = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert held.status == 200
    await announce(client, fake, FULL)
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 529
    held.close()  # the client leaves: its Cancel may free a place in the queue
    await fake.cancelled.wait(1)
    assert saturated(client) == {}
    fake.mode = "complete"
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    assert len(fake.opened.items) == 2  # the held one and this one; the 529 never left


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


async def test_every_dialect_refuses_in_its_own_envelope_with_the_same_headers(client, fake):
    # Each route's 529 is its dialect's envelope byte for byte, with the headers in the
    # order they always went out (the refusal is built without an exception: gateway.app)
    # and exactly one count per refusal in each route's series and the engine's reports.
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    await announce(client, fake, FULL)
    state = client.server.app[STATE]
    user = [{"role": "user", "content": "hello"}]
    cases = [("/v1/chat/completions", CHAT, _OPENAI_529),
             ("/v1/completions", {"model": FAKE_MODEL, "prompt": "hello", "max_tokens": 2},
              _OPENAI_529),
             ("/v1/responses", {"model": FAKE_MODEL, "input": "hello", "max_output_tokens": 2,
                                "stream": True}, _OPENAI_529),
             ("/v1/messages", {"model": FAKE_MODEL, "messages": user, "max_tokens": 2},
              _ANTHROPIC_529)]
    for path, body, expected in cases:
        before = state.metrics.requests.get((path, 529), 0)
        resp = await client.post(path, json=body, headers={"x-request-id": "r-" + path})
        assert resp.status == 529, path
        assert await resp.read() == expected, path
        names = [name.lower() for name, _ in resp.raw_headers]
        assert names == [b"content-type", b"content-length", b"date", b"server",
                         b"x-request-id"], path
        assert resp.headers["x-request-id"] == "r-" + path
        assert state.metrics.requests[(path, 529)] - before == 1
        # bad input in the same dialect still gets its 400 first
        assert (await client.post(path, json={"model": FAKE_MODEL})).status == 400, path
    await until(lambda: sum(r.count for r in fake.refused.items) >= 4)
    assert sum(r.count for r in fake.refused.items) == 4
    assert len(fake.opened.items) == 1  # none reached the engine

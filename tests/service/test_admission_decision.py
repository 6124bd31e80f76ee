"""One admission decision per generation request (gateway.admit): the handler and the
edge's fast path take it with the same function and give the same answer for the same
state, in both directions (nothing the engine would take is refused here, nothing it has
said it refuses goes to it); the engine client's `open` sends what it is given; a request
with faults set is decided once too, its 529 carrying the fault's retry hints."""

from __future__ import annotations

import asyncio
import json

import pytest

from hardening_helpers import exchange
from inference_lab.gateway import admit, create_app
from inference_lab.gateway.app import STATE
from inference_lab.gateway.server import start_gateway
from inference_lab.testing.fake_engine import FAKE_MODEL, saturated_state
from inference_lab.testing.poll import until

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
FULL = saturated_state(FAKE_MODEL, waiting=7, max_waiting=7)
CASES = [  # (route, body, refused here under FULL, the answer)
    ("/v1/chat/completions", CHAT, True, b"HTTP/1.1 529 "),
    ("/v1/completions", {"model": FAKE_MODEL, "prompt": ["a", "b"], "max_tokens": 2}, True,
     b"HTTP/1.1 529 "),
    # too large: the engine's 400
    ("/v1/chat/completions", {**CHAT, "max_tokens": 5000}, False, b"HTTP/1.1 400 Bad Request"),
    # n > 1: the engine's own KV-cache rule, here its refusal (the fake's "reject" mode)
    ("/v1/chat/completions", {**CHAT, "n": 2}, False, b"HTTP/1.1 529 "),
]


@pytest.fixture
def decisions(monkeypatch) -> list[str | None]:
    """Every answer gateway.admit gives, in order."""
    taken: list[str | None] = []
    decide = admit.refused

    def recorded(*args):
        taken.append(decide(*args))
        return taken[-1]

    monkeypatch.setattr(admit, "refused", recorded)
    return taken


def post(path: str, body: dict) -> bytes:
    raw = json.dumps(body).encode()
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(raw) + raw)


async def saturate(state, fake) -> None:
    fake.announce(FULL)
    await until(lambda: state.engine._session is not None
                and FAKE_MODEL in state.engine._session.saturated)


@pytest.mark.fast_paths
async def test_the_handler_and_the_edge_decide_alike_once_per_refusal(fake, decisions):
    app = create_app(fake.target)
    runner, port = await start_gateway(app, port=0)
    state = app[STATE]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        [(status, _, _)] = await exchange(writer, reader, post(*CASES[0][:2]), whole=True)
        assert status == b"HTTP/1.1 200 OK"  # the session is up
        writer.close()
        await saturate(state, fake)
        fake.mode = "reject"  # what the engine answers the requests it is asked
        for path, body, refused, expected in CASES:
            answers = []
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:  # the first request on a connection is the handler's, the next the edge's
                for _ in range(2):
                    opened, taken = len(fake.opened.items), len(decisions)
                    [(status, _, _)] = await exchange(writer, reader, post(path, body),
                                                      whole=True)
                    answers.append(status)
                    if refused:  # decided once, here, and the engine never asked
                        assert len(decisions) == taken + 1, body
                        assert decisions[-1] is not None and len(fake.opened.items) == opened
                    else:  # not refused here, wherever it was read: the engine judges it
                        assert set(decisions[taken:]) == {None}, body
                        assert len(await fake.opened.wait(opened + 1)) > opened
            finally:
                writer.close()
            assert answers == [expected, expected], body
    finally:
        await runner.cleanup()


async def test_open_sends_what_it_is_given_the_decision_is_the_callers(client, fake):
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    state = client.server.app[STATE]
    await saturate(state, fake)
    fake.mode = "hold"
    engine = state.engine
    assert engine.refusal(FAKE_MODEL, 16, 2) is not None  # the decision would refuse it
    stream = await engine.open(FAKE_MODEL, 16, 2)  # ... but open does not decide again
    assert len(await fake.opened.wait(2)) == 2
    engine.cancel(stream)


async def test_a_request_with_faults_set_is_decided_once_and_its_529_has_the_hints(
        client, fake, decisions):
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    resp = await client.post("/control/faults", json={"retry_after": 2})
    assert resp.status == 200
    await saturate(client.server.app[STATE], fake)
    resp = await client.post("/v1/chat/completions", json=CHAT)
    assert resp.status == 529 and resp.headers["retry-after"] == "2"
    assert len(decisions) == 2 and decisions[0] is None and decisions[1] is not None
    assert len(fake.opened.items) == 1  # the 529 never left

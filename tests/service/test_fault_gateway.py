"""The gateway's fault surface in-process (a fake engine on a free port): when directives
are honoured, refused, and what a model's static `[fault]` mode does."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from inference_lab.gateway import create_app
from inference_lab.gateway.faults import directive_for, parse_header
from inference_lab.gateway.faults.directive import DirectiveError, FaultMode, from_table
from inference_lab.testing.fake_engine import FAKE_MODEL

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
HEADER = {"x-inference-lab-fault": "no_usage;delay_ms=0"}


def test_the_header_grammar_takes_spaces_defaults_and_every_key():
    spec = parse_header(" cut_mid_frame ; after_chunks = 12 ;delay_ms=0; utf8=TRUE ;")
    assert (spec.mode, spec.after_chunks, spec.delay_ms, spec.utf8) == (
        FaultMode.CUT_MID_FRAME, 12, 0, True)
    assert parse_header("stall").after_chunks == 3 and parse_header("stall").delay_ms == 10
    assert parse_header("reset;after_tokens=5").after_tokens == 5


@pytest.mark.parametrize("bad", ["", "stall;after_chunks", "stall;after_chunks=-1",
                                 "stall;after_tokens=0", "stall;after_tokens=2;delay_ms=1",
                                 "stall;delay_ms=1;delay_ms=2", "Stall"])
def test_malformed_directives_are_refused(bad):
    with pytest.raises(DirectiveError):
        parse_header(bad)


def test_a_header_is_refused_when_directives_are_off_or_the_request_does_not_stream():
    with pytest.raises(DirectiveError, match="--enable-directives"):
        directive_for("stall", True, "m", False, {})
    with pytest.raises(DirectiveError, match="streaming requests only"):
        directive_for("stall", False, "m", True, {})
    static = {"m": from_table({"mode": "no_done"})}
    assert directive_for(None, True, "m", False, static).mode is FaultMode.NO_DONE
    assert directive_for(None, False, "m", False, static) is None  # non-streaming: normal


async def test_without_enable_directives_a_fault_header_is_a_400(fake):
    async with TestClient(TestServer(create_app(fake.target))) as c:
        resp = await c.post("/v1/chat/completions", json=CHAT, headers=HEADER)
        assert resp.status == 400
        err = (await resp.json())["error"]
        assert err["code"] == "invalid_fault_directive" and "--enable-directives" in err["message"]
        assert fake.opened.items == []  # the engine never heard of it


async def test_a_fault_header_on_a_non_streaming_request_is_a_400(fake):
    async with TestClient(TestServer(create_app(fake.target, enable_directives=True))) as c:
        resp = await c.post("/v1/completions", json={"model": FAKE_MODEL, "prompt": "x"},
                            headers=HEADER)
        assert resp.status == 400
        assert (await resp.json())["error"]["code"] == "invalid_fault_directive"


async def test_a_static_fault_applies_to_streams_of_its_model_and_a_header_wins(fake):
    app = create_app(fake.target, enable_directives=True,
                     static_faults={FAKE_MODEL: from_table({"mode": "no_done", "delay_ms": 0})})
    async with TestClient(TestServer(app)) as c:
        text = await (await c.post("/v1/chat/completions", json=CHAT)).text()
        assert "[DONE]" not in text and '"finish_reason":"stop"' in text
        text = await (await c.post("/v1/chat/completions", json=CHAT, headers=HEADER)).text()
        assert text.endswith("data: [DONE]\n\n")
        resp = await c.post("/v1/chat/completions", json={**CHAT, "stream": False})
        assert resp.status == 200 and (await resp.json())["object"] == "chat.completion"

"""Arrival stamps over real gRPC and real HTTP: the engine books a request at the instant
its sender stamped when the call says it reads the engine's clock (the Linux boot id), and
ignores the stamp otherwise; the gateway stamps every generation request when it has read
it and names its clock on its Session. Functional: the instants compared are the engine's
own modelled ones (a request stamped before the step in flight waits exactly that step)."""

from __future__ import annotations

import time

import aiohttp
import pytest

from engine_helpers import collect, engine_stub, running_engine, submit_request
from inference_lab.common.clock import CLOCK_METADATA, clock_id
from inference_lab.engine.drivers.pacer import Pacer
from inference_lab.gateway import create_app
from inference_lab.gateway.server import start_gateway
from inference_lab.testing.fake_engine import FAKE_MODEL

pytestmark = pytest.mark.skipif(clock_id() is None, reason="needs the Linux boot id")


async def stamped_behind_a_long_prefill(metadata) -> tuple[float, float]:
    """(the long request's modelled TTFT, the queue time of a second one stamped long before
    it reached the engine): the first one's single prefill step (8,000 tokens, 15.8 ms
    modelled, 0.3 s of wall at time scale 0.05) is in flight when the second arrives."""
    async with running_engine(time_scale=0.05) as server, engine_stub(server) as stub:
        long = stub.Submit(submit_request(prompt=8000, max_tokens=2))
        assert (await long.read()).HasField("admitted")
        request = submit_request(prompt=16, max_tokens=2)
        request.arrival_monotonic_s = time.monotonic() - 5.0
        short = await collect(stub.Submit(request, metadata=metadata))
        first = (await collect(long))[-1].finished
    return first.ttft_s, short[-1].finished.queue_time_s


async def test_a_stamp_on_the_engines_clock_books_the_arrival_back_to_the_step_in_flight(
        monkeypatch):
    monkeypatch.setattr(Pacer, "MAX_BACKDATE", 10.0)  # the 5 s stamp is believed whole
    prefill, queued = await stamped_behind_a_long_prefill(((CLOCK_METADATA, clock_id()),))
    # It arrived before that step began, yet the step was decided without it: booked at
    # the step's start, it waits the whole step (its queue time is the first one's TTFT).
    assert queued == pytest.approx(prefill, rel=1e-9)


@pytest.mark.parametrize("metadata", [None, ((CLOCK_METADATA, "another-host"),)])
async def test_a_stamp_from_another_clock_is_ignored(monkeypatch, metadata):
    monkeypatch.setattr(Pacer, "MAX_BACKDATE", 10.0)
    prefill, queued = await stamped_behind_a_long_prefill(metadata)
    assert 0 < queued < prefill  # booked when it reached the engine, inside the step


async def test_the_gateway_stamps_each_request_when_read_and_names_its_clock(fake):
    runner, port = await start_gateway(create_app(fake.target), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            before = time.monotonic()
            async with session.post(f"http://127.0.0.1:{port}/v1/completions",
                                    json={"model": FAKE_MODEL, "prompt": "hi",
                                          "max_tokens": 3}) as resp:
                assert resp.status == 200
                await resp.read()
            after = time.monotonic()
    finally:
        await runner.cleanup()
    (opened,) = await fake.opened.wait(1)
    assert opened.request.HasField("arrival_monotonic_s")
    assert before <= opened.request.arrival_monotonic_s <= after
    (context,) = await fake.sessions.wait(1)
    assert (CLOCK_METADATA, clock_id()) in tuple(context.invocation_metadata())

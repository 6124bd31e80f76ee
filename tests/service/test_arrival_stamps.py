"""Arrival stamps over real gRPC and real HTTP: the engine books a request at the instant
its sender stamped when the call says it reads the engine's clock (the Linux boot id), and
ignores the stamp otherwise; the gateway stamps every generation request when it has read
it and names its clock on its Session. Functional: the instants compared are the engine's
own modelled ones (a request stamped before the step in flight waits exactly that step)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import aiohttp
import pytest

from engine_helpers import collect, engine_stub, running_engine, submit_request
from inference_lab.common.clock import CLOCK_METADATA, clock_id
from inference_lab.engine.drivers.pacer import Pacer
from inference_lab.gateway import create_app, stamps
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
    monkeypatch.setattr(Pacer, "MAX_TRAIL", 10.0)  # the 5 s stamp is believed whole
    prefill, queued = await stamped_behind_a_long_prefill(((CLOCK_METADATA, clock_id()),))
    # It arrived before that step began, yet the step was decided without it: booked at
    # the step's start, it waits the whole step (its queue time is the first one's TTFT).
    assert queued == pytest.approx(prefill, rel=1e-9)


@pytest.mark.parametrize("metadata", [None, ((CLOCK_METADATA, "another-host"),)])
async def test_a_stamp_from_another_clock_is_ignored(monkeypatch, metadata):
    monkeypatch.setattr(Pacer, "MAX_TRAIL", 10.0)
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


@pytest.mark.fast_paths
@pytest.mark.skipif(not stamps.SUPPORTED, reason="needs Linux receive timestamps")
async def test_a_request_read_late_by_a_busy_gateway_is_stamped_when_its_bytes_came(fake):
    """The gateway's loop is busy for 100 ms while a request arrives: its stamp is the
    kernel's receive instant (within a few ms of the send), not the read 100 ms later."""
    runner, port = await start_gateway(create_app(fake.target), "127.0.0.1", 0)
    body = json.dumps({"model": FAKE_MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
               b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    sent = threading.Event()
    seen: dict[str, object] = {}
    async with aiohttp.ClientSession() as session:  # (the Session up first: an arrival that
        async with session.post(f"http://127.0.0.1:{port}/v1/completions",  # waits for it
                                data=body, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200  # to connect is booked when it is up)
            await r.read()

    def client() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            seen["sent"] = time.monotonic()
            conn.sendall(request)
            sent.set()
            seen["reply"] = conn.recv(65536)

    thread = threading.Thread(target=client)
    try:
        thread.start()
        assert sent.wait(10)
        # the gateway's loop busy is what is tested (this test's loop is the gateway's)
        time.sleep(0.1)
        resumed = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 10)
    finally:
        await runner.cleanup()
    assert seen["reply"].startswith(b"HTTP/1.1 200")
    _, opened = await fake.opened.wait(2)
    arrived = opened.request.arrival_monotonic_s
    assert seen["sent"] - 0.001 <= arrived < seen["sent"] + 0.02  # (clocks read apart)
    assert resumed - arrived > 0.09


async def test_without_receive_timestamps_the_read_instant_is_the_stamp(fake, monkeypatch):
    monkeypatch.setattr(stamps, "SUPPORTED", False)  # (a host without them)
    assert stamps.listen("127.0.0.1", 0) is None
    await test_the_gateway_stamps_each_request_when_read_and_names_its_clock(fake)


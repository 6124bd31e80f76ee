"""The Session over the engine's same-host lane (engine.service.lane, gateway.transport.lane),
with the real engine, real sockets and the real EngineClient: which transport the gateway
chooses and why, what a broken lane does to requests in flight, and what a misbehaving
lane client gets (closed, while the engine serves everyone else)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from engine_helpers import engine_stub, running_engine
from inference_lab.testing.lane_client import RawLane
from inference_lab.common.clock import clock_id
from inference_lab.gateway.engine_client import EngineClient
from inference_lab.gateway.errors import ErrorKind, GatewayError
from inference_lab.testing.fake_engine import FAKE_MODEL, FakeEngine
from inference_lab.testing.poll import until
from inference_lab.v1 import engine_pb2 as pb

pytestmark = pytest.mark.skipif(clock_id() is None, reason="needs the Linux boot id")
MODEL = "gpt-oss-20b"


async def finish(stream) -> int:
    """Read a request's events to its end; its token total."""
    while not stream.done:
        await stream.next_events()
    return stream.total


async def run_one(client: EngineClient, model: str = MODEL, tokens: int = 8) -> int:
    return await asyncio.wait_for(finish(await client.open(model, 16, tokens)), 10)


async def streaming(client: EngineClient, tokens: int = 2000):
    """A long request that has started streaming."""
    stream = await client.open(MODEL, 16, tokens)
    while stream.total == 0:
        await asyncio.wait_for(stream.next_events(), 5)
    return stream


async def engine_idle(engine) -> None:
    """The engine holds no request (a lost Session's are cancelled promptly)."""
    await until(lambda: not engine.live_requests(), timeout=5, what="the engine idle")


def chosen(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "inference_lab.gateway.engine_client"
            and ("session open" in r.getMessage() or "over gRPC:" in r.getMessage())]


@pytest.mark.parametrize("engine_lane, client_lane, transport", [
    ("auto", None, "lane"), ("off", None, "grpc"), ("auto", "off", "grpc")])
async def test_the_gateway_takes_the_lane_of_an_engine_on_its_host(
        engine_lane, client_lane, transport, caplog):
    caplog.set_level(logging.INFO, "inference_lab.gateway.engine_client")
    async with running_engine(session_lane=engine_lane) as engine:
        client = EngineClient(f"127.0.0.1:{engine.port}", session_lane=client_lane)
        try:
            assert await run_one(client, tokens=12) == 12
            assert client._session.transport == transport
        finally:
            await client.close()
    logs = chosen(caplog)
    opened = [m for m in logs if "session open" in m]
    assert opened[0].endswith("over the session lane" if transport == "lane" else "over gRPC")
    if engine_lane == "off":  # the reason is logged (once)
        assert "the engine has no session lane (UNIMPLEMENTED)" in " ".join(logs)


async def test_an_engine_without_the_lane_rpc_gets_the_grpc_session(caplog):
    caplog.set_level(logging.INFO, "inference_lab.gateway.engine_client")
    fake = FakeEngine()
    await fake.start()
    client = EngineClient(fake.target)
    try:
        stream = await client.open(FAKE_MODEL, 16, 3)
        await asyncio.wait_for(finish(stream), 5)
        assert client._session.transport == "grpc"
    finally:
        await client.close()
        await fake.stop()
    assert any("no session lane (UNIMPLEMENTED)" in m for m in chosen(caplog))


def _lane_info(real, **changes):
    info = real()
    for key, value in changes.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize("changes, reason", [
    ({"token": b"not the token"}, "the engine closed the lane"),
    ({"clock_id": "another-host"}, "runs on another host"),
    ({"port": 1}, "cannot connect"),  # refused: e.g. another network namespace
])
async def test_the_gateway_falls_back_to_grpc_when_the_lane_does_not_answer(
        changes, reason, caplog, monkeypatch):
    caplog.set_level(logging.INFO, "inference_lab.gateway.engine_client")
    async with running_engine() as engine:
        real = engine.lane.info
        monkeypatch.setattr(engine.lane, "info", lambda: _lane_info(real, **changes))
        client = EngineClient(f"127.0.0.1:{engine.port}")
        try:
            assert await run_one(client) == 8
            assert client._session.transport == "grpc"
        finally:
            await client.close()
        assert not engine.lane.connections  # a wrong token was closed at once
    assert any(reason in m for m in chosen(caplog)), chosen(caplog)


async def test_a_wrong_token_is_closed_without_an_answer():
    async with running_engine() as engine:
        lane = await RawLane.connect(engine.lane.info())
        assert await lane.hello(b"x" * 32) is None  # EOF: no hello back
        lane.close()
        good = await RawLane.connect(engine.lane.info())
        answer = await good.hello(engine.lane.token)
        assert answer is not None and answer.clock_id == clock_id()
        good.close()


async def test_a_lane_broken_mid_stream_fails_its_requests_and_the_next_opens_a_fresh_one():
    async with running_engine(time_scale=0.2) as engine:
        client = EngineClient(f"127.0.0.1:{engine.port}")
        try:
            stream = await streaming(client)
            first = client._session
            assert first.transport == "lane" and len(engine.lane.connections) == 1
            for connection in list(engine.lane.connections):
                connection.transport.abort()  # the engine's side goes away
            with pytest.raises(GatewayError) as err:
                await asyncio.wait_for(finish(stream), 5)
            assert err.value.kind is ErrorKind.ENGINE_UNAVAILABLE
            assert first.broken and client.inflight == 0
            await engine_idle(engine)  # the engine cancels the lost Session's request
            assert await run_one(client) == 8  # a fresh Session, over the lane again
            assert client._session is not first and client._session.transport == "lane"
        finally:
            await client.close()


@pytest.mark.parametrize("frame", [
    pytest.param(dict(payload=b"\xff\xff\xff\xff"), id="not-a-message"),
    pytest.param(dict(payload=b"", length=2**31), id="oversize"),
])
async def test_a_malformed_frame_closes_that_connection_and_cancels_its_requests(frame):
    async with running_engine(time_scale=0.2) as engine:
        info = engine.lane.info()
        bad = await RawLane.connect(info)
        assert await bad.hello(info.token) is not None
        await bad.write(pb.SessionActions(actions=[pb.SessionAction(open=pb.Open(
            tag=1, request=pb.SubmitRequest(prompt_tokens=16, max_tokens=2000)))]))
        admitted = False
        while not admitted:
            batch = await bad.read()
            admitted = any(e.HasField("admitted") for e in batch.events)
        assert engine.live_requests() == 1
        bad.send_raw(**frame)
        while (batch := await bad.read()) is not None:  # batches in flight, then EOF
            pass
        await engine_idle(engine)
        assert not engine.lane.connections
        client = EngineClient(f"127.0.0.1:{engine.port}")  # the engine serves others on
        try:
            assert await run_one(client) == 8
            assert client._session.transport == "lane"
        finally:
            await client.close()


async def test_the_lane_rpc_answers_unimplemented_with_the_lane_off():
    import grpc

    async with running_engine(session_lane="off") as engine, engine_stub(engine) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SessionLane(pb.SessionLaneRequest())
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
    async with running_engine() as engine, engine_stub(engine) as stub:
        info = await stub.SessionLane(pb.SessionLaneRequest())
        assert info.host == "127.0.0.1" and info.port == engine.lane.port
        assert len(info.token) == 32 and info.clock_id == clock_id()


async def test_engine_shutdown_ends_lane_sessions_and_nothing_hangs():
    async with running_engine(time_scale=0.2) as engine:
        client = EngineClient(f"127.0.0.1:{engine.port}")
        try:
            stream = await streaming(client, 5000)
            await asyncio.wait_for(engine.stop(grace=0.0), 5)
            # aborted by the engine (a Finished) or failed with the Session: never hangs
            try:
                await asyncio.wait_for(finish(stream), 5)
            except GatewayError as exc:
                assert exc.kind is ErrorKind.ENGINE_UNAVAILABLE
            assert stream.done
        finally:
            await asyncio.wait_for(client.close(), 5)


# ---- the same Session semantics over both transports --------------------------------------
@pytest.mark.parametrize("session_lane", ["auto", "off"])
async def test_a_cancel_frees_the_engine_request_over_either_transport(session_lane):
    async with running_engine(time_scale=0.2) as engine:
        client = EngineClient(f"127.0.0.1:{engine.port}", session_lane=session_lane)
        try:
            stream = await streaming(client)
            assert engine.live_requests() == 1
            client.cancel(stream)
            await engine_idle(engine)
            assert client.inflight == 0
            assert client._session.transport == ("lane" if session_lane == "auto" else "grpc")
            assert await run_one(client) == 8  # the Session carries on
        finally:
            await client.close()


@pytest.mark.parametrize("session_lane", ["auto", "off"])
async def test_a_full_queue_refuses_and_every_refusal_is_counted_over_either_transport(
        session_lane):
    from engine_helpers import engine_rejections

    async with running_engine(max_waiting=1, max_num_seqs=1, time_scale=0.2) as engine:
        client = EngineClient(f"127.0.0.1:{engine.port}", session_lane=session_lane)
        try:
            running = await streaming(client)
            waiting = await client.open(MODEL, 16, 10)  # the one waiting place
            refused = 0
            for _ in range(3):  # refused by the engine (Rejected) or here on its word
                try:
                    stream = await client.open(MODEL, 16, 10)
                    events = await asyncio.wait_for(stream.next_events(), 5)
                    while not events:
                        events = await asyncio.wait_for(stream.next_events(), 5)
                    assert events[-1].HasField("rejected")
                    assert events[-1].rejected.reason == "QUEUE_SATURATED"
                except GatewayError as exc:
                    assert exc.kind is ErrorKind.QUEUE_SATURATED
                refused += 1
            assert refused == 3
            # refusals made here are reported within ~10 ms
            async def counted() -> bool:
                return await asyncio.to_thread(engine_rejections, engine.metrics_port) == 3

            await until(counted, timeout=5, what="every refusal counted")
            client.cancel(running)
            client.cancel(waiting)
        finally:
            await client.close()


async def test_a_reader_a_window_behind_makes_the_engine_wait_and_merge_tokens():
    """The lane's flow control: no acknowledgement, no more than a window (plus the batch
    that crossed it) is written; meanwhile each stream's tokens merge into one update."""
    async with running_engine(time_scale=0.2) as engine, engine_stub(engine) as stub:
        lane = await RawLane.open(stub)
        lane.acks = False
        await lane.write(pb.SessionActions(actions=[
            pb.SessionAction(open=pb.Open(tag=tag, request=pb.SubmitRequest(
                prompt_tokens=16, max_tokens=300))) for tag in (1, 2, 3, 4)]))
        read, largest = 0, 0
        totals: dict[int, list[int]] = {}

        def note(batch: pb.ProgressBatch) -> int:
            for tag, total in zip(batch.token_tags, batch.token_totals):
                totals.setdefault(tag, []).append(total)
            return sum(e.HasField("finished") for e in batch.events)

        while True:  # until the engine waits (nothing for 0.3 s)
            try:
                payload = await lane.read_raw(timeout=0.3)
            except TimeoutError:
                break
            read = lane.received
            largest = max(largest, len(payload) + 4)
            note(pb.ProgressBatch.FromString(payload))
            assert read < lane.window + largest
        assert read >= lane.window  # it wrote up to the window, then waited
        lane.acks = True
        lane.acknowledge()  # everything read: the engine writes again, tokens merged
        finished = 0
        while finished < 4:
            finished += note(await lane.read())
        assert sorted(totals) == [1, 2, 3, 4]
        assert all(t[-1] == 300 for t in totals.values())
        assert any(b - a > 5 for t in totals.values() for a, b in zip(t, t[1:]))  # merged
        lane.close()


async def _closed(reader: asyncio.StreamReader, timeout: float = 5.0) -> bool:
    """The engine closed the connection (EOF or reset) within `timeout`."""
    try:
        async with asyncio.timeout(timeout):
            return await reader.read(1) == b""
    except ConnectionError:
        return True


async def test_a_first_frame_longer_than_a_hello_is_refused_before_its_bytes_are_buffered():
    from inference_lab.engine.service.lane import HELLO_MAX_FRAME

    async with running_engine() as engine:
        info = engine.lane.info()
        reader, writer = await asyncio.open_connection(info.host, info.port)
        # a 64 MiB frame's header and its first MiB: closed on the header, nothing buffered
        writer.write((64 * 1024 * 1024).to_bytes(4, "big") + bytes(1024 * 1024))
        assert await _closed(reader, timeout=2.0)  # (well before the hello's deadline)
        writer.close()
        await until(lambda: not engine.lane.connections, what="the connection to go")
        # a hello of any length up to the bound is still a hello
        reader, writer = await asyncio.open_connection(info.host, info.port)
        hello = pb.LaneHello(token=info.token, clock_id="c" * (HELLO_MAX_FRAME - 64))
        writer.write(len(hello.SerializeToString()).to_bytes(4, "big") + hello.SerializeToString())
        assert await asyncio.wait_for(reader.readexactly(4), 5)  # its hello back
        writer.close()


async def test_past_the_hello_a_frame_may_be_as_large_as_the_lane_allows():
    async with running_engine(time_scale=0.2) as engine:
        lane = await RawLane.connect(engine.lane.info())
        assert await lane.hello(engine.lane.token) is not None
        tokens = bytes(4 * 50_000)  # a 200 KB Open: above a hello's bound, well below MAX_FRAME
        await lane.write(pb.SessionActions(actions=[pb.SessionAction(open=pb.Open(
            tag=1, request=pb.SubmitRequest(prompt_token_ids=tokens, max_tokens=1)))]))
        admitted = False
        while not admitted:
            batch = await lane.read()
            assert batch is not None
            admitted = any(e.HasField("admitted") for e in batch.events)
        lane.close()


async def test_connections_beyond_the_cap_are_closed_and_a_gateway_still_gets_a_session():
    from inference_lab.engine.service.lane import MAX_CONNECTIONS

    async with running_engine() as engine:
        info = engine.lane.info()
        held = [await asyncio.open_connection(info.host, info.port)
                for _ in range(MAX_CONNECTIONS)]
        await until(lambda: len(engine.lane.connections) == MAX_CONNECTIONS,
                    what="the connections to be served")
        reader, writer = await asyncio.open_connection(info.host, info.port)
        assert await _closed(reader, timeout=2.0)  # one beyond the cap: closed at once
        writer.close()
        client = EngineClient(f"127.0.0.1:{engine.port}")  # the gateway falls back to gRPC
        try:
            assert await run_one(client) == 8
            assert client._session.transport == "grpc"
        finally:
            await client.close()
        for _, w in held:
            w.close()
        await until(lambda: not engine.lane.connections, what="the held ones to go")
        good = await RawLane.connect(info)
        assert await good.hello(info.token) is not None  # room again
        good.close()


async def test_a_connection_that_sends_no_hello_is_closed_by_the_deadline(monkeypatch):
    from inference_lab.engine.service import lane as engine_lane

    monkeypatch.setattr(engine_lane, "HELLO_TIMEOUT_S", 0.2)
    async with running_engine() as engine:
        info = engine.lane.info()
        reader, writer = await asyncio.open_connection(info.host, info.port)
        writer.write(b"\x00\x00")  # half a header, then nothing
        assert await _closed(reader, timeout=3.0)
        writer.close()
        await until(lambda: not engine.lane.connections, what="the connection to go")

"""Parallel sampling (n > 1) through the real engine over real gRPC: Submit reports each
sequence by index, a Session under tag + index; the request counts once against
max_waiting and holds n running places; cancelling it cancels every sequence."""

from __future__ import annotations

import grpc
import pytest

from engine_helpers import collect, engine_stub, running_engine
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.testing.poll import until


async def test_a_submit_of_three_sequences_streams_each_by_index_and_finishes_each():
    async with running_engine() as server, engine_stub(server) as stub:
        call = stub.Submit(pb.SubmitRequest(prompt_tokens=100, max_tokens=20, n=3))
        events = await collect(call)
    assert events[0].HasField("admitted")
    tokens: dict[int, int] = {}
    for e in events:
        if e.HasField("tokens"):
            assert e.tokens.total_tokens == tokens.get(e.tokens.index, 0) + e.tokens.new_tokens
            tokens[e.tokens.index] = e.tokens.total_tokens
    finished = [e.finished for e in events if e.HasField("finished")]
    assert sorted(f.index for f in finished) == [0, 1, 2]
    assert all(f.completion_tokens == 20 and f.prompt_tokens == 100 for f in finished)
    assert tokens == {0: 20, 1: 20, 2: 20}
    assert events[-1].HasField("finished")  # the call ends with the last sequence's Finished


async def test_n_above_max_num_seqs_is_invalid_argument():
    async with running_engine(max_num_seqs=4) as server, engine_stub(server) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(stub.Submit(pb.SubmitRequest(prompt_tokens=10, max_tokens=5, n=5)))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "n (5) exceeds max_num_seqs 4" in info.value.details()


async def test_a_session_reports_sequences_under_tag_plus_index_and_admits_once():
    # max_num_seqs 4, max_waiting 1: a family of 4 holds every place while it runs, and a
    # family waiting counts once, so the next Open is the one refused.
    async with running_engine(max_waiting=1, max_num_seqs=4) as server, \
            engine_stub(server) as stub:
        call = stub.Session()

        def open_(tag: int, max_tokens: int, n: int) -> pb.SessionAction:
            return pb.SessionAction(open=pb.Open(tag=tag, request=pb.SubmitRequest(
                prompt_tokens=50, max_tokens=max_tokens, n=n)))

        totals, finished, admitted, rejected = {}, {}, set(), set()

        async def read() -> None:
            batch = await call.read()
            totals.update(zip(batch.token_tags, batch.token_totals))
            for event in batch.events:
                kind = event.WhichOneof("event")
                if kind == "admitted":
                    admitted.add(event.tag)
                elif kind == "rejected":
                    rejected.add(event.tag)
                elif kind == "finished":
                    finished[event.tag] = event.finished

        await call.write(pb.SessionActions(actions=[open_(10, 2000, 4)]))
        while not all(totals.get(t) for t in (10, 11, 12, 13)):  # four sequences decode
            await read()
        await call.write(pb.SessionActions(actions=[open_(20, 5, 2), open_(30, 5, 1)]))
        while len(admitted) + len(rejected) < 3:
            await read()
        cap = (await stub.GetCapacity(pb.GetCapacityRequest())).models[0]
        assert (cap.running, cap.waiting) == (4, 1)  # the family of two waits, as one
        await call.write(pb.SessionActions(actions=[pb.SessionAction(cancel=pb.Cancel(tag=10))]))
        while not {10, 20, 21} <= set(finished):
            await read()
        await call.done_writing()
        assert admitted == {10, 20} and rejected == {30}
        assert finished[10].reason == pb.FINISH_REASON_CANCELLED
        assert {t: (f.index, f.completion_tokens) for t, f in finished.items() if t >= 20} == {
            20: (0, 5), 21: (1, 5)}
        assert totals[20] == totals[21] == 5
        await until(lambda: server.runtimes[0].core.num_running == 0)
        core = server.runtimes[0].core
        assert core.scheduler.free_blocks == core.total_blocks


async def test_in_a_full_span_a_request_of_n_sequences_gets_the_engines_own_529_or_400():
    # The gateway refuses on the engine's word only what the engine's figure for one
    # sequence decides (max_request_tokens); a request of n > 1 sequences goes on to the
    # engine even while the gateway holds a "full" span, and gets the engine's answers:
    # its 529 (the queue is full) and its 400 (n sequences that cannot fit its KV cache,
    # checked before its queue).
    import asyncio

    import aiohttp
    from aiohttp.test_utils import TestServer

    from inference_lab.gateway import create_app
    from inference_lab.gateway.engine_client import EngineClient, Probe

    model = "gpt-oss-20b"
    opened: list[int] = []

    class Opens(Probe):
        def on_open(self, tag: int) -> None:
            opened.append(tag)

    def completion(**fields) -> dict:
        return {"model": model, "prompt": "x", **fields}  # a prompt of one token

    async with running_engine(max_waiting=1, max_num_seqs=64) as server:
        core = server.runtimes[0].core
        client = EngineClient(f"127.0.0.1:{server.port}", probe=Opens())
        waiting = None
        try:
            async with TestServer(create_app(f"127.0.0.1:{server.port}", engine=client)) as gw, \
                    aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{gw.port}/v1/completions"
                # 64 sequences hold every running place; the next request waits: full
                running = await http.post(url, json=completion(n=64, max_tokens=20000,
                                                               stream=True))
                assert running.status == 200
                await until(lambda: core.num_running == 64)
                waiting = asyncio.ensure_future(http.post(url, json=completion(max_tokens=4)))
                await until(lambda: core.num_waiting == 1)
                await until(lambda: client._session is not None
                            and model in client._session.saturated)
                sent = len(opened)
                two = await http.post(url, json=completion(n=2, max_tokens=4))
                assert two.status == 529
                error = (await two.json())["error"]
                assert error["code"] == "queue_saturated"
                assert error["message"].startswith("Server is at capacity: 1 requests waiting")
                # 64 sequences of 1 + 131,000 tokens: 2,047 blocks of 64 tokens each (the
                # prompt has no full block to share), more than the 101,502 of the cache
                too_large = await http.post(url, json=completion(n=64, max_tokens=131_000))
                assert too_large.status == 400
                message = (await too_large.json())["error"]["message"]
                assert "64 sequences of 131001 tokens need 131008 KV blocks" in message
                assert len(opened) == sent + 2  # both were the engine's to answer
                running.close()
                waiting.cancel()
                await until(lambda: core.num_running == 0 and core.num_waiting == 0)
        finally:
            if waiting is not None:
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
            await client.close()

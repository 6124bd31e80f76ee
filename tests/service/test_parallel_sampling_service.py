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

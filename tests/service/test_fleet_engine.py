"""Replicas in one engine over real gRPC: each its own scheduler, queue and capacity;
GetCapacity lists model x replica; SetReplicas adds (ready after the start-up delay) and
drains (in-flight requests finish, then the replica is gone); bad replica input refused;
GetMetrics renders one replica's series labelled engine = its index."""

import asyncio

import grpc
import pytest

from engine_helpers import collect, engine_stub, running_engine, submit_request
from inference_lab.engine.fleet.replicas import MAX_REPLICAS
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.testing.poll import until


def on(replica: int, max_tokens: int = 20) -> pb.SubmitRequest:
    request = submit_request(max_tokens=max_tokens)
    request.replica = replica
    return request


def rows(resp: pb.CapacityResponse) -> dict[int, pb.ModelCapacity]:
    return {m.replica: m for m in resp.models}


async def test_each_replica_has_its_own_queue_batch_and_capacity():
    async with running_engine(replicas=3) as server, engine_stub(server) as stub:
        before = rows(await stub.GetCapacity(pb.GetCapacityRequest()))
        assert sorted(before) == [0, 1, 2]
        assert all(not m.starting and not m.draining for m in before.values())
        held = stub.Submit(on(2, max_tokens=3000))
        assert (await held.read()).HasField("admitted")
        now = rows(await stub.GetCapacity(pb.GetCapacityRequest()))
        assert [now[i].running + now[i].waiting for i in range(3)] == [0, 0, 1]
        # capacity of one replica only
        resp = await stub.SetCapacity(pb.SetCapacityRequest(max_num_seqs=8, replica=1))
        assert [(m.replica, m.max_num_seqs) for m in resp.models] == [(1, 8)]
        after = rows(await stub.GetCapacity(pb.GetCapacityRequest()))
        assert [after[i].max_num_seqs for i in range(3)] == [256, 8, 256]
        one = await stub.GetCapacity(pb.GetCapacityRequest(replica=2))
        assert [(m.replica, m.running + m.waiting) for m in one.models] == [(2, 1)]
        events = await collect(stub.Submit(on(1)))  # another replica serves meanwhile
        assert events[-1].finished.completion_tokens == 20
        held.cancel()


async def test_unknown_replica_is_not_found_everywhere():
    async with running_engine(replicas=2) as server, engine_stub(server) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Submit(on(5)).read()
        assert info.value.code() is grpc.StatusCode.NOT_FOUND and "replica 5" in info.value.details()
        for call in (stub.GetCapacity(pb.GetCapacityRequest(replica=5)),
                     stub.SetCapacity(pb.SetCapacityRequest(max_num_seqs=4, replica=5)),
                     stub.GetMetrics(pb.GetMetricsRequest(engines=[5]))):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() is grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.SetReplicas(pb.SetReplicasRequest(replicas=MAX_REPLICAS + 1))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert str(MAX_REPLICAS) in info.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.SetReplicas(pb.SetReplicasRequest(model="nope", replicas=1))
        assert info.value.code() is grpc.StatusCode.NOT_FOUND


async def test_an_added_replica_refuses_until_its_startup_delay_has_passed():
    async with running_engine(replicas=1, startup_delay=0.5) as server, engine_stub(server) as stub:
        await until(lambda: all(r.ready(server.fleet.now()) for r in server.fleet))
        resp = rows(await stub.SetReplicas(pb.SetReplicasRequest(replicas=2)))
        assert sorted(resp) == [0, 1] and resp[1].starting and 0.4 < resp[1].ready_in_s <= 0.5
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Submit(on(1)).read()
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "starting" in info.value.details()
        await asyncio.sleep(resp[1].ready_in_s)  # the modelled delay itself is the event
        events = await collect(stub.Submit(on(1)))
        assert events[-1].finished.completion_tokens == 20


async def test_a_drained_replica_finishes_its_requests_then_is_gone():
    async with running_engine(replicas=2) as server, engine_stub(server) as stub:
        inflight = stub.Submit(on(1, max_tokens=400))
        assert (await inflight.read()).HasField("admitted")
        resp = rows(await stub.SetReplicas(pb.SetReplicasRequest(replicas=1)))
        assert resp[1].draining and not resp[0].draining
        with pytest.raises(grpc.aio.AioRpcError) as info:  # admits nothing more
            await stub.Submit(on(1)).read()
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE and "draining" in info.value.details()
        events = await collect(inflight)  # nothing lost: it runs to its end
        assert events[-1].finished.reason == pb.FINISH_REASON_LENGTH
        assert events[-1].finished.completion_tokens == 400
        await until(lambda: [r.index for r in server.fleet] == [0])
        assert sorted(rows(await stub.GetCapacity(pb.GetCapacityRequest()))) == [0]


async def test_draining_the_last_replica_makes_the_model_unavailable_until_one_is_back():
    async with running_engine(replicas=1) as server, engine_stub(server) as stub:
        assert list(rows(await stub.SetReplicas(pb.SetReplicasRequest(replicas=0)))) in ([0], [])
        await until(lambda: not list(server.fleet))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Submit(submit_request()).read()
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "no replica" in info.value.details()
        await stub.SetReplicas(pb.SetReplicasRequest(replicas=1))
        events = await collect(stub.Submit(submit_request(max_tokens=5)))
        assert events[-1].finished.completion_tokens == 5


async def test_get_metrics_renders_one_replica_labelled_with_its_index():
    async with running_engine(replicas=3) as server, engine_stub(server) as stub:
        await collect(stub.Submit(on(1, max_tokens=7)))
        text = (await stub.GetMetrics(pb.GetMetricsRequest(engines=[1]))).text.decode()
        assert 'vllm:num_requests_waiting{engine="1",model_name="gpt-oss-20b"} 0.0' in text
        assert 'vllm:generation_tokens_total{engine="1",model_name="gpt-oss-20b"} 7.0' in text
        core = server.runtimes[1].core
        info = next(line for line in text.splitlines()
                    if line.startswith("vllm:cache_config_info{"))
        assert f'block_size="{core.block_size}"' in info and 'engine="1"' in info
        assert f'num_gpu_blocks="{core.total_blocks}"' in info and info.endswith(" 1.0")
        assert 'engine="0"' not in text and 'engine="2"' not in text
        other = (await stub.GetMetrics(pb.GetMetricsRequest(engines=[2]))).text.decode()
        assert 'vllm:generation_tokens_total{engine="2",model_name="gpt-oss-20b"} 0.0' in other
        everything = (await stub.GetMetrics(pb.GetMetricsRequest())).text.decode()
        assert all(f'engine="{i}"' in everything for i in range(3))


async def test_each_replica_keeps_its_own_capacity_across_a_restart(tmp_path):
    async with running_engine(replicas=3, state_dir=tmp_path) as server, \
            engine_stub(server) as stub:
        await stub.SetCapacity(pb.SetCapacityRequest(max_num_seqs=3, replica=1))
        await stub.SetCapacity(pb.SetCapacityRequest(max_waiting=7, replica=2))
    # fewer replicas at first: replica 2's setting waits for replica 2
    async with running_engine(replicas=2, state_dir=tmp_path) as server, \
            engine_stub(server) as stub:
        now = rows(await stub.GetCapacity(pb.GetCapacityRequest()))
        assert [(now[i].max_num_seqs, now[i].max_waiting) for i in (0, 1)] == [(256, 0), (3, 0)]
        await stub.SetCapacity(pb.SetCapacityRequest(max_waiting=4, replica=0))  # saves again
        added = rows(await stub.SetReplicas(pb.SetReplicasRequest(replicas=3)))
        assert (added[2].max_num_seqs, added[2].max_waiting) == (256, 7)
    async with running_engine(replicas=3, state_dir=tmp_path) as server, \
            engine_stub(server) as stub:
        now = rows(await stub.GetCapacity(pb.GetCapacityRequest()))
        assert [(now[i].max_num_seqs, now[i].max_waiting) for i in range(3)] == [
            (256, 4), (3, 0), (256, 7)]


async def test_a_capacity_file_from_before_replicas_applies_to_every_replica(tmp_path):
    (tmp_path / "capacity.json").write_text(
        '{"capacity": {"gpt-oss-20b": {"max_num_seqs": 5, "max_waiting": 9}}}')
    async with running_engine(replicas=2, state_dir=tmp_path) as server, \
            engine_stub(server) as stub:
        now = rows(await stub.GetCapacity(pb.GetCapacityRequest()))
        assert [(now[i].max_num_seqs, now[i].max_waiting) for i in (0, 1)] == [(5, 9), (5, 9)]


async def test_the_replica_limit_counts_draining_replicas_and_so_the_ports_they_hold():
    """Switching between 1 and 2 replicas while each new one holds a stream takes a new
    index (and a gateway port) every time: every replica held counts toward the limit."""
    async with running_engine(replicas=2) as server, engine_stub(server) as stub:
        server.fleet.max_replicas = 4
        held, refused = [], None
        try:
            for _ in range(6):
                newest = max(r.index for r in server.fleet if not r.draining)
                call = stub.Submit(on(newest, max_tokens=100_000))
                assert (await call.read()).HasField("admitted")
                held.append(call)
                await stub.SetReplicas(pb.SetReplicasRequest(replicas=1))  # newest drains
                try:
                    await stub.SetReplicas(pb.SetReplicasRequest(replicas=2))
                except grpc.aio.AioRpcError as exc:
                    refused = exc
                    break
            assert refused is not None and refused.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "draining" in refused.details()
            assert max(server.fleet.indices()) == 3 and len(list(server.fleet)) == 4
        finally:
            for call in held:
                call.cancel()

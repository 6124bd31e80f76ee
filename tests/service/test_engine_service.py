"""The engine service over real gRPC on a free loopback port: admission, refusal with
rich status, pacing, draining, cancellation, capacity control, health and metrics."""

import asyncio
import time
import urllib.request

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from engine_helpers import (
    collect, engine_rejections, engine_stub, running_engine, submit_request,
)
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.testing.poll import until


async def test_a_submit_streams_admitted_tokens_and_finished_with_exact_counts():
    async with running_engine() as server, engine_stub(server) as stub:
        events = await collect(stub.Submit(submit_request(prompt=16, max_tokens=50)))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "admitted" and kinds[-1] == "finished"
    tokens = [e.tokens for e in events if e.HasField("tokens")]
    assert sum(t.new_tokens for t in tokens) == 50 and tokens[-1].total_tokens == 50
    finished = events[-1].finished
    assert finished.reason == pb.FINISH_REASON_LENGTH
    assert (finished.prompt_tokens, finished.completion_tokens) == (16, 50)
    assert 0 < finished.ttft_s < finished.e2e_s


async def test_a_saturated_model_refuses_before_any_message_with_queue_saturated_details():
    async with running_engine(max_waiting=1, max_num_seqs=1) as server, engine_stub(server) as stub:
        running = stub.Submit(submit_request(max_tokens=2000))
        assert (await running.read()).HasField("admitted")
        await until(lambda: server.runtimes[0].core.num_running == 1)
        queued = stub.Submit(submit_request(max_tokens=10))
        assert (await queued.read()).HasField("admitted")
        refused = stub.Submit(submit_request(max_tokens=10))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await refused.read()  # the first read fails: no message came before
        err = info.value
        assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.details() == ("Server is at capacity: 1 requests waiting (max_waiting = 1). "
                                 "Retry with reduced concurrency.")
        status = await rpc_status.aio.from_call(refused)
        detail = error_details_pb2.ErrorInfo()
        assert status.details[0].Unpack(detail)
        assert detail.reason == "QUEUE_SATURATED" and detail.domain == "inference-lab"
        assert dict(detail.metadata) == {"model": "gpt-oss-20b", "waiting": "1", "max_waiting": "1"}
        running.cancel()
        queued.cancel()


async def test_a_burst_of_1000_submits_never_overfills_the_queue_and_loses_nothing():
    async with running_engine(max_waiting=64, max_num_seqs=16) as server, engine_stub(server) as stub:
        core = server.runtimes[0].core
        observed = []
        stop = asyncio.Event()

        async def observe():
            while not stop.is_set():
                observed.append(core.num_waiting)
                cap = await stub.GetCapacity(pb.GetCapacityRequest())
                observed.append(cap.models[0].waiting)

        async def one(i):
            call = stub.Submit(submit_request(prompt=16 + i % 7, max_tokens=200 + i % 50))
            events = []
            try:
                async for event in call:
                    events.append(event)
            except grpc.aio.AioRpcError as err:
                assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert events == []  # refused before any message
                return "refused", 0, 0, 0
            assert events[0].HasField("admitted") and events[0].admitted.waiting <= 64
            total = sum(e.tokens.new_tokens for e in events if e.HasField("tokens"))
            return "done", total, events[-1].finished.completion_tokens, 200 + i % 50

        watcher = asyncio.create_task(observe())
        results = await asyncio.gather(*(one(i) for i in range(1000)))
        stop.set()
        await watcher
    done = [r for r in results if r[0] == "done"]
    refused = [r for r in results if r[0] == "refused"]
    assert len(done) + len(refused) == 1000
    assert len(done) >= 16 + 64 and refused
    assert all(total == completion == expected for _, total, completion, expected in done)
    assert observed and max(observed) <= 64


async def test_the_first_request_after_idle_is_paced_not_served_at_cpu_speed():
    async with running_engine() as server, engine_stub(server) as stub:
        await asyncio.sleep(2.0)  # the idle period under test, not a synchronisation
        start = time.perf_counter()
        events = await collect(stub.Submit(submit_request(max_tokens=200)))
        wall = time.perf_counter() - start
    modelled = events[-1].finished.e2e_s
    assert modelled > 0.05  # 200 decode steps of gpt-oss-20b are tens of milliseconds
    # Never faster than modelled (a cold-start deficit would serve it in milliseconds);
    # slower only by what a busy machine adds to one gRPC stream (10 % + 20 ms).
    assert 0.95 * modelled <= wall <= 1.10 * modelled + 0.02, \
        f"wall {wall:.4f} s, modelled {modelled:.4f} s"


async def test_lowering_max_num_seqs_with_32_running_drains_to_8_and_loses_nothing():
    async with running_engine() as server, engine_stub(server) as stub:
        core = server.runtimes[0].core
        calls = [stub.Submit(submit_request(max_tokens=400 + 10 * i)) for i in range(32)]
        for call in calls:
            assert (await call.read()).HasField("admitted")
        await until(lambda: core.num_running == 32)
        reply = await stub.SetCapacity(pb.SetCapacityRequest(max_num_seqs=8))
        assert reply.models[0].max_num_seqs == 8 and reply.models[0].running == 32
        late = stub.Submit(submit_request(max_tokens=5))
        assert (await late.read()).HasField("admitted")
        running_after_each_finish = []
        for i, call in enumerate(calls):
            events = await collect(call)
            assert events[-1].finished.completion_tokens == 400 + 10 * i
            assert sum(e.tokens.new_tokens for e in events if e.HasField("tokens")) == 400 + 10 * i
            running_after_each_finish.append(
                (await stub.GetCapacity(pb.GetCapacityRequest())).models[0].running)
        late_events = await collect(late)
    # Nobody evicted: the batch shrinks one finish at a time; the late request only ran
    # once fewer than 8 were running.
    seen = running_after_each_finish
    assert all(running <= 31 - i for i, running in enumerate(seen[:24]))
    assert all(a >= b for a, b in zip(seen[:24], seen[1:24]))  # only shrinks while draining
    assert min(seen) <= 8
    assert late_events[-1].finished.completion_tokens == 5
    assert late_events[-1].finished.queue_time_s > 0.1


async def test_cancelling_a_submit_frees_its_slot_and_kv_blocks():
    async with running_engine() as server, engine_stub(server) as stub:
        core = server.runtimes[0].core
        call = stub.Submit(submit_request(prompt=3000, max_tokens=5000))
        assert (await call.read()).HasField("admitted")
        assert (await call.read()).HasField("tokens")
        assert core.num_running == 1 and core.scheduler.free_blocks < core.total_blocks
        call.cancel()
        await until(lambda: core.num_running == 0)
        assert core.scheduler.free_blocks == core.total_blocks and core.num_waiting == 0


async def test_a_session_multiplexes_requests_with_packed_token_progress():
    async with running_engine(max_waiting=2, max_num_seqs=2) as server, engine_stub(server) as stub:
        call = stub.Session()

        async def open_(tag):
            await call.write(pb.SessionActions(actions=[
                pb.SessionAction(open=pb.Open(tag=tag, request=submit_request(max_tokens=30 + tag)))]))

        totals, outcome = {}, {}
        await open_(1)
        await open_(2)
        while not (totals.get(1) and totals.get(2)):  # both running: the queue is empty
            batch = await call.read()
            totals.update(zip(batch.token_tags, batch.token_totals))
        for tag in (3, 4, 5):
            await open_(tag)
        cancelled = False
        while len(outcome) < 5:
            batch = await call.read()
            for tag, total in zip(batch.token_tags, batch.token_totals):
                assert total > totals.get(tag, 0)
                totals[tag] = total
            for event in batch.events:
                kind = event.WhichOneof("event")
                if kind == "rejected":
                    assert event.rejected.reason == "QUEUE_SATURATED" and event.rejected.code == 8
                    outcome[event.tag] = "rejected"
                elif kind == "finished":
                    outcome[event.tag] = event.finished
            if not cancelled and totals.get(1):
                await call.write(pb.SessionActions(actions=[pb.SessionAction(cancel=pb.Cancel(tag=1))]))
                cancelled = True
        await call.done_writing()
    assert outcome[5] == "rejected"  # 2 running + 2 waiting, the fifth refused
    assert outcome[1].reason == pb.FINISH_REASON_CANCELLED
    for tag in (2, 3, 4):
        assert outcome[tag].reason == pb.FINISH_REASON_LENGTH
        assert outcome[tag].completion_tokens == totals[tag] == 30 + tag


async def test_set_capacity_validates_and_unknown_models_are_not_found():
    async with running_engine() as server, engine_stub(server) as stub:
        for request, code in [
            (pb.SetCapacityRequest(), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.SetCapacityRequest(max_num_seqs=0), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.SetCapacityRequest(max_waiting=-1), grpc.StatusCode.INVALID_ARGUMENT),
            (pb.SetCapacityRequest(model="nope", max_waiting=3), grpc.StatusCode.NOT_FOUND),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.SetCapacity(request)
            assert info.value.code() is code and info.value.details()
        reply = await stub.SetCapacity(pb.SetCapacityRequest(model="gpt-oss-20b", max_waiting=7))
        assert [(m.model, m.max_waiting, m.max_num_seqs) for m in reply.models] == [("gpt-oss-20b", 7, 256)]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Submit(submit_request(model="nope")).read()
        assert info.value.code() is grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Submit(submit_request(prompt=131000, max_tokens=1000)).read()
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "max_model_len" in info.value.details()
        models = await stub.ListModels(pb.ListModelsRequest())
        assert [(m.name, m.hardware, m.block_size) for m in models.models] == [("gpt-oss-20b", "b200", 64)]


async def test_health_is_serving_and_metrics_use_vllm_names():
    async with running_engine(max_waiting=1, max_num_seqs=1) as server:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service="inference_lab.v1.Engine"))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        async with engine_stub(server) as stub:
            # The first runs (its first token is out, so it left the waiting queue), the
            # second waits in the one waiting place, the third is refused.
            first = stub.Submit(submit_request(max_tokens=3000))
            while (await first.read()).WhichOneof("event") != "tokens":
                pass
            calls = [first]
            results = []
            for _ in range(2):
                call = stub.Submit(submit_request(max_tokens=3000))
                calls.append(call)
                try:
                    results.append((await call.read()).WhichOneof("event"))
                except grpc.aio.AioRpcError as err:
                    results.append(err.code())
            assert results == ["admitted", grpc.StatusCode.RESOURCE_EXHAUSTED]
            url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())
            for call in calls:
                call.cancel()
    assert 'vllm:num_requests_waiting{engine="0",model_name="gpt-oss-20b"} 1.0' in text
    assert 'vllm:num_requests_running{engine="0",model_name="gpt-oss-20b"} 1.0' in text
    assert ('inference_lab_rejections_total{engine="0",model_name="gpt-oss-20b",'
            'reason="QUEUE_SATURATED"} 1.0') in text
    assert 'inference_lab_max_waiting{engine="0",model_name="gpt-oss-20b"} 1.0' in text
    assert "vllm:time_to_first_token_seconds_bucket" in text


async def test_the_update_cap_groups_mid_stream_tokens_but_never_delays_the_first_or_last():
    # 100 updates/s for one stream: at most one every 10 ms, over a ~90 ms reply.
    async with running_engine(update_rate=100.0) as server, engine_stub(server) as stub:
        capped = await collect(stub.Submit(submit_request(max_tokens=200)))
    async with running_engine(update_rate=0.0) as server, engine_stub(server) as stub:
        every_step = await collect(stub.Submit(submit_request(max_tokens=200)))
    for events in (capped, every_step):
        tokens = [e.tokens for e in events if e.HasField("tokens")]
        # The first token is never held back: held for the cap it would come with ~20 more
        # (10 ms of ~0.45 ms steps). It is handed over at its step's end, so a pacer woken
        # late on a busy machine may send a step or two more with it; the exact instant
        # is checked on a virtual clock in test_pacer_wakeups.py.
        assert tokens[0].total_tokens < 10
        assert sum(t.new_tokens for t in tokens) == tokens[-1].total_tokens == 200
        assert events[-1].finished.completion_tokens == 200
    capped_updates = sum(e.HasField("tokens") for e in capped)
    assert capped_updates <= 15  # ~90 ms / 10 ms, plus the first and the last
    assert sum(e.HasField("tokens") for e in every_step) > 3 * capped_updates


async def test_a_session_hears_the_queue_state_first_and_on_every_change():
    async with running_engine(max_waiting=1, max_num_seqs=1) as server, engine_stub(server) as stub:
        call = stub.Session()
        states = []  # every QueueState received, in order (quick flips may merge into one)
        totals, finished = {}, {}
        full, free = ("gpt-oss-20b", True, 1, 1), ("gpt-oss-20b", False, 0, 0)

        async def read_until(predicate):
            while not predicate():
                batch = await call.read()
                states.extend((s.model, s.saturated, s.waiting, s.max_waiting)
                              for s in batch.queue_states)
                totals.update(zip(batch.token_tags, batch.token_totals))
                for event in batch.events:
                    if event.WhichOneof("event") == "finished":
                        finished[event.tag] = event.finished

        async def act(*actions):
            await call.write(pb.SessionActions(actions=list(actions)))

        def open_(tag, max_tokens):
            return pb.SessionAction(open=pb.Open(tag=tag, request=submit_request(max_tokens=max_tokens)))

        await act()  # an empty message starts the call; the first batch announces the model
        await read_until(lambda: states)
        assert states == [free]
        await act(open_(1, 3000))
        await read_until(lambda: totals.get(1) and states[-1] == free)  # 1 runs, none waits
        await act(open_(2, 20))  # 2 waits: with max_waiting 1 the queue is full
        await read_until(lambda: states[-1] == full)
        await act(pb.SessionAction(cancel=pb.Cancel(tag=1)))  # 2 gets the slot
        await read_until(lambda: 2 in finished and states[-1] == free)
        assert finished[2].completion_tokens == 20
        await act(open_(3, 3000))
        await read_until(lambda: totals.get(3) and states[-1] == free)
        await act(open_(4, 20))
        await read_until(lambda: states[-1] == full)
        await stub.SetCapacity(pb.SetCapacityRequest(max_waiting=0))  # unbounded: never full
        await read_until(lambda: states[-1] == free)
        assert set(states) == {full, free}
        # refusals a client made itself on the engine's word are counted as the engine's own
        await act(pb.SessionAction(refused=pb.Refused(model="gpt-oss-20b", count=41)),
                  pb.SessionAction(refused=pb.Refused(model="no-such-model", count=5)))
        async def counted() -> float | None:
            n = await asyncio.to_thread(engine_rejections, server.metrics_port)
            return n if n >= 41 else None

        assert await until(counted, timeout=10, what="the 41 refusals counted") == 41.0
        call.cancel()


def test_the_engine_server_gives_its_cores_kv_cache_metrics_when_asked():
    from factories import deployment
    from inference_lab.engine.service.server import EngineServer

    on = EngineServer([deployment()], "127.0.0.1", 0, None, kv_cache_metrics_sample=1.0)
    off = EngineServer([deployment()], "127.0.0.1", 0, None)
    assert (on.kv_cache_metrics_sample, off.kv_cache_metrics_sample) == (1.0, 0.0)


def test_the_engine_server_gives_its_cores_mfu_metrics_when_asked():
    from factories import deployment
    from inference_lab.engine.service.server import EngineServer

    on = EngineServer([deployment()], "127.0.0.1", 0, None, mfu_metrics=True)
    off = EngineServer([deployment()], "127.0.0.1", 0, None)
    assert (on.mfu_metrics, off.mfu_metrics) == (True, False)

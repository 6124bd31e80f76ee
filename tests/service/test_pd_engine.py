"""P/D disaggregation in one engine over real gRPC: a prefill replica answers a remote-decode
request with a handoff's params and holds its blocks (against its KV capacity) until a
decode replica pulls them; params that point at nothing (an engine id no replica has, a
handoff timed out or pulled already) are recomputed and counted; the roles show on
GetCapacity and /metrics."""

import asyncio
import time
import urllib.request

import grpc
import pytest

from engine_helpers import collect, engine_stub, running_engine
from inference_lab.testing.poll import until
from inference_lab.v1 import engine_pb2 as pb

PROMPT = b"".join(i.to_bytes(4, "little") for i in range(1000, 2500))  # 1,500 tokens


def prefill(replica: int = 0) -> pb.SubmitRequest:
    return pb.SubmitRequest(prompt_token_ids=PROMPT, max_tokens=1, replica=replica,
                            kv_transfer_params=pb.KvTransferParams(do_remote_decode=True))


def decode(params: pb.KvTransferParams, replica: int = 1) -> pb.SubmitRequest:
    return pb.SubmitRequest(prompt_token_ids=PROMPT, max_tokens=4, replica=replica,
                            kv_transfer_params=params)


def series(server, name: str, engine: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics") as resp:
        text = resp.read().decode()
    key = f'{name}{{engine="{engine}",model_name="gpt-oss-20b"}}'
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(key))


async def test_the_decode_replica_pulls_the_prefill_replicas_blocks_and_computes_one_position():
    async with running_engine(replicas=2, kv_roles=("kv_producer", "kv_consumer")) as server, \
            engine_stub(server) as stub:
        rows = {m.replica: m for m in (await stub.GetCapacity(pb.GetCapacityRequest())).models}
        assert (rows[0].kv_role, rows[1].kv_role) == ("kv_producer", "kv_consumer")
        [done] = [e.finished for e in await collect(stub.Submit(prefill())) if e.HasField("finished")]
        params = done.kv_transfer_params
        assert params.do_remote_prefill and not params.do_remote_decode
        assert len(params.remote_block_ids) == 24  # ceil(1500 / 64)
        assert (params.remote_engine_id, params.remote_port) == (rows[0].kv_engine_id, 5600)
        producer = server.fleet.replicas["gpt-oss-20b"][0].runtime.core
        assert producer.handoffs.held_blocks == 24
        assert producer.kv_usage() == pytest.approx(24 / producer.total_blocks)  # held against capacity
        [fin] = [e.finished for e in await collect(stub.Submit(decode(params)))
                 if e.HasField("finished")]
        assert (fin.cached_tokens, fin.external_tokens) == (1499, 1499)
        await until(lambda: producer.handoffs.held_blocks == 0, what="the pull to end")
        assert series(server, "inference_lab_kv_transfer_pulled_total", 0) == 1
        assert series(server, "vllm:external_prefix_cache_hits_total", 1) == 1499
        assert series(server, "inference_lab_kv_transfer_recomputed_total", 1) == 0
        # the same params again: the handoff was pulled already, so the prompt is computed
        [again] = [e.finished for e in await collect(stub.Submit(decode(params)))
                   if e.HasField("finished")]
        assert again.external_tokens == 0
        assert series(server, "inference_lab_kv_transfer_recomputed_total", 1) == 1


async def test_params_of_an_unknown_engine_or_a_timed_out_handoff_are_recomputed_and_counted():
    async with running_engine(replicas=2, kv_roles=("kv_producer", "kv_consumer"),
                              kv_abort_timeout=0.2) as server, \
            engine_stub(server) as stub:
        [done] = [e.finished for e in await collect(stub.Submit(prefill())) if e.HasField("finished")]
        producer = server.fleet.replicas["gpt-oss-20b"][0].runtime.core
        # the abort timeout frees the blocks on an idle producer, counted
        await until(lambda: producer.handoffs.held_blocks == 0, what="the abort timeout")
        assert series(server, "inference_lab_kv_transfer_expired_total", 0) == 1
        stale = pb.KvTransferParams()
        stale.CopyFrom(done.kv_transfer_params)
        unknown = pb.KvTransferParams()
        unknown.CopyFrom(done.kv_transfer_params)
        unknown.remote_engine_id = "no-such-engine"
        for params in (stale, unknown):
            [fin] = [e.finished for e in await collect(stub.Submit(decode(params)))
                     if e.HasField("finished")]
            assert (fin.external_tokens, fin.completion_tokens) == (0, 4)
        assert series(server, "inference_lab_kv_transfer_recomputed_total", 1) == 2
        assert series(server, "vllm:external_prefix_cache_hits_total", 1) == 0


async def test_without_kv_roles_the_params_are_ignored_as_vllm_without_a_connector():
    async with running_engine() as server, engine_stub(server) as stub:
        [row] = (await stub.GetCapacity(pb.GetCapacityRequest())).models
        assert row.kv_role == ""
        [done] = [e.finished for e in await collect(stub.Submit(prefill())) if e.HasField("finished")]
        assert not done.HasField("kv_transfer_params")
        assert server.fleet.replicas["gpt-oss-20b"][0].runtime.core.handoffs.held_blocks == 0


async def test_a_pull_must_present_the_handoffs_prompt_and_another_prompt_is_recomputed():
    async with running_engine(replicas=2, kv_roles=("kv_producer", "kv_consumer")) as server, \
            engine_stub(server) as stub:
        [done] = [e.finished for e in await collect(stub.Submit(prefill())) if e.HasField("finished")]
        params = done.kv_transfer_params
        assert len(params.remote_request_id) == 32  # random, not a counter
        other = pb.SubmitRequest(prompt_token_ids=PROMPT[4:] + PROMPT[:4], max_tokens=4,
                                 replica=1, kv_transfer_params=params)
        [stolen] = [e.finished for e in await collect(stub.Submit(other)) if e.HasField("finished")]
        assert stolen.external_tokens == 0  # a miss: computed here
        assert series(server, "inference_lab_kv_transfer_recomputed_total", 1) == 1
        producer = server.fleet.replicas["gpt-oss-20b"][0].runtime.core
        assert producer.handoffs.held_blocks == 24  # still the victim's
        [fin] = [e.finished for e in await collect(stub.Submit(decode(params)))
                 if e.HasField("finished")]
        assert fin.external_tokens == 1499


async def test_prefills_past_the_hold_cap_are_refused_and_a_short_request_is_answered_in_time():
    from engine_helpers import default_deployments
    from inference_lab.engine.sim.kv import total_blocks

    long = 130_000  # 2,032 blocks of 64
    share = 2 * 2032 / total_blocks(default_deployments("b200", None)[0])  # two of them
    async with running_engine(kv_roles=("kv_both",), kv_hold_share=share + 1e-9) as server, \
            engine_stub(server) as stub:
        attack = [stub.Submit(pb.SubmitRequest(
            prompt_tokens=long, max_tokens=1,
            kv_transfer_params=pb.KvTransferParams(do_remote_decode=True))) for _ in range(4)]
        outcomes = []
        for call in attack:
            try:
                outcomes.append((await call.read()).HasField("admitted"))
            except grpc.aio.AioRpcError as exc:
                assert exc.code() is grpc.StatusCode.UNAVAILABLE
                assert "KV transfer capacity exhausted" in exc.details()
                outcomes.append(False)
        assert outcomes.count(True) == 2 and outcomes.count(False) == 2
        # while the two admitted prefills run and hold: a 5-token request is answered by
        # the wall clock within its modelled e2e (plus the hops of a shared host)
        start = time.monotonic()
        [short] = [e.finished for e in await collect(stub.Submit(pb.SubmitRequest(
            prompt_tokens=5, max_tokens=1))) if e.HasField("finished")]
        wall = time.monotonic() - start
        assert short.completion_tokens == 1 and wall < short.e2e_s + 0.5, (wall, short.e2e_s)
        await asyncio.gather(*(collect(call) for call, ok in zip(attack, outcomes) if ok))
        producer = server.fleet.replicas["gpt-oss-20b"][0].runtime.core
        assert producer.handoffs.held_blocks == 2 * 2032
        assert series(server, "inference_lab_kv_transfer_pending_blocks", 0) == 2 * 2032


async def test_the_gateway_answers_the_hold_caps_refusal_with_a_503_kv_transfer_full():
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer
    from inference_lab.gateway import create_app

    async with running_engine(kv_roles=("kv_both",), kv_hold_share=1e-9) as engine:  # 1 block
        async with TestServer(create_app(f"127.0.0.1:{engine.port}")) as server, \
                ClientSession() as http:
            url = f"http://127.0.0.1:{server.port}/v1/completions"
            body = {"model": "gpt-oss-20b", "prompt": [11] * 130, "max_tokens": 1,
                    "kv_transfer_params": {"do_remote_decode": True}}
            resp = await http.post(url, json=body)
            error = (await resp.json())["error"]
            assert resp.status == 503, error
            assert (error["type"], error["code"]) == ("server_error", "kv_transfer_full")
            assert "KV transfer capacity exhausted" in error["message"]
            del body["kv_transfer_params"]  # the same prompt without a handoff: served
            assert (await http.post(url, json=body)).status == 200

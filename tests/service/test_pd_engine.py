"""P/D disaggregation in one engine over real gRPC: a prefill replica answers a remote-decode
request with a handoff's params and holds its blocks (against its KV capacity) until a
decode replica pulls them; params that point at nothing (an engine id no replica has, a
handoff timed out or pulled already) are recomputed and counted; the roles show on
GetCapacity and /metrics."""

import urllib.request

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

"""KV-cache events over real ZMQ: a SUB socket (and vLLM's replay request on a DEALER)
rebuilds the engine's cached-block set from the events alone, exactly; the payload is
decoded with the independent `msgpack` package to check vLLM's wire layout."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import socket

import msgpack
import msgspec
import pytest
import zmq
import zmq.asyncio
from engine_helpers import engine_stub, running_engine

from inference_lab.testing.poll import until
from inference_lab.engine.fleet.replicas import MAX_REPLICAS
from inference_lab.engine.service.kv_events import (
    KVEventsConfig, KVEventsConfigError, bound_ports, offset_endpoint, replica_stride,
)
from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.sim.kv import bytes_per_token
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.common.ports import free_port, free_port_run, port_clashes

BLOCKS = 96  # a small KV cache, so that the workload evicts


def small_cache_deployments():
    deployments = default_deployments("b200")
    for d in deployments:
        d.scheduler = dataclasses.replace(  # SchedulerConfig is frozen
            d.scheduler, kv_cache_capacity=int(bytes_per_token(d) * d.scheduler.block_size * BLOCKS))
    return deployments


class Follower:
    """What a KV-aware router keeps: the replica's cached block hashes, from events."""

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank  # the replica whose events these must be
        self.blocks: set[int] = set()
        self.next_seq = 0
        self.layouts: set[tuple[str, tuple]] = set()  # (event type, its keys) seen

    def apply(self, seq: int, payload: bytes) -> None:
        if seq < self.next_seq:
            return  # already applied (a replayed batch also received live)
        assert seq == self.next_seq, f"gap: expected batch {self.next_seq}, got {seq}"
        self.next_seq = seq + 1
        ts, events, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and rank == self.rank
        for event in events:  # maps tagged by "type", as vLLM's msgspec structs encode them
            self.layouts.add((event["type"], tuple(sorted(event))))
            if event["type"] == "BlockStored":
                hashes, parent = event["block_hashes"], event["parent_block_hash"]
                assert event["block_size"] == 64 and len(event["token_ids"]) == 64 * len(hashes)
                assert event["lora_id"] is None and event["lora_name"] is None
                assert event["medium"] == "GPU"
                assert parent is None or parent in self.blocks
                self.blocks.update(hashes)
            elif event["type"] == "BlockRemoved":
                hashes = event["block_hashes"]
                assert event["medium"] == "GPU" and set(hashes) <= self.blocks
                self.blocks.difference_update(hashes)
            elif event["type"] == "AllBlocksCleared":
                self.blocks.clear()


async def workload(stub, seed: int, replica: int = 0) -> None:
    """6 waves of 8 concurrent requests on one replica, most sharing a system prompt."""
    rng = random.Random(seed)
    system = rng.randbytes(4 * 64 * 5)  # a 5-block system prompt most requests share

    async def one(i: int) -> None:
        tail = rng.randbytes(4 * rng.randint(30, 700))
        prompt = (system if i % 3 else b"") + tail
        call = stub.Submit(pb.SubmitRequest(prompt_token_ids=prompt, replica=replica,
                                            max_tokens=rng.randint(1, 30)))
        async for _ in call:
            pass

    for wave in range(6):  # bounded
        await asyncio.gather(*(one(8 * wave + i) for i in range(8)))


async def received(ctx, sub, replay_port: int, topic: bytes) -> list[tuple[int, bytes]]:
    """Every batch one replica published: what reached the SUB socket live (the first ones
    may have gone before the subscription took hold: PUB drops for absent subscribers),
    then its replay socket fills the gap, as vLLM's subscriber example does."""
    live = []
    while await sub.poll(500):
        got_topic, seq, payload = await sub.recv_multipart()
        assert got_topic == topic
        live.append((int.from_bytes(seq, "big"), payload))
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    await dealer.send_multipart((b"", (0).to_bytes(8, "big")))
    replayed = []
    while True:
        assert await dealer.poll(5000), "no replay answer"
        _, seq, payload = await dealer.recv_multipart()
        if seq == (-1).to_bytes(8, "big", signed=True):
            break
        replayed.append((int.from_bytes(seq, "big"), payload))
    dealer.close(0)
    assert replayed and replayed[0][0] == 0
    return sorted(replayed + live)


def events_config(pub: int, replay: int) -> KVEventsConfig:
    return KVEventsConfig.parse(json.dumps({
        "enable_kv_cache_events": True, "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}",
        "topic": "kv@lab@{model}"}))


async def test_a_subscriber_rebuilds_the_cached_block_set_exactly():
    pub, replay = free_port(), free_port()
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    follower = Follower()
    try:
        async with running_engine(deployments=small_cache_deployments(),
                                  kv_events=events_config(pub, replay)) as engine:
            sub.connect(f"tcp://127.0.0.1:{pub}")
            async with engine_stub(engine) as stub:
                await workload(stub, 3)
            expected = set(engine.runtimes[0].core.prefix_cache.refs)
            batches = await received(ctx, sub, replay, b"kv@lab@gpt-oss-20b")
    finally:
        sub.close(0)
        ctx.term()
    for seq, payload in batches:
        follower.apply(seq, payload)
    assert follower.next_seq == batches[-1][0] + 1
    # vLLM's fields and no others (those it gives defaults are left out when unset)
    assert ("BlockRemoved", ("block_hashes", "medium", "type")) in follower.layouts  # evicted
    assert ("BlockStored", ("block_hashes", "block_size", "lora_id", "lora_name", "medium",
                            "parent_block_hash", "token_ids", "type")) in follower.layouts
    assert follower.blocks == expected and len(expected) > 0


@pytest.mark.parametrize("data_parallel", [False, True], ids=["replicas", "dp-ranks"])
async def test_each_replica_publishes_its_own_events_on_its_own_port(data_parallel):
    # independent replicas are servers of their own: every batch says rank 0; the ranks
    # of one data-parallel server say their rank (vLLM's data_parallel_rank)
    replicas = 3
    pub = free_port_run(2 * replicas)  # and replay = pub + 1: replica i on pub + 2i, pub + 1 + 2i
    replay = pub + 1
    ctx = zmq.asyncio.Context()
    subs = []
    for i in range(replicas):  # one subscriber per replica, on the base port + i
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{pub + 2 * i}")
        subs.append(sub)
    try:
        async with running_engine(deployments=small_cache_deployments(), replicas=replicas,
                                  kv_events=events_config(pub, replay),
                                  data_parallel=data_parallel) as engine:
            async with engine_stub(engine) as stub:  # a different workload on each
                await asyncio.gather(*(workload(stub, 10 + i, i) for i in range(replicas)))
            expected = {rt.replica: set(rt.core.prefix_cache.refs) for rt in engine.runtimes}
            batches = [await received(ctx, subs[i], replay + 2 * i, b"kv@lab@gpt-oss-20b")
                       for i in range(replicas)]
            assert sorted(engine.kv_events._open) == list(range(replicas))
        assert engine.kv_events is None  # every publisher closed with the engine
    finally:
        for sub in subs:
            sub.close(0)
        ctx.term()
    for i in range(replicas):
        follower = Follower(rank=i if data_parallel else 0)
        for seq, payload in batches[i]:
            follower.apply(seq, payload)  # its own sequence, from 0, without a gap
        assert follower.blocks == expected[i] and len(expected[i]) > 0
    assert expected[0] != expected[1] != expected[2]  # the sets really are the replicas' own


async def test_a_drained_replica_closes_its_publisher():
    pub = free_port_run(4)
    async with running_engine(deployments=small_cache_deployments(), replicas=2,
                              kv_events=events_config(pub, pub + 1)) as engine:
        assert engine.kv_events.publisher(1).endpoint == f"tcp://127.0.0.1:{pub + 2}"
        async with engine_stub(engine) as stub:
            await stub.SetReplicas(pb.SetReplicasRequest(replicas=1))
        await until(lambda: engine.kv_events.publisher(1) is None, what="replica 1's publisher closed")
        def port_free() -> bool:  # ZMQ's I/O thread closes the socket a moment later
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", pub + 2))
                except OSError:
                    return False
                return True

        await until(port_free, timeout=5, what="replica 1's port free again")
        assert engine.kv_events.publisher(0) is not None


def test_replicas_offset_the_port_as_vllm_offsets_data_parallel_ranks():
    assert offset_endpoint("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert offset_endpoint("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_endpoint("tcp://127.0.0.1:5557", 2, stride=2) == "tcp://127.0.0.1:5561"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    # any free port stays any free port for every replica (0 + 1 would bind port 1)
    assert offset_endpoint("tcp://127.0.0.1:0", 1) == "tcp://127.0.0.1:0"
    assert offset_endpoint("tcp://127.0.0.1:*", 3) == "tcp://127.0.0.1:*"


def config(endpoint: str, replay: str | None) -> KVEventsConfig:
    return KVEventsConfig(enable_kv_cache_events=True, endpoint=endpoint, replay_endpoint=replay)


@pytest.mark.parametrize("pub, replay, stride", [
    (5557, 5558, 2),  # vLLM's documented pair: 5557 + 1 would be replica 0's replay port
    (5558, 5557, 2), (5557, 5560, 6), (5557, 5557 + 63, 126),
    (5557, 5557 + 64, 1), (5557, 6557, 1),  # 64 apart or more: vLLM's offsets, unchanged
])
def test_no_two_replicas_ports_ever_meet_up_to_the_most_replicas(pub, replay, stride):
    cfg = config(f"tcp://*:{pub}", f"tcp://*:{replay}")
    assert replica_stride(cfg) == stride
    ports = [port for _, port in bound_ports(cfg, MAX_REPLICAS)]
    assert len(ports) == 2 * MAX_REPLICAS and len(set(ports)) == len(ports)
    assert ports[:4] == [pub, replay, pub + stride, replay + stride]


def test_only_fixed_bound_tcp_ports_are_checked():
    assert bound_ports(config("tcp://127.0.0.1:0", "tcp://127.0.0.1:5558"), 3) == [
        ("replica 0's KV replay port", 5558), ("replica 1's KV replay port", 5559),
        ("replica 2's KV replay port", 5560)]
    assert bound_ports(config("tcp://10.0.0.5:5557", None), 3) == []  # connected, not bound
    assert bound_ports(config("ipc:///tmp/kv", "ipc:///tmp/replay"), 3) == []
    off = KVEventsConfig(enable_kv_cache_events=False, endpoint="tcp://*:5557")
    assert bound_ports(off, 3) == []


def test_clashing_ports_are_named_and_out_of_range_ones_too():
    assert port_clashes([("a", 8080), ("b", 8081)]) == []
    assert port_clashes([("a", 8080), ("b", 8081), ("c", 8080), ("d", 70000)]) == [
        "d would be 70000, outside 1..65535", "port 8080 is both a and c"]


@pytest.mark.parametrize("text, message", [
    ("{", "is not JSON"),
    ("[]", "must be a JSON object"),
    ('{"enable_kv_cache_events": "yes"}', "enable_kv_cache_events has the wrong type"),
    ('{"endpont": "tcp://127.0.0.1:1"}', "unknown key 'endpont'"),
    ('{"publisher": "kafka"}', "publisher must be 'zmq' or 'null'"),
    ('{"endpoint": "127.0.0.1:5557"}', "endpoint must be a tcp://"),
    ('{"hwm": 0}', "hwm must be at least 1"),
])
def test_a_bad_kv_events_config_names_what_is_wrong(text, message):
    with pytest.raises(KVEventsConfigError, match=message):
        KVEventsConfig.parse(text)


def test_an_adapters_blocks_carry_its_id_and_name_and_the_batch_stays_an_array():
    from inference_lab.engine.service.kv_events import KVEventBatch, wire_events
    from inference_lab.engine.sim.prefix_cache import REMOVED, STORED

    tokens = bytes(range(8)) * 2  # four uint32 token IDs
    recorded = [(STORED, [11, 12], 10, tokens, 3), (STORED, [13], None, tokens[:8], None),
                (REMOVED, [11])]
    events = wire_events(recorded, 2, {3: "sql-lora"}.get)
    ts, (adapter, base, removed), rank = msgpack.unpackb(
        msgspec.msgpack.encode(KVEventBatch(1.5, events, 2)))
    assert (ts, rank) == (1.5, 2)
    assert adapter == {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": 10,
                       "token_ids": [0x03020100, 0x07060504, 0x03020100, 0x07060504],
                       "block_size": 2, "lora_id": 3, "medium": "GPU", "lora_name": "sql-lora"}
    assert (base["lora_id"], base["lora_name"], base["token_ids"]) == (None, None, [0x03020100, 0x07060504])
    assert removed == {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"}


@pytest.mark.parametrize("expose", [False, True])
async def test_the_replay_socket_binds_loopback_unless_exposed_and_exposure_is_logged(
        caplog, expose):
    """A replay hands any caller the recent prompts' token IDs: a replay endpoint on every
    interface binds 127.0.0.1 (same port) by default, and any endpoint beyond loopback is a
    warning."""
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint="tcp://127.0.0.1:0",
                            replay_endpoint="tcp://*:0")
    extra = {"kv_events_expose_replay": True} if expose else {}
    with caplog.at_level("WARNING", logger="inference_lab.engine.service.kv_events"):
        async with running_engine(kv_events=config, **extra) as engine:
            replay = engine.kv_events.publisher(0).replay_endpoint
            assert replay.startswith("tcp://0.0.0.0:" if expose else "tcp://127.0.0.1:")
            dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            dealer.linger = 0
            try:  # the loopback replay answers as before
                dealer.connect("tcp://127.0.0.1:" + replay.rpartition(":")[2])
                await dealer.send_multipart((b"", (0).to_bytes(8, "big")))
                _, seq, _ = await asyncio.wait_for(dealer.recv_multipart(), 5)
                assert seq == (-1).to_bytes(8, "big", signed=True)  # nothing buffered yet
            finally:
                dealer.close()
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert ("beyond loopback and without authentication" in warned) == expose
    assert ("replays on 127.0.0.1, not tcp://*:0" in warned) == (not expose)

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
import pytest
import zmq
import zmq.asyncio
from engine_helpers import engine_stub, running_engine

from inference_lab.testing.poll import until
from inference_lab.engine.service.kv_events import KVEventsConfig, KVEventsConfigError, offset_endpoint
from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.sim.kv import bytes_per_token
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.common.ports import free_port, free_port_run

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
        self.layouts: set[tuple[str, int]] = set()  # (event name, item count) seen

    def apply(self, seq: int, payload: bytes) -> None:
        if seq < self.next_seq:
            return  # already applied (a replayed batch also received live)
        assert seq == self.next_seq, f"gap: expected batch {self.next_seq}, got {seq}"
        self.next_seq = seq + 1
        ts, events, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and rank == self.rank
        for event in events:
            self.layouts.add((event[0], len(event)))
            if event[0] == "BlockStored":
                _, hashes, parent, token_ids, block_size, lora_id, medium = event
                assert block_size == 64 and len(token_ids) == 64 * len(hashes)
                assert lora_id is None and medium == "GPU"
                assert parent is None or parent in self.blocks
                self.blocks.update(hashes)
            elif event[0] == "BlockRemoved":
                _, hashes, medium = event
                assert set(hashes) <= self.blocks
                self.blocks.difference_update(hashes)
            elif event[0] == "AllBlocksCleared":
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
    assert ("BlockRemoved", 3) in follower.layouts  # the small cache evicted
    assert ("BlockStored", 7) in follower.layouts
    assert follower.blocks == expected and len(expected) > 0


async def test_each_replica_publishes_its_own_events_on_its_own_port():
    replicas = 3
    pub, replay = free_port_run(replicas), free_port_run(replicas)
    ctx = zmq.asyncio.Context()
    subs = []
    for i in range(replicas):  # one subscriber per replica, on the base port + i
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{pub + i}")
        subs.append(sub)
    try:
        async with running_engine(deployments=small_cache_deployments(), replicas=replicas,
                                  kv_events=events_config(pub, replay)) as engine:
            async with engine_stub(engine) as stub:  # a different workload on each
                await asyncio.gather(*(workload(stub, 10 + i, i) for i in range(replicas)))
            expected = {rt.replica: set(rt.core.prefix_cache.refs) for rt in engine.runtimes}
            batches = [await received(ctx, subs[i], replay + i, b"kv@lab@gpt-oss-20b")
                       for i in range(replicas)]
            assert sorted(engine.kv_events._open) == list(range(replicas))
        assert engine.kv_events is None  # every publisher closed with the engine
    finally:
        for sub in subs:
            sub.close(0)
        ctx.term()
    for i in range(replicas):
        follower = Follower(rank=i)  # every batch carries its replica's index
        for seq, payload in batches[i]:
            follower.apply(seq, payload)  # its own sequence, from 0, without a gap
        assert follower.blocks == expected[i] and len(expected[i]) > 0
    assert expected[0] != expected[1] != expected[2]  # the sets really are the replicas' own


async def test_a_drained_replica_closes_its_publisher():
    pub = free_port_run(2)
    async with running_engine(deployments=small_cache_deployments(), replicas=2,
                              kv_events=events_config(pub, free_port_run(2))) as engine:
        assert engine.kv_events.publisher(1).endpoint == f"tcp://127.0.0.1:{pub + 1}"
        async with engine_stub(engine) as stub:
            await stub.SetReplicas(pb.SetReplicasRequest(replicas=1))
        await until(lambda: engine.kv_events.publisher(1) is None, what="replica 1's publisher closed")
        def port_free() -> bool:  # ZMQ's I/O thread closes the socket a moment later
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", pub + 1))
                except OSError:
                    return False
                return True

        await until(port_free, timeout=5, what="replica 1's port free again")
        assert engine.kv_events.publisher(0) is not None


def test_replicas_offset_the_port_as_vllm_offsets_data_parallel_ranks():
    assert offset_endpoint("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert offset_endpoint("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    # any free port stays any free port for every replica (0 + 1 would bind port 1)
    assert offset_endpoint("tcp://127.0.0.1:0", 1) == "tcp://127.0.0.1:0"
    assert offset_endpoint("tcp://127.0.0.1:*", 3) == "tcp://127.0.0.1:*"


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

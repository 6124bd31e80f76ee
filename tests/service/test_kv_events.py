"""KV-cache events over real ZMQ: a SUB socket (and vLLM's replay request on a DEALER)
rebuilds the engine's cached-block set from the events alone, exactly; the payload is
decoded with the independent `msgpack` package to check vLLM's wire layout."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import msgpack
import pytest
import zmq
import zmq.asyncio
from engine_helpers import engine_stub, running_engine

from inference_lab.engine.service.kv_events import KVEventsConfig, KVEventsConfigError, offset_endpoint
from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.sim.kv import bytes_per_token
from inference_lab.v1 import engine_pb2 as pb
from inference_lab.common.ports import free_port

BLOCKS = 96  # a small KV cache, so that the workload evicts


def small_cache_deployments():
    deployments = default_deployments("b200")
    for d in deployments:
        d.scheduler = dataclasses.replace(  # SchedulerConfig is frozen
            d.scheduler, kv_cache_capacity=int(bytes_per_token(d) * d.scheduler.block_size * BLOCKS))
    return deployments


class Follower:
    """What a KV-aware router keeps: the replica's cached block hashes, from events."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()
        self.next_seq = 0
        self.layouts: set[tuple[str, int]] = set()  # (event name, item count) seen

    def apply(self, seq: int, payload: bytes) -> None:
        if seq < self.next_seq:
            return  # already applied (a replayed batch also received live)
        assert seq == self.next_seq, f"gap: expected batch {self.next_seq}, got {seq}"
        self.next_seq = seq + 1
        ts, events, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and rank == 0
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


async def test_a_subscriber_rebuilds_the_cached_block_set_exactly():
    pub, replay = free_port(), free_port()
    config = KVEventsConfig.parse(json.dumps({
        "enable_kv_cache_events": True, "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}",
        "topic": "kv@lab@{model}"}))
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    follower = Follower()
    rng = random.Random(3)
    system = rng.randbytes(4 * 64 * 5)  # a 5-block system prompt most requests share
    try:
        async with running_engine(deployments=small_cache_deployments(), kv_events=config) as engine:
            sub.connect(f"tcp://127.0.0.1:{pub}")
            async with engine_stub(engine) as stub:
                async def one(i: int) -> None:
                    tail = rng.randbytes(4 * rng.randint(30, 700))
                    prompt = (system if i % 3 else b"") + tail
                    call = stub.Submit(pb.SubmitRequest(prompt_token_ids=prompt,
                                                        max_tokens=rng.randint(1, 30)))
                    async for _ in call:
                        pass

                for wave in range(6):  # bounded: 6 waves of 8 concurrent requests
                    await asyncio.gather(*(one(8 * wave + i) for i in range(8)))
            core = engine.runtimes[0].core
            expected = set(core.prefix_cache.refs)
            # Live batches: whatever reached us (the first ones may have been sent before
            # the subscription took hold: PUB drops for absent subscribers).
            live = []
            while await sub.poll(500):
                topic, seq, payload = await sub.recv_multipart()
                assert topic == b"kv@lab@gpt-oss-20b"
                live.append((int.from_bytes(seq, "big"), payload))
            # The replay socket fills the gap, as vLLM's subscriber example does.
            dealer = ctx.socket(zmq.DEALER)
            dealer.connect(f"tcp://127.0.0.1:{replay}")
            await dealer.send_multipart((b"", (0).to_bytes(8, "big")))
            replayed = []
            while True:
                assert await dealer.poll(5000), "no replay answer"
                _, seq, payload = await dealer.recv_multipart()
                if seq == (-1).to_bytes(8, "big", signed=True):
                    break
                replayed.append((int.from_bytes(seq, "big"), payload))
            dealer.close(0)
    finally:
        sub.close(0)
        ctx.term()
    assert replayed and replayed[0][0] == 0
    for seq, payload in sorted(replayed + live):
        follower.apply(seq, payload)
    assert follower.next_seq == max(s for s, _ in replayed + live) + 1
    assert ("BlockRemoved", 3) in follower.layouts  # the small cache evicted
    assert ("BlockStored", 7) in follower.layouts
    assert follower.blocks == expected and len(expected) > 0


def test_replicas_offset_the_port_as_vllm_offsets_data_parallel_ranks():
    assert offset_endpoint("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert offset_endpoint("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"


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

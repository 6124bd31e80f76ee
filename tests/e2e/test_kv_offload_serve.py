"""KV offloading on the real `serve` (engine.sim.offload): a prompt's KV stored to the GPU,
pushed out of the GPU by other prompts, shows up on the KV event stream as the host
tier's BlockStored (medium CPU) with the hash the GPU's event carried; the same prompt
again loads it from the host (fewer prompt tokens computed, a shorter TTFT), and the
offload series say so. A real ZMQ subscriber decodes the batches with msgpack; the
client is the official openai SDK."""

from __future__ import annotations

import json
import time

import aiohttp
import msgpack
import pytest
import zmq
from openai import OpenAI

from inference_lab.common.ports import free_port
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import until
from inference_lab.testing.routers import metric

pytestmark = pytest.mark.timeout(120)

MODEL = "gpt-oss-20b"
# a 120-block GPU cache (block 64, 24,576 B per position): two 3,000-token prompts fill it
CONFIG = f"""model = "{MODEL}"
[scheduler]
block_size = 64
kv_cache_capacity = {24576 * 64 * 120}
[hardware.b200]
"""


def text(seed: int, n: int = 3000) -> str:
    """A prompt of its own of about n tokens (the built-in tokenizer packs 4 bytes a token)."""
    return "".join(chr(0x61 + (seed * 7 + i * 13 + i // 5) % 26) for i in range(4 * n))


class Events:
    """A SUB socket on the engine's KV events, every batch decoded."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.events: list[dict] = []

    def drain(self) -> list[dict]:
        while self.sub.poll(0):
            _topic, _seq, payload = self.sub.recv_multipart()
            ts, events, rank = msgpack.unpackb(payload)
            self.events.extend(events)
        return self.events

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()


def ttft(client: OpenAI, prompt: str) -> float:
    start = time.perf_counter()
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, stream=True)
    first = None
    for _ in stream:
        if first is None:
            first = time.perf_counter() - start
    return first


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    config = tmp_path_factory.mktemp("offload") / f"{MODEL}.toml"
    config.write_text(CONFIG)
    kv = free_port()
    events = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{kv}"})
    # modelled time 50x slower than the wall: a prefill's few ms are wall tenths of a second
    with serve("--config", str(config), "--kv-offloading-size", "1", "--kv-events-config", events,
               "--time-scale", "0.02") as served:
        yield served, f"tcp://127.0.0.1:{kv}"


async def test_an_evicted_prompt_is_stored_to_cpu_then_loaded_from_it(lab):
    served, endpoint = lab
    sub = Events(endpoint)
    client = OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="none")
    try:
        # the subscription has reached the publisher once a short prompt's events arrive
        probes = iter(range(100, 200))
        await until(lambda: (client.completions.create(model=MODEL, prompt=text(next(probes), 70),
                                                       max_tokens=1), sub.drain())[1], timeout=10)
        sub.events.clear()
        miss = ttft(client, text(1))
        gpu = await until(lambda: [e for e in sub.drain()
                             if e["type"] == "BlockStored" and e["medium"] == "GPU"], timeout=10)
        first_block = gpu[0]["block_hashes"][0]
        for seed in range(2, 5):  # push it out of the 120-block GPU cache
            client.completions.create(model=MODEL, prompt=text(seed), max_tokens=1)

        def seen(kind: str, medium: str) -> bool:
            return any(e["type"] == kind and e["medium"] == medium
                       and first_block in e["block_hashes"] for e in sub.drain())

        await until(lambda: seen("BlockRemoved", "GPU"), timeout=10)
        await until(lambda: seen("BlockStored", "CPU"), timeout=10)
        cpu = next(e for e in sub.events if e["type"] == "BlockStored" and e["medium"] == "CPU"
                   and e["block_hashes"] == [first_block])
        assert (cpu["parent_block_hash"], cpu["token_ids"], cpu["block_size"]) == (None, [], 0)
        hit = ttft(client, text(1))
        assert hit < miss
    finally:
        sub.close()
    url = f"http://127.0.0.1:{served.port}/metrics"
    async with aiohttp.ClientSession() as http:
        host = await metric(http, url, "vllm:prompt_tokens_cached_by_source_total", source="host")
        loaded = await metric(http, url, "vllm:kv_offload_load_bytes_total")
        stored = await metric(http, url, "vllm:kv_offload_store_bytes_total")
        chunks = await metric(http, url, "vllm:kv_offload_config_info", cpu_num_chunks="682")
        external = await metric(http, url, "vllm:prompt_tokens_by_source_total",
                                source="external_kv_transfer")
        info = await metric(http, url, "vllm:cache_config_info", kv_offloading_size="1.0",
                            kv_offloading_backend="native")
    # the 3,000-token prompt (plus the completions template) holds 46 full blocks; all of
    # them came from the host tier (the GPU held none of it any more)
    assert host >= 46 * 64 and host % 64 in (0, 63) and external == host
    assert loaded == (host // 64 + (host % 64 == 63)) * 64 * 24576
    assert stored > loaded
    # 1 GiB / 1,572,864 B per chunk = 682 chunks
    assert chunks == 1.0 and info == 1.0

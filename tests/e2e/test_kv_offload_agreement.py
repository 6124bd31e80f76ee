"""A small multi-turn load on the real `serve --kv-offloading-size` and on the offline
engine core agree request by request on where each prompt's cached tokens came from: the
GPU prefix cache or the host tier. Four conversations take turns on a GPU cache of 120
blocks, so each one's history has left the GPU by its next turn and comes back from the
host. The served side is read as a client reads it (the official openai SDK's usage, the
render API's token IDs, the /metrics counters); the offline side is the simulation core
fed the same token IDs in the same order."""

from __future__ import annotations

import struct

import aiohttp
import pytest
from openai import OpenAI

from inference_lab.common.conversations import Conversations
from inference_lab.engine.sim.config import load_deployment
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.offload import from_flags
from inference_lab.experiments.prompts import token_text
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import until
from inference_lab.testing.routers import metric

USERS, TURNS, OUTPUT = 4, 3, 8
MODEL = "gpt-oss-20b"
# a GPU cache of 120 blocks of 64 positions at 24,576 B each, and a 1 GiB host tier
# (682 chunks) beside it
GPU_BYTES = 120 * 64 * 24576
CONFIG = (f'model = "{MODEL}"\n[hardware.b200]\n'
          f"[scheduler]\nkv_cache_capacity = {GPU_BYTES}\nblock_size = 64\n")

pytestmark = pytest.mark.timeout(180)


def prompts() -> list[str]:
    """Turn after turn, the users in order: 12 prompts of 2,400 to 7,200 tokens."""
    convs = Conversations(shared_prefix_len=0, num_shared_prefixes=1, num_turns=TURNS, seed=7)
    return [token_text(convs.next_prompt(user, 2400, OUTPUT))
            for _ in range(TURNS) for user in range(USERS)]


def offline(config, ids: list[list[int]]) -> list[tuple[int, int]]:
    """(cached tokens, of which from the host) per request, each sent when the last ended."""
    dep = load_deployment(config, "b200")
    dep.offload = from_flags(1.0)
    core, now, out = EngineCore(dep), 0.0, []
    for tokens in ids:
        req = core.submit(0, OUTPUT, now + 1.0, token_ids=struct.pack(f"<{len(tokens)}I", *tokens))
        while (t := core.next_event_time()) is not None:
            now = core.step(t).end
        out.append((req.cached_tokens, req.offload.host_tokens))
    return out


async def test_served_and_offline_agree_per_request_on_device_and_host_hits(tmp_path):
    config = tmp_path / f"{MODEL}.toml"
    config.write_text(CONFIG)
    served_hits, ids = [], []
    with serve("--config", str(config), "--kv-offloading-size", "1") as lab:
        client = OpenAI(base_url=f"http://127.0.0.1:{lab.port}/v1", api_key="none", max_retries=0)
        url = f"http://127.0.0.1:{lab.port}"
        async with aiohttp.ClientSession() as http:
            async def counters() -> tuple[float, float]:
                return (await metric(http, url + "/metrics", "vllm:prompt_tokens_total"),
                        await metric(http, url + "/metrics", "vllm:prompt_tokens_cached_by_source_total",
                                     source="host"))

            for text in prompts():
                async with http.post(url + "/v1/completions/render",
                                     json={"model": MODEL, "prompt": text}) as reply:
                    body = await reply.json()
                ids.append((body[0] if isinstance(body, list) else body)["token_ids"])
                prompt0, host0 = await counters()
                done = client.completions.create(model=MODEL, prompt=text, max_tokens=OUTPUT)
                assert done.usage.prompt_tokens == len(ids[-1])
                assert done.usage.completion_tokens == OUTPUT
                # the counters of the request's first token, scraped once they show it
                prompt1, host1 = await until(
                    lambda: _counted(counters, prompt0 + done.usage.prompt_tokens), timeout=10)
                served_hits.append((done.usage.prompt_tokens_details.cached_tokens, int(host1 - host0)))
    expected = offline(config, ids)
    assert served_hits == expected
    # the first turns computed everything; every later turn found its history (its last
    # prompt's full blocks: 37 of 64 tokens at turn 2, 75 at turn 3) on the host, the first
    # user's second turn partly still on the GPU too
    assert served_hits[:USERS] == [(0, 0)] * USERS
    assert [c for c, _ in served_hits[USERS:]] == [37 * 64] * USERS + [75 * 64] * USERS
    assert all(host >= 1000 for _, host in served_hits[USERS:]), served_hits
    assert 0 < served_hits[USERS][1] < served_hits[USERS][0], served_hits


async def _counted(counters, prompt_total: float):
    values = await counters()
    return values if values[0] >= prompt_total else None

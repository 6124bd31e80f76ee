"""vllm-router's P/D mode (`--vllm-pd-disaggregation --kv-connector nixl`) in front of the
real `serve --replicas 2 --kv-roles 1:1`, the official openai SDK as the client: the
router sends the prefill with `do_remote_decode`, the prefill replica answers with a
handoff's kv_transfer_params (so the router has nothing to warn about), and the decode
replica pulls the prompt's KV instead of computing it (external prefix cache hits, none
recomputed), its modelled pull exactly the transfer model's; the prefill replica frees
the blocks once pulled."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from inference_lab.engine.sim.catalog import load_hardware, load_model
from inference_lab.engine.sim.kv import bytes_per_token
from inference_lab.engine.sim.specs import Deployment, SchedulerConfig
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import until
from inference_lab.testing.routers import MODEL, metric, pd_router, router_command, system_prompt

pytestmark = [pytest.mark.skipif(router_command() is None,
                                 reason="vllm-router not installed (pip install vllm-router)"),
              pytest.mark.timeout(120)]

PROMPT_TOKENS = 1500


@pytest.fixture(scope="module")
def pd_lab():
    """Replica 0 kv_producer, replica 1 kv_consumer, pulls over the default link (rdma)."""
    with serve("--replicas", "2", "--kv-roles", "1:1", ports=2) as served:
        yield [f"http://127.0.0.1:{served.port + i}" for i in range(2)]


def modelled_transfer(tokens: int) -> float:
    """The transfer model by hand: B200's scale-out NIC (50 GB/s per GPU, 20 us setup);
    whole blocks of 64 positions of gpt-oss-20b's KV at its cache dtype."""
    deployment = Deployment(MODEL, load_model(MODEL), load_hardware("b200"), 1,
                            SchedulerConfig(block_size=64))
    blocks = -(-tokens // 64)
    return 2e-5 + blocks * 64 * bytes_per_token(deployment) / 5.0e10


async def test_the_decode_replica_pulls_the_prompt_and_the_router_has_nothing_to_warn(pd_lab):
    prefill, decode = pd_lab
    with pd_router([prefill], [decode]) as router:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{router.port}/v1",
                                    api_key="unused", max_retries=0)
        # 3 template tokens per message and 3 priming the reply: 1,494 of content
        content = system_prompt(31, PROMPT_TOKENS - 6)
        reply = await client.chat.completions.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": content}])
        assert reply.usage.prompt_tokens == PROMPT_TOKENS
        assert reply.usage.completion_tokens == 8
        async with aiohttp.ClientSession() as http:
            hits = await metric(http, decode + "/metrics", "vllm:external_prefix_cache_hits_total")
            recomputed = await metric(http, decode + "/metrics",
                                      "inference_lab_kv_transfer_recomputed_total")
            local = await metric(http, decode + "/metrics", "vllm:prompt_tokens_by_source_total",
                                 source="local_compute")
            pulled = await metric(http, decode + "/metrics", "inference_lab_kv_transfer_seconds_sum")

            async def freed() -> bool:
                return await metric(http, prefill + "/metrics",
                                    "inference_lab_kv_transfer_pending_blocks") == 0

            await until(freed, what="the prefill replica to free the pulled blocks")
            assert await metric(http, prefill + "/metrics",
                                "inference_lab_kv_transfer_pulled_total") == 1
        log = router.log()
    assert hits == PROMPT_TOKENS - 1  # every position but the last, which samples
    assert hits >= 0.9 * PROMPT_TOKENS
    assert (recomputed, local) == (0, 1)
    assert pulled == pytest.approx(modelled_transfer(PROMPT_TOKENS), rel=1e-9)
    assert "No kv_transfer_params" not in log


async def test_requests_at_once_each_pull_their_own_prompt(pd_lab):
    prefill, decode = pd_lab
    with pd_router([prefill], [decode]) as router:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{router.port}/v1",
                                    api_key="unused", max_retries=0)
        async with aiohttp.ClientSession() as http:
            before = await metric(http, decode + "/metrics", "vllm:external_prefix_cache_hits_total")
            replies = await asyncio.gather(*(client.completions.create(
                model=MODEL, max_tokens=4, prompt=system_prompt(40 + i, 800)) for i in range(4)))
            after = await metric(http, decode + "/metrics", "vllm:external_prefix_cache_hits_total")
            recomputed = await metric(http, decode + "/metrics",
                                      "inference_lab_kv_transfer_recomputed_total")
        log = router.log()
    assert [r.usage.prompt_tokens for r in replies] == [800] * 4
    assert after - before == 4 * 799 and recomputed == 0
    assert "No kv_transfer_params" not in log

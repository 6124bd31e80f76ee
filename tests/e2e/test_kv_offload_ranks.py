"""KV offloading on the real `serve --data-parallel-size 2`: each rank (an engine process
of its own) has its own host tier. A prompt rank 0 stored and then evicted from its GPU
loads from rank 0's host tier; the same prompt pinned to rank 1 (vLLM's
`X-data-parallel-rank` header, sent by the openai SDK) finds nothing there and is
computed. The offload series are told apart by `engine`."""

from __future__ import annotations

import aiohttp
import pytest
from offload_helpers import BLOCK, CONFIG, MODEL, cached, text
from openai import OpenAI

from inference_lab.testing.launch import serve
from inference_lab.testing.poll import until
from inference_lab.testing.routers import metric

pytestmark = pytest.mark.timeout(120)


async def test_each_data_parallel_rank_loads_only_from_its_own_host_tier(tmp_path):
    config = tmp_path / f"{MODEL}.toml"
    config.write_text(CONFIG)
    with serve("--config", str(config), "--data-parallel-size", "2",
               "--kv-offloading-size", "1") as served:
        client = OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="none")

        def complete(seed: int, rank: int):
            return client.completions.create(
                model=MODEL, prompt=text(seed), max_tokens=1,
                extra_headers={"X-data-parallel-rank": str(rank)})

        assert cached(complete(1, 0).usage) == 0
        for seed in (2, 3, 4):  # push it out of rank 0's GPU cache
            complete(seed, 0)
        again = cached(complete(1, 0).usage)
        elsewhere = cached(complete(1, 1).usage)
        # rank 0's tier held the prompt's 46 full blocks; rank 1's held nothing of it
        assert again >= 46 * BLOCK and elsewhere == 0

        url = f"http://127.0.0.1:{served.port}/metrics"
        async with aiohttp.ClientSession() as http:
            async def host(rank: int) -> float:
                return await metric(http, url, "vllm:prompt_tokens_cached_by_source_total",
                                    source="host", engine=str(rank))

            assert await until(lambda: host(0), timeout=10) == again
            assert await host(1) == 0
            # 1 GiB / 1,572,864 B per chunk = 682 chunks, in each rank's own tier
            for rank in (0, 1):
                assert await metric(http, url, "vllm:kv_offload_config_info",
                                    cpu_num_chunks="682", engine=str(rank)) == 1.0

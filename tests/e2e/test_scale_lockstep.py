"""The lockstep of an MoE model's data-parallel ranks, served: `serve --data-parallel-size
2` with an MoE model (gpt-oss-20b) and a dense one (llama-3.1-8b). A long prefill on rank
0 (a 60,000-token prompt: ~0.25 s of modelled steps) stretches every step that rank 1
runs beside it for the MoE model (each step of the group lasts as long as the slowest
rank's), and not for the dense one; the MoE rank that sat the other's steps out counts
its dummy passes."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference_lab.testing.launch import serve

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    configs = tmp_path_factory.mktemp("configs")
    for name in ("gpt-oss-20b.toml", "llama-3.1-8b.toml"):
        shutil.copy(ROOT / "configs" / name, configs / name)
    with serve("--config", str(configs), "--data-parallel-size", "2") as served:
        yield f"http://127.0.0.1:{served.port}"


async def modelled(http: aiohttp.ClientSession, base: str, rank: int, body: dict) -> dict:
    async with http.post(base + "/v1/completions", json=body,
                         headers={"X-data-parallel-rank": str(rank)}) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["inference_lab"]


async def beside_a_long_prefill(base: str, model: str) -> tuple[float, float, float]:
    """(rank 1's modelled e2e of 200 tokens alone, the same beside rank 0's 60,000-token
    prefill, that prefill's modelled TTFT)."""
    short = {"model": model, "prompt": "hello", "max_tokens": 200}
    long = {"model": model, "prompt": [11] * 60_000, "max_tokens": 1}
    async with aiohttp.ClientSession() as http:
        alone = (await modelled(http, base, 1, short))["e2e_s"]
        beside = asyncio.ensure_future(modelled(http, base, 1, short))
        prefill = await modelled(http, base, 0, long)
        return alone, (await beside)["e2e_s"], prefill["ttft_s"]


async def dummy_passes(base: str) -> dict[tuple[str, str], float]:
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/metrics") as resp:
            text = await resp.text()
    return {(s.labels["model_name"], s.labels["engine"]): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "inference_lab_data_parallel_dummy_passes_total"}


async def test_an_moe_rank_steps_as_long_as_the_slowest_rank_of_its_group(ranks):
    alone, beside, prefill = await beside_a_long_prefill(ranks, "gpt-oss-20b")
    # the prefill's steps (~0.25 s in all) are rank 1's steps too while they overlap: its
    # 200 tokens take most of the prefill's time longer than alone
    assert prefill > 0.15
    assert beside > alone + 0.5 * prefill, (alone, beside, prefill)
    passes = await dummy_passes(ranks)
    # rank 0 sat out rank 1's steps (its own 200 tokens alone: ~200 group steps)
    assert passes[("gpt-oss-20b", "0")] >= 150, passes


async def test_a_dense_rank_steps_on_its_own(ranks):
    before = await dummy_passes(ranks)
    alone, beside, prefill = await beside_a_long_prefill(ranks, "llama-3.1-8b")
    assert prefill > 0.15
    assert beside == pytest.approx(alone, rel=0.05), (alone, beside, prefill)
    after = await dummy_passes(ranks)
    assert after.get(("llama-3.1-8b", "0"), 0) == before.get(("llama-3.1-8b", "0"), 0) == 0

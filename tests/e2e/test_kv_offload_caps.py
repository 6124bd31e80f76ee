"""KV offloading's per-request caps over HTTP on the real `serve`: vLLM's
`kv_transfer_params.max_load_tokens` (through the openai SDK's `extra_body`) reaches the
engine, so a repeat of a prompt the host tier holds with `max_load_tokens: 0` computes
its prefix (no cached tokens in its usage, nothing loaded), while the same repeat without
the cap loads it (its usage counts the host's tokens as cached, and the offload series
count that one load alone); a conversation sent on /v1/chat/completions with
`max_offload_tokens: 0` is never stored, so its repeat computes it again. vLLM's
`kv_load_tiers`: an empty list loads from no tier, `[{"medium": "CPU"}]` from the host.
The dev-mode `/reset_prefix_cache?reset_external=true` empties the host tier too (the
repeat loads nothing), without it the host keeps its copy. A negative or fractional cap,
an unknown medium, a non-boolean reset_external are 400s naming the field."""

from __future__ import annotations

import aiohttp
import openai
import pytest
from offload_helpers import BLOCK, BYTES_PER_TOKEN, CONFIG, MODEL, cached, text
from openai import OpenAI

from inference_lab.testing.launch import serve
from inference_lab.testing.poll import until
from inference_lab.testing.routers import metric

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    config = tmp_path_factory.mktemp("offload-caps") / f"{MODEL}.toml"
    config.write_text(CONFIG)
    with serve("--config", str(config), "--kv-offloading-size", "1") as served:
        yield served


async def test_max_load_tokens_zero_computes_an_offloaded_prefix_the_default_loads(lab):
    client = OpenAI(base_url=f"http://127.0.0.1:{lab.port}/v1", api_key="none")
    url = f"http://127.0.0.1:{lab.port}/metrics"

    def evict(seeds) -> None:
        """Other prompts push text(1) out of the GPU; the host tier keeps its copy."""
        for seed in seeds:
            client.completions.create(model=MODEL, prompt=text(seed), max_tokens=1)

    first = client.completions.create(model=MODEL, prompt=text(1), max_tokens=1)
    assert cached(first.usage) == 0
    evict((2, 3, 4))
    capped = client.completions.create(model=MODEL, prompt=text(1), max_tokens=1,
                                       extra_body={"kv_transfer_params": {"max_load_tokens": 0}})
    # neither the GPU (it evicted the prompt) nor the host (the cap) served any of it
    assert cached(capped.usage) == 0

    def chat(**extra):
        return client.chat.completions.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": text(8)}], **extra)

    unstored = chat(extra_body={"kv_transfer_params": {"max_offload_tokens": 0}})
    assert cached(unstored.usage) == 0
    evict((5, 6, 7))  # both text(1) and the conversation leave the GPU
    # the conversation was never stored to the host: its repeat computes it all again
    assert cached(chat().usage) == 0
    repeat = client.completions.create(model=MODEL, prompt=text(1), max_tokens=1)
    # the prompt's 46 full blocks (plus the template's) came from the host tier
    hit = cached(repeat.usage)
    assert hit >= 46 * BLOCK and hit % BLOCK in (0, BLOCK - 1)

    async with aiohttp.ClientSession() as http:
        async def host() -> float:
            return await metric(http, url, "vllm:prompt_tokens_cached_by_source_total",
                                source="host")

        # the capped repeat added nothing: the host's tokens are the default repeat's alone
        assert await until(host, timeout=10) == hit
        load_bytes = await metric(http, url, "vllm:kv_offload_load_bytes_total")
    assert load_bytes == (hit // BLOCK + (hit % BLOCK == BLOCK - 1)) * BLOCK * BYTES_PER_TOKEN


@pytest.mark.parametrize("route", ["completions", "chat"])
@pytest.mark.parametrize("params, field", [
    ({"max_load_tokens": -1}, "max_load_tokens"),
    ({"max_offload_tokens": 2.5}, "max_offload_tokens"),
])
def test_a_negative_or_fractional_cap_is_a_400_naming_it(lab, route, params, field):
    client = OpenAI(base_url=f"http://127.0.0.1:{lab.port}/v1", api_key="none", max_retries=0)
    extra = {"extra_body": {"kv_transfer_params": params}}
    with pytest.raises(openai.BadRequestError) as caught:
        if route == "chat":
            client.chat.completions.create(model=MODEL, max_tokens=1, **extra,
                                           messages=[{"role": "user", "content": "hi"}])
        else:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=1, **extra)
    error = caught.value.body
    assert (caught.value.status_code, error["type"]) == (400, "invalid_request_error")
    assert error["message"].endswith(f"`$.kv_transfer_params.{field}`")


@pytest.fixture(scope="module")
def dev_lab(tmp_path_factory):
    config = tmp_path_factory.mktemp("offload-reset") / f"{MODEL}.toml"
    config.write_text(CONFIG)
    with serve("--config", str(config), "--kv-offloading-size", "1", "--dev-mode") as served:
        yield served


def _offloaded(client, seed: int) -> None:
    """text(seed) computed once, then pushed out of the GPU (the host keeps its copy)."""
    assert cached(client.completions.create(model=MODEL, prompt=text(seed), max_tokens=1).usage) == 0
    for other in (seed + 1, seed + 2, seed + 3):
        client.completions.create(model=MODEL, prompt=text(other), max_tokens=1)


def test_kv_load_tiers_empty_loads_nothing_and_cpu_loads_from_the_host(dev_lab):
    client = OpenAI(base_url=f"http://127.0.0.1:{dev_lab.port}/v1", api_key="none")
    _offloaded(client, 20)
    none = client.completions.create(model=MODEL, prompt=text(20), max_tokens=1,
                                     extra_body={"kv_transfer_params": {"kv_load_tiers": []}})
    assert cached(none.usage) == 0
    _offloaded(client, 30)
    cpu = client.completions.create(
        model=MODEL, prompt=text(30), max_tokens=1,
        extra_body={"kv_transfer_params": {"kv_load_tiers": [{"medium": "CPU"}]}})
    hit = cached(cpu.usage)
    assert hit >= 46 * BLOCK and hit % BLOCK in (0, BLOCK - 1)


async def test_reset_external_empties_the_host_tier_and_a_plain_reset_keeps_it(dev_lab):
    client = OpenAI(base_url=f"http://127.0.0.1:{dev_lab.port}/v1", api_key="none")
    base = f"http://127.0.0.1:{dev_lab.port}"
    async with aiohttp.ClientSession() as http:
        _offloaded(client, 40)
        async with http.post(base + "/reset_prefix_cache", json={}) as resp:
            assert resp.status == 200
        kept = client.completions.create(model=MODEL, prompt=text(40), max_tokens=1)
        assert cached(kept.usage) >= 46 * BLOCK  # the GPU's gone, the host's copy loaded
        _offloaded(client, 50)
        async with http.post(base + "/reset_prefix_cache?reset_external=true", json={}) as resp:
            assert resp.status == 200
        gone = client.completions.create(model=MODEL, prompt=text(50), max_tokens=1)
        assert cached(gone.usage) == 0
        async with http.post(base + "/reset_prefix_cache?reset_external=maybe", json={}) as resp:
            body = await resp.json()
            assert resp.status == 400
            assert body["error"]["message"].endswith("`?reset_external`")


@pytest.mark.parametrize("tiers", [[{"medium": "GPU"}], [{"locality": "LOCAL"}], "CPU"])
def test_a_bad_kv_load_tiers_is_a_400_naming_it(lab, tiers):
    client = OpenAI(base_url=f"http://127.0.0.1:{lab.port}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=1,
                                  extra_body={"kv_transfer_params": {"kv_load_tiers": tiers}})
    assert caught.value.status_code == 400
    assert "kv_transfer_params.kv_load_tiers" in caught.value.body["message"]

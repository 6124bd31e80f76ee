"""Prefix caching end to end in-process: the real gateway (real HTTP, the official
`openai` SDK) in front of the real engine (real gRPC): prompts travel as token IDs,
usage reports cached tokens, and the engine exports vLLM's prefix-cache counters."""

from __future__ import annotations

import urllib.request

import openai
from aiohttp.test_utils import TestServer
from engine_helpers import running_engine

from inference_lab.gateway import create_app

SYSTEM = "You are a careful assistant. " * 80  # 2,320 bytes = 580 tokens (built-in tokenizer)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


async def test_a_shared_system_prompt_is_served_from_the_cache_and_counted():
    async with running_engine() as engine:
        async with TestServer(create_app(f"127.0.0.1:{engine.port}")) as server:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1",
                                        api_key="unused", max_retries=0)
            usages = []
            for question in ("What is a KV cache?", "And a prefix cache?"):
                reply = await client.chat.completions.create(
                    model="gpt-oss-20b", max_tokens=3,
                    messages=[{"role": "system", "content": SYSTEM},
                              {"role": "user", "content": question}])
                usages.append(reply.usage)
            await client.close()
        metrics = scrape(engine.metrics_port)
    first, second = usages
    # 3 + 580 system tokens + 3 header tokens of the user message; then the question.
    assert first.prompt_tokens == 3 + 580 + 3 + 5 + 3
    assert first.prompt_tokens_details.cached_tokens == 0
    # Blocks of 64 tokens: the system prompt and headers fill 9 blocks (586 // 64 = 9)
    # before the questions differ.
    assert second.prompt_tokens_details.cached_tokens == 9 * 64
    assert sample(metrics, "vllm:prefix_cache_queries_total") == first.prompt_tokens + second.prompt_tokens
    assert sample(metrics, "vllm:prefix_cache_hits_total") == 9 * 64

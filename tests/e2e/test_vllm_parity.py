"""Looking like vLLM to the tools that measure vLLM, against a real `serve`: the API port's
/metrics carries every vllm:* series (promtool-clean but for vLLM's own names), a client
hang-up is a finish with reason `abort` and its observations, and the endpoints vLLM adds
to the OpenAI API answer in vLLM's shapes."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import pytest

from metrics_helpers import promtool_check, sample
from inference_lab.testing.launch import serve
from inference_lab.testing.poll import until

MODEL = "gpt-oss-20b"
LABELS = {"model_name": MODEL, "engine": "0"}
VLLM_SERIES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:engine_sleep_state", "vllm:cache_config_info", "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total", "vllm:prompt_tokens_by_source_total",
    "vllm:prompt_tokens_cached_total", "vllm:generation_tokens_total",
    "vllm:request_success_total", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:iteration_tokens_total_bucket",
    "vllm:request_max_num_generation_tokens_bucket", "vllm:request_params_n_bucket",
    "vllm:request_params_max_tokens_bucket", "vllm:request_prefill_kv_computed_tokens_bucket",
    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket", "vllm:request_inference_time_seconds_bucket",
    "vllm:request_prefill_time_seconds_bucket", "vllm:request_decode_time_seconds_bucket",
)


@pytest.fixture(scope="module")
def served():
    with serve() as s:
        yield s


def metrics(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        return resp.read().decode()


def test_api_port_metrics_have_the_vllm_series_and_pass_promtool(served):
    body = metrics(served.base)
    names = {line.split("{")[0].split(" ")[0] for line in body.splitlines()
             if line and not line.startswith("#")}
    missing = [n for n in VLLM_SERIES if n not in names]
    assert not missing, missing
    assert "inference_lab_gateway_http_requests_total" in names  # and the gateway's own
    assert sample(body, "inference_lab_gateway_engine_metrics_up") == 1.0
    for reason in ("stop", "length", "abort", "error", "repetition"):  # vLLM's label values
        assert f'finished_reason="{reason}"' in body
    assert sample(body, "vllm:engine_sleep_state", sleep_state="awake", **LABELS) == 1.0
    assert 'vllm:cache_config_info{block_size="' in body and 'num_gpu_blocks="' in body
    _, problems = promtool_check(body)  # (skips without promtool)
    assert not problems, "\n".join(problems)


async def test_a_hang_up_is_an_abort_with_its_observations(served):
    before = metrics(served.base)
    count = lambda body, name: sample(body, name + "_count", **LABELS)  # noqa: E731
    body = {"model": MODEL, "stream": True, "max_tokens": 5000,
            "messages": [{"role": "user", "content": "Tell me a long story."}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(served.base + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            chunks = 0
            async for line in resp.content:
                chunks += line.startswith(b"data: ")
                if chunks >= 20:
                    break  # hang up mid-stream
    was = lambda name: sample(before, name, finished_reason="abort", **LABELS)  # noqa: E731

    async def counted_abort() -> str | None:  # (the engine hears the hang-up asynchronously)
        text = await asyncio.to_thread(metrics, served.base)
        return text if sample(text, "vllm:request_success_total", finished_reason="abort",
                              **LABELS) >= was("vllm:request_success_total") + 1 else None

    after = await until(counted_abort, timeout=10, interval=0.05, what="the abort counted")
    aborted = sample(after, "vllm:request_success_total", finished_reason="abort", **LABELS)
    assert aborted == was("vllm:request_success_total") + 1
    for series in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                   "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                   "vllm:request_inference_time_seconds", "vllm:request_generation_tokens",
                   "vllm:request_time_per_output_token_seconds", "vllm:time_to_first_token_seconds"):
        assert count(after, series) == count(before, series) + 1, series
    # It had streamed ~20 tokens when it left (never its 5000): the histograms say so.
    generated = (sample(after, "vllm:request_generation_tokens_sum", **LABELS)
                 - sample(before, "vllm:request_generation_tokens_sum", **LABELS))
    assert 19 <= generated < 200
    decode = (sample(after, "vllm:request_decode_time_seconds_sum", **LABELS)
              - sample(before, "vllm:request_decode_time_seconds_sum", **LABELS))
    assert 0 < decode < 1.0
    itl = count(after, "vllm:inter_token_latency_seconds") - count(before, "vllm:inter_token_latency_seconds")
    assert itl >= generated - 1


async def post(session, url: str, body: dict) -> tuple[int, dict]:
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def test_continuous_usage_stats_put_a_growing_usage_on_every_chunk(served):
    body = {"model": MODEL, "stream": True, "max_tokens": 30,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "messages": [{"role": "user", "content": "Count to thirty."}]}
    chunks = []
    async with aiohttp.ClientSession() as session:
        async with session.post(served.base + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    chunks.append(json.loads(line[6:]))
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages)  # every chunk, the role chunk included
    prompt = usages[0]["prompt_tokens"]
    assert prompt > 0 and all(u["prompt_tokens"] == prompt for u in usages)
    completion = [u["completion_tokens"] for u in usages]
    assert completion[0] == 0 and completion == sorted(completion)  # monotone
    tokens = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert [c["usage"]["completion_tokens"] for c in tokens] == list(range(1, 31))
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 30


async def test_version_tokenize_detokenize_and_a_model_card_answer_as_vllm_does(served):
    base = served.base
    async with aiohttp.ClientSession() as session:
        async with session.get(base + "/version") as resp:
            assert resp.status == 200 and set(await resp.json()) == {"version"}
        status, tok = await post(session, base + "/tokenize",
                                 {"model": MODEL, "prompt": "Hello, world!", "return_token_strs": True})
        assert status == 200 and set(tok) == {"count", "max_model_len", "tokens", "token_strs"}
        assert tok["count"] == len(tok["tokens"]) == 4  # the built-in tokenizer: 4 bytes a token
        assert "".join(tok["token_strs"]) == "Hello, world!" and tok["max_model_len"] > 0
        status, plain = await post(session, base + "/tokenize", {"prompt": "Hello, world!"})
        assert status == 200 and plain["tokens"] == tok["tokens"] and plain["token_strs"] is None
        status, back = await post(session, base + "/detokenize", {"model": MODEL, "tokens": tok["tokens"]})
        assert (status, back) == (200, {"prompt": "Hello, world!"})
        status, chat = await post(session, base + "/tokenize", {
            "model": MODEL, "messages": [{"role": "user", "content": "Hello, world!"}]})
        # the same count a chat completion's usage reports for this conversation
        status2, reply = await post(session, base + "/v1/chat/completions", {
            "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hello, world!"}]})
        assert status == status2 == 200 and chat["count"] == reply["usage"]["prompt_tokens"]
        status, err = await post(session, base + "/tokenize", {"model": "nope", "prompt": "x"})
        assert status == 404 and err["error"]["code"] == "model_not_found"
        status, err = await post(session, base + "/detokenize", {"tokens": [-1]})
        assert status == 400 and "tokens" in err["error"]["message"]
        async with session.get(base + f"/v1/models/{MODEL}") as resp:
            card = await resp.json()
        async with session.get(base + "/v1/models") as resp:
            listed = await resp.json()
        assert card == listed["data"][0] and card["id"] == MODEL and card["object"] == "model"
        assert {"root", "parent", "max_model_len", "permission", "owned_by", "created"} <= set(card)
        async with session.get(base + "/v1/models/nope") as resp:
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "model_not_found"


async def test_a_length_without_a_cap_finishes_as_stop_and_a_capped_one_as_length(served):
    def reasons() -> tuple[float, float]:
        body = metrics(served.base)
        return tuple(sample(body, "vllm:request_success_total", finished_reason=r, **LABELS)
                     for r in ("stop", "length"))

    before = await asyncio.to_thread(reasons)
    messages = [{"role": "user", "content": "hi"}]
    async with aiohttp.ClientSession() as session:
        for extra in ({}, {"max_tokens": 5}):  # the default length stands for an EOS
            status, _ = await post(session, served.base + "/v1/chat/completions",
                                   {"model": MODEL, "messages": messages, **extra})
            assert status == 200
    after = await asyncio.to_thread(reasons)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)

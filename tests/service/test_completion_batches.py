"""Several prompts in one completions request, in-process: the real gateway (real HTTP,
the official `openai` SDK) in front of the real engine (real gRPC or its lane). Each prompt
is an engine request of its own; choices are numbered prompt-major (prompt p's choice i is
index p * n + i, as vLLM numbers them); usage sums over the prompts; admission is all or
none; a hang-up cancels every engine request of the batch."""

from __future__ import annotations

import contextlib
import json
import urllib.request

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from engine_helpers import engine_rejections, running_engine
from metrics_helpers import sample
from inference_lab.gateway import create_app
from inference_lab.testing.fake_engine import FAKE_MODEL
from inference_lab.testing.poll import until

MODEL = "gpt-oss-20b"
# The built-in tokenizer: a text prompt of b bytes is ceil(b / 4) tokens.
PROMPTS = ["a" * 4, "b" * 8, "c" * 12]  # 1, 2 and 3 tokens


@contextlib.asynccontextmanager
async def served(**engine_options):
    """(the engine server, the gateway's base URL, an AsyncOpenAI client on it)."""
    async with running_engine(**engine_options) as engine:
        async with TestServer(create_app(f"127.0.0.1:{engine.port}")) as server:
            base = f"http://127.0.0.1:{server.port}"
            client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            try:
                yield engine, base, client
            finally:
                await client.close()


def engine_sample(engine, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{engine.metrics_port}/metrics",
                                timeout=5) as resp:
        return sample(resp.read().decode(), name, **labels)


def aborted(engine) -> float:
    """Sequences the engine counted as finished by an abort (vLLM's finished_reason)."""
    return engine_sample(engine, "vllm:request_success_total", finished_reason="abort")


async def post(base: str, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(base + "/v1/completions", json=body) as resp:
            return resp.status, await resp.json()


def idle(engine) -> bool:
    core = engine.runtimes[0].core
    return core.num_running == 0 and core.num_waiting == 0


async def test_three_prompts_of_two_choices_are_numbered_prompt_major_with_usage_summed():
    async with served() as (engine, _, client):
        reply = await client.completions.create(model=MODEL, prompt=PROMPTS, n=2,
                                                max_tokens=4, echo=True, logprobs=1)
        usage = reply.usage
    assert [c.index for c in reply.choices] == [0, 1, 2, 3, 4, 5]
    # echo shows which prompt each choice belongs to: prompt p's are indices 2p, 2p + 1
    assert [c.text for c in reply.choices] == [p + " token" * 4 for p in PROMPTS for _ in (0, 1)]
    assert {c.finish_reason for c in reply.choices} == {"length"}
    # logprobs per choice: its own prompt's tokens (echo), then the generated tokens', their
    # offsets counted from the end of its own prompt's echo
    lengths = [1, 1, 2, 2, 3, 3]
    assert [c.logprobs.text_offset[k] for c, k in zip(reply.choices, lengths)] == [4, 4, 8, 8, 12, 12]
    assert [c.logprobs.tokens for c in reply.choices] == [
        [p[:4], p[4:8], p[8:]][:k] + [" token"] * 4 for p, k in zip(
            [PROMPTS[i // 2] for i in range(6)], lengths)]
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (6, 24, 30)
    modelled = reply.model_extra["inference_lab"]["prompts"]
    assert len(modelled) == 3
    # they arrived together on an idle engine: one step prefilled all three
    assert len({m["ttft_s"] for m in modelled}) == 1 and modelled[0]["queue_time_s"] == 0.0


async def test_a_streamed_batch_interleaves_every_choice_by_index_then_one_usage_chunk():
    async with served() as (engine, _, client):
        stream = await client.completions.create(
            model=MODEL, prompt=PROMPTS, n=2, max_tokens=8, stream=True,
            stream_options={"include_usage": True})
        order, ids, finish, usages = [], set(), {}, []
        async for chunk in stream:
            ids.add(chunk.id)
            if chunk.usage is not None:
                assert chunk.choices == []
                usages.append(chunk.usage)
                continue
            (choice,) = chunk.choices  # one choice per chunk, each with its index
            if choice.finish_reason:
                assert choice.index not in finish and choice.text == ""
                finish[choice.index] = choice.finish_reason
            else:
                assert choice.text == " token" and choice.index not in finish
                order.append(choice.index)
    assert len(ids) == 1  # one response id for the whole batch
    assert sorted(order) == sorted(list(range(6)) * 8)  # 8 tokens for each of 6 choices
    assert finish == {i: "length" for i in range(6)}
    # interleaved as the tokens come: the last prompt's first token comes before the first
    # prompt's last (all three decode in the same steps)
    assert order.index(4) < len(order) - 1 - order[::-1].index(0)
    (usage,) = usages  # the one usage chunk, after every choice's final chunk
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (6, 48, 54)
    await until(lambda: idle(engine))


async def test_token_id_prompts_echo_as_the_tokenizer_decodes_them_streamed_and_not():
    # (with what lm-evaluation-harness's local-completions sends along: temperature, stop, seed)
    body = dict(model=MODEL, prompt=[[1, 2, 3], [4, 5]], max_tokens=2, echo=True,
                temperature=0, stop=["\n\n"], seed=1234)
    async with served() as (engine, _, client):
        reply = await client.completions.create(**body)
        stream = await client.completions.create(**body, stream=True)
        texts = {}
        async for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + choice.text
    # the built-in tokenizer: an id is its 4 little-endian bytes, padding zeros dropped
    assert [c.text for c in reply.choices] == ["\x01\x02\x03" + " token" * 2,
                                               "\x04\x05" + " token" * 2]
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (5, 4)
    assert texts == {0: "\x01\x02\x03" + " token" * 2, 1: "\x04\x05" + " token" * 2}


async def test_a_batch_only_part_of_which_fits_the_queue_is_refused_whole_and_nothing_is_left():
    async with served() as (engine, base, client):
        async with aiohttp.ClientSession() as session:
            async with session.post(base + "/control/capacity",
                                    json={"max_num_seqs": 1, "max_waiting": 2}) as resp:
                assert resp.status == 200
        # The engine queues prompts 0 and 1, refuses 2 and 3; the gateway cancels 0 and 1.
        for stream in (False, True):
            before = aborted(engine), engine_rejections(engine.metrics_port)
            with pytest.raises(openai.APIStatusError) as info:
                await client.completions.create(model=MODEL, prompt=PROMPTS + ["d"],
                                                max_tokens=50, stream=stream)
            assert info.value.status_code == 529
            assert info.value.body["code"] == "queue_saturated"
            await until(lambda: idle(engine))
            # nothing admitted is lost silently: the two queued ones count as aborted
            assert aborted(engine) - before[0] == 2
            assert engine_rejections(engine.metrics_port) - before[1] == 2
        # A queue already full refuses a batch at the gateway, and queues none of it.
        holder = await client.completions.create(model=MODEL, prompt="x", max_tokens=20000,
                                                 stream=True)
        await holder.__anext__()  # running
        waiting = await client.completions.create(model=MODEL, prompt="y", max_tokens=20000,
                                                  stream=True)
        waiting2 = await client.completions.create(model=MODEL, prompt="z", max_tokens=20000,
                                                   stream=True)
        with pytest.raises(openai.APIStatusError) as info:
            await client.completions.create(model=MODEL, prompt=["p", "q"], max_tokens=5)
        assert info.value.status_code == 529
        core = engine.runtimes[0].core
        assert (core.num_running, core.num_waiting) == (1, 2)
        for s in (holder, waiting, waiting2):
            await s.close()
        await until(lambda: idle(engine))


async def test_a_hang_up_mid_stream_aborts_every_engine_request_of_the_batch():
    async with served() as (engine, base, _):
        async with aiohttp.ClientSession() as session:
            async with session.post(base + "/v1/completions", json={
                    "model": MODEL, "prompt": PROMPTS, "n": 2, "max_tokens": 20000,
                    "stream": True}) as resp:
                assert resp.status == 200
                seen = set()
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        seen.add(json.loads(line[6:])["choices"][0]["index"])
                    if seen == set(range(6)):
                        break  # every choice is decoding
                core = engine.runtimes[0].core
                assert core.num_running == 6
                resp.close()
        await until(lambda: idle(engine))
        await until(lambda: aborted(engine) == 6)  # each sequence of each prompt


async def test_a_hang_up_while_prompts_of_n_sequences_wait_aborts_every_sequence():
    # max_num_seqs 2: prompt 0's two sequences run, prompts 1 and 2 wait (unspawned); each
    # of the six sequences counts as aborted, as vLLM counts each child request (before:
    # a waiting request counted once whatever its n, 4 in all)
    async with served(max_num_seqs=2) as (engine, base, _):
        core = engine.runtimes[0].core
        latency = "vllm:e2e_request_latency_seconds_count"
        before = engine_sample(engine, latency)
        async with aiohttp.ClientSession() as session:
            async with session.post(base + "/v1/completions", json={
                    "model": MODEL, "prompt": PROMPTS, "n": 2, "max_tokens": 20000,
                    "stream": True}) as resp:
                assert resp.status == 200
                await until(lambda: (core.num_running, core.num_waiting) == (2, 2))
                resp.close()
        await until(lambda: idle(engine))
        await until(lambda: aborted(engine) == 6)
        assert engine_sample(engine, latency) - before == 6  # a latency for each as well


@pytest.mark.parametrize("prompt, message", [
    ([], "`prompt` must not be empty - at `$.prompt`"),
    (["a", [1, 2]], "Mixed prompts"),
    (["a", 1], "Mixed prompts"),
    ([[1], 2], "Mixed prompts"),
    ([[1], []], "must not be empty - at `$.prompt[1]`"),
    ([[1], [2**32]], "at `$.prompt[1][0]`"),
    (["a"] * 1025, "Too many prompts: at most 1024 in one request, got 1025 - at `$.prompt`"),
])
async def test_bad_batches_are_a_400_naming_the_prompt(client, fake, prompt, message):
    # (refused while parsing: the narrow fake engine stands in, and hears of none)
    resp = await client.post("/v1/completions", json={"model": FAKE_MODEL, "prompt": prompt,
                                                      "max_tokens": 1})
    body = await resp.json()
    assert resp.status == 400 and body["error"]["code"] == "invalid_request"
    assert message in body["error"]["message"]
    assert fake.opened.items == []


async def test_a_prompt_the_engine_refuses_as_too_long_is_a_400_naming_it_and_cancels_the_rest():
    async with served() as (engine, base, _):
        status, body = await post(base, {"model": MODEL, "prompt": ["a", "x" * 4 * 200_000],
                                          "max_tokens": 1})
        assert status == 400 and "at `$.prompt[1]`" in body["error"]["message"]
        await until(lambda: idle(engine))


async def test_a_fault_directive_on_a_batch_is_a_400(client, fake):
    resp = await client.post("/v1/completions", headers={"x-inference-lab-fault": "mode=rst"},
                             json={"model": FAKE_MODEL, "prompt": ["a", "b"], "max_tokens": 1})
    body = await resp.json()
    assert resp.status == 400 and "with one prompt and n = 1 only" in body["error"]["message"]
    assert fake.opened.items == []

"""Completions with `echo` and `logprobs`: the prompt's own logprobs first (as vLLM and
OpenAI's legacy API give them, what lm-evaluation-harness's loglikelihood tasks read), then
the generated tokens'; `max_tokens: 0` with echo is the prompt only. The real gateway
(real HTTP, the official `openai` SDK) in front of the real engine."""

from __future__ import annotations

import contextlib
import json
import urllib.request

import openai
import pytest
from aiohttp.test_utils import TestServer

from engine_helpers import running_engine
from metrics_helpers import sample
from inference_lab.common.tokenizer import ByteTokenizer
from inference_lab.gateway import create_app

MODEL = "gpt-oss-20b"
TOK = ByteTokenizer()  # the gateway's built-in tokenizer: 4 UTF-8 bytes per token


@contextlib.asynccontextmanager
async def served():
    async with running_engine() as engine:
        async with TestServer(create_app(f"127.0.0.1:{engine.port}")) as server:
            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1",
                                        api_key="unused", max_retries=0)
            try:
                yield engine, client
            finally:
                await client.close()


def generation_tokens(engine) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{engine.metrics_port}/metrics",
                                timeout=5) as resp:
        return sample(resp.read().decode(), "vllm:generation_tokens_total")


def check_prompt_logprobs(lp, prompt: str, generated: int, top: int) -> None:
    """`lp` (a choice's logprobs) covers the prompt's tokens, then `generated` tokens."""
    pieces = TOK.pieces(TOK.encode(prompt))[1]
    n = len(pieces)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == \
        len(lp.text_offset) == n + generated
    assert lp.tokens == pieces + [" token"] * generated
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v < 0 for v in lp.token_logprobs[1:n])
    for token, value, alternatives in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert len(alternatives) == top and alternatives[token] == value
        assert max(alternatives, key=alternatives.get) == token
    text = prompt + " token" * generated
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for token, offset in zip(lp.tokens, lp.text_offset):  # each token's text is where it says
        if "\ufffd" not in token:  # (a token holding part of a character renders it so)
            assert text[offset:offset + len(token)] == token
        assert offset <= len(text)
    assert lp.text_offset[n:] == [len(prompt) + 6 * i for i in range(generated)]


async def test_echo_with_logprobs_covers_the_prompt_then_the_completion_streamed_and_not():
    prompt = "The quick brown fox jumps"  # 25 bytes: 7 tokens, the last one short
    async with served() as (_, client):
        reply = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=3,
                                                echo=True, logprobs=2)
        stream = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=3,
                                                 echo=True, logprobs=2, stream=True)
        chunks = [c async for c in stream]
    (choice,) = reply.choices
    assert choice.text == prompt + " token" * 3 and choice.finish_reason == "length"
    assert reply.usage.prompt_tokens == 7 and reply.usage.completion_tokens == 3
    check_prompt_logprobs(choice.logprobs, prompt, 3, top=2)
    # deterministic: the same token has the same value wherever it is
    assert choice.logprobs.token_logprobs[1] == reply.choices[0].logprobs.token_logprobs[1]
    # streamed: the echo chunk carries the prompt's logprobs, each token chunk its own
    texts = [c.choices[0].text for c in chunks]
    assert texts[0] == prompt and "".join(texts) == prompt + " token" * 3
    first = chunks[0].choices[0].logprobs
    assert first.tokens == choice.logprobs.tokens[:7]
    assert first.token_logprobs == choice.logprobs.token_logprobs[:7]
    assert first.text_offset == choice.logprobs.text_offset[:7]
    assert [c.choices[0].logprobs.text_offset for c in chunks[1:4]] == [[25], [31], [37]]


async def test_max_tokens_zero_with_echo_is_the_prompt_only_streamed_and_not():
    prompt = "héllo wörld €"  # multi-byte characters cut across tokens
    async with served() as (engine, client):
        before = generation_tokens(engine)
        reply = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=0,
                                                echo=True, logprobs=1)
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1, stream=True,
            stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        # the engine ran each with one token (vLLM does the same): it booked 2
        assert generation_tokens(engine) - before == 2
        plain = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=0,
                                                echo=True)
        try:
            await client.completions.create(model=MODEL, prompt=prompt, max_tokens=0)
            raise AssertionError("max_tokens 0 without echo was accepted")
        except openai.BadRequestError as err:
            assert "$.max_tokens" in err.message
    (choice,) = reply.choices
    assert choice.text == prompt and choice.finish_reason == "length"
    n = len(TOK.encode(prompt))
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (n, 0)
    check_prompt_logprobs(choice.logprobs, prompt, 0, top=1)
    assert plain.choices[0].text == prompt and plain.choices[0].logprobs is None
    # streamed: the prompt's chunk, the final chunk, the usage chunk; no token chunk
    assert [c.choices[0].text for c in chunks[:-1]] == [prompt, ""]
    assert chunks[1].choices[0].finish_reason == "length"
    assert chunks[0].choices[0].logprobs.token_logprobs == choice.logprobs.token_logprobs
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and (usage.prompt_tokens, usage.completion_tokens) == (n, 0)


async def test_a_batch_gives_each_choice_its_own_prompts_logprobs():
    prompts = ["abcdefgh", "zyxwvutsrqpo"]  # 2 and 3 tokens
    async with served() as (_, client):
        reply = await client.completions.create(model=MODEL, prompt=prompts, max_tokens=2,
                                                echo=True, logprobs=1, n=2)
        stream = await client.completions.create(model=MODEL, prompt=prompts, max_tokens=0,
                                                 echo=True, logprobs=1, stream=True)
        chunks = [c async for c in stream]
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    for choice, prompt in zip(reply.choices, [p for p in prompts for _ in (0, 1)]):
        assert choice.text == prompt + " token" * 2
        check_prompt_logprobs(choice.logprobs, prompt, 2, top=1)
    echoes = {c.choices[0].index: c.choices[0] for c in chunks if c.choices[0].text}
    assert {i: c.text for i, c in echoes.items()} == {0: prompts[0], 1: prompts[1]}
    for i, prompt in enumerate(prompts):
        check_prompt_logprobs(echoes[i].logprobs, prompt, 0, top=1)
    finals = [c.choices[0] for c in chunks if c.choices[0].finish_reason]
    assert sorted((c.index, c.finish_reason) for c in finals) == [(0, "length"), (1, "length")]


async def test_token_id_prompts_render_each_token_as_the_tokenizer_does():
    ids = [[0x6C6C6548, 0x6F77206F, 0x646C72], [0x61, 0x62]]  # "Hello world", "a" "b"
    async with served() as (_, client):
        reply = await client.completions.create(model=MODEL, prompt=ids, max_tokens=1,
                                                echo=True, logprobs=1)
    first, second = reply.choices
    assert first.text == "Hello world token" and second.text == "ab token"
    assert first.logprobs.tokens == ["Hell", "o wo", "rld", " token"]
    assert first.logprobs.text_offset == [0, 4, 8, 11]
    assert second.logprobs.tokens == ["a", "b", " token"]
    assert second.logprobs.text_offset == [0, 1, 2]


def lm_eval_parse(choice: dict, ctxlen: int, end: int | None) -> tuple[float, bool]:
    """What lm-evaluation-harness makes of a choice for a loglikelihood request: the sum
    of the continuation's token logprobs (entries ctxlen to `end`: its local-completions
    asks for max_tokens 1 and drops that generated token's entry, end -1), and whether
    each continuation token is the greedy one (its logprob the greatest of its top
    alternatives; the older harness: the top alternative's key is the token)."""
    lp = choice["logprobs"]
    continuation = lp["token_logprobs"][ctxlen:end]
    greedy = all(value == max(top.values()) for value, top
                 in zip(continuation, lp["top_logprobs"][ctxlen:end]))
    greedy_by_key = all(max(top, key=top.get) == token for token, top
                        in zip(lp["tokens"][ctxlen:end], lp["top_logprobs"][ctxlen:end]))
    assert greedy == greedy_by_key
    return sum(continuation), greedy


@pytest.mark.parametrize("max_tokens, end", [(1, -1), (0, None)])
async def test_lm_eval_loglikelihood_request_shape_scores_every_continuation(max_tokens, end):
    # lm-eval's local-completions sends context + continuation as token ids by default,
    # several in one request, with echo, logprobs 1, max_tokens 1, temperature 0 and a seed
    contexts = [TOK.encode("Question: what colour is the sky? Answer:"),
                TOK.encode("Question: what colour is grass? Answer:")]
    continuations = [TOK.encode(" blue"), TOK.encode(" bright green")]
    prompts = [list(c) + list(x) for c, x in zip(contexts, continuations)]
    body = dict(model=MODEL, prompt=prompts, echo=True, logprobs=1, max_tokens=max_tokens,
                temperature=0, seed=1234)
    async with served() as (_, client):
        raw = await client.completions.with_raw_response.create(**body)
        again = await client.completions.create(**body)
    doc = json.loads(raw.content)
    choices = sorted(doc["choices"], key=lambda c: c["index"])
    assert len(choices) == 2
    scores = []
    for choice, prompt, context, continuation in zip(choices, prompts, contexts, continuations):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(lp["tokens"]) == len(prompt) + max_tokens
        value, greedy = lm_eval_parse(choice, len(context), end)
        # the continuation's own tokens, each scored: not the empty sum (0) of before
        assert len(lp["token_logprobs"][len(context):end]) == len(continuation)
        assert value < 0 and greedy
        scores.append(value)
    assert len(continuations[1]) > 1 and scores[0] != scores[1]
    # the same request scores the same again
    assert [c.logprobs.token_logprobs for c in again.choices] == \
        [c["logprobs"]["token_logprobs"] for c in choices]

"""Pooling models (embeddings, scores): presets with a [pooling] table, and a pooling
request (max_tokens 0) run as vLLM runs one: its prefill through the same scheduler,
finished by the step that completes its prompt, nothing generated."""

from __future__ import annotations

import pytest

from inference_lab.common.toml import ConfigError
from inference_lab.engine.sim.catalog import load_model, parse_model
from inference_lab.engine.sim.core import SubmitError
from inference_lab.engine.sim.lengths import OutputLength
from inference_lab.engine.sim.specs import Pooling

from factories import core, run_until_idle


def test_the_pooling_presets_carry_their_models_public_facts():
    bge = load_model("bge-base-en-v1.5")
    assert bge.pooling == Pooling("embed", 768, True, False, (), "CLS", True)
    assert bge.max_seq_len == 512 and bge.weight_streams[0].resident_params == 109_482_240
    qwen = load_model("qwen3-embedding-0.6b")
    assert (qwen.pooling.dimensions, qwen.pooling.matryoshka, qwen.pooling.pooling_type) == (1024, True, "LAST")
    assert qwen.max_seq_len == 32768 and qwen.weight_streams[0].resident_params == 595_776_512
    reranker = load_model("bge-reranker-v2-m3")
    assert (reranker.pooling.task, reranker.pooling.dimensions, reranker.pooling.normalize) == ("score", 1, False)
    assert load_model("gpt-oss-20b").pooling is None  # generative


def test_a_bad_pooling_table_is_refused_with_its_key_path():
    table = {"name": "m", "hidden_dim": 64, "max_seq_len": 128,
             "weights": [{"precision": "bf16", "active_params": 1e6, "resident_params": 1e6}],
             "layers": [{"kind": "attention", "count": 2, "heads": 2, "head_dim": 32, "kv_heads": 2}]}
    assert parse_model({**table, "pooling": {"task": "embed"}}, "m.toml").pooling.dimensions == 64
    with pytest.raises(ConfigError, match=r"pooling.task.*'embed' or 'score'"):
        parse_model({**table, "pooling": {"task": "generate"}}, "m.toml")
    with pytest.raises(ConfigError, match=r"pooling.matryoshka_dimensions"):
        parse_model({**table, "pooling": {"task": "embed", "matryoshka_dimensions": [32, 128]}}, "m.toml")
    with pytest.raises(ConfigError, match=r"pooling.colour"):
        parse_model({**table, "pooling": {"task": "embed", "colour": 1}}, "m.toml")


def test_a_pooling_request_finishes_with_its_prefill_and_keeps_no_token():
    engine = core(model="bge-base-en-v1.5", enable_chunked_prefill=False, enable_prefix_caching=False)
    req = engine.submit(100, 0, 0.0)
    end, results = run_until_idle(engine)
    assert len(results) == 1  # one step: the prefill; no decode step follows
    step = results[0]
    assert step.prefill_tokens == 100 and step.num_decodes == 0 and step.finished == [req]
    assert req.pooling and req.eos and req.finish_time == end == req.first_token


def test_a_pooling_request_is_costed_as_the_same_prompts_prefill():
    # The cost model prices the step's tokens: 100 prompt tokens either way.
    pooled, generated = core(model="qwen3-embedding-0.6b"), core(model="qwen3-embedding-0.6b")
    pooled.submit(100, 0, 0.0)
    generated.submit(100, 1, 0.0)
    assert run_until_idle(pooled)[0] == pytest.approx(run_until_idle(generated)[0], rel=1e-12)


def test_a_pooling_request_takes_a_prompt_as_long_as_the_model_and_no_more():
    engine = core(model="bge-base-en-v1.5", enable_chunked_prefill=False)
    assert engine.submit(512, 0, 0.0).pooling  # max_model_len 512: no room kept for a token
    with pytest.raises(SubmitError, match="exceeds max_model_len 512"):
        engine.submit(513, 0, 0.0)
    with pytest.raises(SubmitError, match="n must be 1"):
        engine.submit(10, 0, 0.0, n=2)


def test_a_workload_draw_never_gives_a_pooling_request_a_length():
    engine = core(lengths=OutputLength(sampler=lambda: 50), model="qwen3-embedding-0.6b")
    req = engine.submit(64, 0, 0.0)
    assert req.pooling and req.max_tokens == 1
    assert len(run_until_idle(engine)[1]) == 1


def test_pooling_and_generation_share_the_batch_of_one_model():
    # A decoder model asked for both: the pooling prefill rides in the decodes' step.
    engine = core(model="qwen3-embedding-0.6b")
    chat = engine.submit(16, 4, 0.0)
    engine.step(0.0)  # chat's prefill (and its first token)
    pooled = engine.submit(32, 0, engine.clock)
    step = engine.step(engine.clock)
    assert step.num_decodes == 1 and step.prefill_tokens == 32 and step.finished == [pooled]
    assert not chat.finished

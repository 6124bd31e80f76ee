"""Speculative decoding: the expected-acceptance formula, the draft cost, and an engine
whose decodes verify 1 + g positions and keep 1 + accepted of them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from inference_lab.common.toml import ConfigError, Table
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.specs import Drafter, Speculative
from inference_lab.engine.sim.speculative import (
    bank_curve, draft_seconds, expected_accepted, parse_speculative,
)
from factories import deployment, run_until_idle


def test_constant_acceptance_is_the_geometric_sum():
    # alpha = 0.8, gamma = 4: 0.8 + 0.64 + 0.512 + 0.4096 = 2.3616
    # = (1 - 0.8^5) / (1 - 0.8) - 1 = (1 - 0.32768) / 0.2 - 1
    assert expected_accepted([0.8] * 4, 4) == pytest.approx(2.3616)
    assert expected_accepted([0.8] * 4, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2 - 1)


def test_per_position_acceptance_multiplies_the_conditional_rates():
    # a = (0.9, 0.5, 0.2): 0.9 + 0.45 + 0.09 = 1.44; depths past the list never accept.
    assert expected_accepted([0.9, 0.5, 0.2], 3) == pytest.approx(1.44)
    assert expected_accepted([0.9, 0.5, 0.2], 6) == pytest.approx(1.44)
    assert expected_accepted([0.9, 0.5, 0.2], 1) == pytest.approx(0.9)
    assert expected_accepted([0.9], 0) == 0.0


def test_a_trace_bank_curve_is_the_mean_of_the_truncated_commits():
    # rounds committing 0, 2 and 5 tokens: g = 1 -> (0+1+1)/3, g = 3 -> (0+2+3)/3
    assert bank_curve([0, 2, 5], 3) == pytest.approx((0.0, 2 / 3, 4 / 3, 5 / 3))


def test_the_drafter_kinds_price_a_draft_by_their_formulas():
    peak, bw = 1e15, 1e12
    assert draft_seconds(Drafter("fraction", frac=0.1), 3, 8, peak, bw, 0.01) == pytest.approx(0.003)
    # one dense 1e9-parameter head, 4 passes over 8 sequences: each pass
    # max(2 * 1e9 * 8 / 1e15, 2 * 1e9 / 1e12) = max(16 us, 2 ms) = 2 ms
    dense = Drafter("autoregressive", dense_params=1e9)
    assert draft_seconds(dense, 4, 8, peak, bw, 0.0) == pytest.approx(4 * 2e-3)
    # a block of 16 positions costs the same whatever the draft length
    block = Drafter("block_parallel", params=1e9, block=16)
    assert draft_seconds(block, 1, 8, peak, bw, 0.0) == draft_seconds(block, 7, 8, peak, bw, 0.0)
    assert draft_seconds(dense, 0, 8, peak, bw, 0.0) == 0.0


def speculative_table(text: dict) -> Table:
    return Table(text, "cfg.toml", "speculative")


def test_a_missing_trace_bank_turns_speculation_off_and_says_so(tmp_path):
    spec, notes = parse_speculative(speculative_table(
        {"gamma": 8, "policy": "gated_aggregate",
         "acceptance": {"kind": "trace_rounds", "path": "data/none.csv"}}), tmp_path)
    assert spec is None
    assert any("'data/none.csv' not found" in n and "speculative decoding off" in n for n in notes)
    assert any("gated_aggregate" in n for n in notes)


def test_a_trace_bank_next_to_the_config_is_read(tmp_path):
    (tmp_path / "bank.csv").write_text("commits,category,a0,a1\n0,x,0.5,0.4\n2,x,0.9,0.8\n")
    spec, notes = parse_speculative(speculative_table(
        {"gamma": 2, "acceptance": {"kind": "trace_rounds", "path": "bank.csv"}}), tmp_path)
    assert spec.expected == pytest.approx((0.0, 0.5, 1.0)) and notes == []


def test_a_bad_acceptance_is_refused_with_its_key(tmp_path):
    with pytest.raises(ConfigError, match=r"cfg.toml: speculative.acceptance.alpha: expected a number in \[0, 1\], got 1.5"):
        parse_speculative(speculative_table(
            {"gamma": 2, "acceptance": {"kind": "constant", "alpha": 1.5}}), tmp_path)


def spec_core(alpha: float, gamma: int, policy: str = "fixed", **kw) -> EngineCore:
    expected = tuple(expected_accepted([alpha] * gamma, g) for g in range(gamma + 1))
    dep = replace(deployment(**kw), speculative=Speculative(gamma, expected, policy))
    return EngineCore(dep)


def test_decodes_keep_one_plus_the_expected_accepted_tokens_per_step():
    # alpha 0.5, gamma 2: E = 0.5 + 0.25 = 0.75, so 1.75 tokens per step on average:
    # 200 tokens after the first (sampled by the prefill) take ceil(199 / 1.75) = 114 steps.
    engine = spec_core(0.5, 2)
    req = engine.submit(16, 200, 0.0)
    _, steps = run_until_idle(engine)
    assert req.num_output == 200
    decode_steps = [s for s in steps if s.prefill_tokens == 0]
    assert len(decode_steps) == 114
    assert {s.num_tokens for s in decode_steps} == {3}  # verifies 1 + 2 positions
    assert sum(s.sampled for s in steps) == 200
    plain = EngineCore(deployment())
    plain.submit(16, 200, 0.0)
    end_plain, plain_steps = run_until_idle(plain)
    assert len(plain_steps) == 200
    assert steps[-1].end < end_plain  # a verify of 3 positions costs about one decode


def test_the_engine_reports_tokens_at_each_progress_mark_with_speculation():
    engine = spec_core(1.0, 3)  # every draft accepted: 4 tokens per decode step
    req = engine.submit(16, 10, 0.0)
    engine.step(0.0)  # prefill: the first token
    assert engine.tokens_of(req) == 1
    engine.step(0.0)
    before, after = engine.progress_marks()
    assert (engine.tokens_at(req, before), engine.tokens_at(req, after)) == (1, 5)
    engine.step(0.0)
    engine.step(0.0)  # 9 -> 10: the final step gives only one
    before, after = engine.progress_marks()
    assert req.finished and (engine.tokens_at(req, before), engine.tokens_at(req, after)) == (9, 10)


def test_goodput_budget_drafts_less_when_verifying_is_compute_bound():
    # A dense model at batch 1: verifying is memory-bound (nearly free), so the full draft.
    # At batch 1024 the verify is compute-bound and a poor drafter is not worth it. (An MoE
    # model would draft less at batch 1 too: each verified position reads more experts.)
    small = spec_core(0.3, 4, "goodput_budget", model="llama-3.1-8b")
    small.submit(16, 50, 0.0)
    small.step(0.0)
    assert small.step(0.0).num_tokens == 5
    big = spec_core(0.3, 4, "goodput_budget", model="llama-3.1-8b", max_num_seqs=1024,
                    max_num_batched_tokens=16384)
    for _ in range(1024):
        big.submit(8, 50, 0.0)
    big.step(0.0)  # the 1024 prefills (8192 tokens)
    assert big.step(0.0).num_tokens == 1024  # no draft at all

"""The roofline cost model, against numbers worked out by hand from docs/timing.md."""

import logging

import pytest

from inference_lab.engine.sim.cost import AttentionLoad, attention_load, decode_sums, expected_distinct_experts
from inference_lab.engine.sim.cost import CostModel
from inference_lab.engine.sim.specs import TimeCorrection
from factories import deployment

# gpt-oss-20b preset, written out once: fp4 experts and a bf16 rest.
FP4_ACTIVE, FP4_RESIDENT = 2_388_787_200, 19_110_297_600
BF16_ACTIVE = 1_218_355_200
KV_BYTES_PER_POSITION_PER_CLASS = 12 * 2 * 8 * 64 * 2  # 12 layers, K+V, 8 heads, dim 64, bf16


def decodes(model: CostModel, contexts: list[int]) -> AttentionLoad:
    """The load of one decode per entry, each with that many computed positions."""
    return attention_load(model.caps, [], decode_sums(model.caps, contexts), decodes=len(contexts))


def test_expected_distinct_experts_follows_the_coupon_collector_formula():
    # One token touches its k = 4 distinct experts; two tokens, top-4 of 32:
    # 32 (1 - (28/32)^2) = 7.5 (each expert escapes a token with probability 28/32)
    assert expected_distinct_experts(32, 4, 1) == pytest.approx(4.0, rel=1e-12)
    assert expected_distinct_experts(32, 4, 2) == pytest.approx(7.5, rel=1e-12)
    # Many tokens touch every expert.
    assert expected_distinct_experts(32, 4, 10_000) == pytest.approx(32.0)


def test_a_decode_step_of_gpt_oss_20b_at_batch_24_on_b200_takes_about_1_46_ms():
    # 24 decodes with 100 computed positions each: m = 101 < window 128.
    # fp4: w = (19.110e9 - 2.389e9) / 28 = 597.2e6 params per expert, no shared part;
    #      distinct = 32 (1 - (28/32)^24) = 30.70 -> 30.70 * 597.2e6 * 0.5 B = 9.17e9 B
    #      -> 1.1459 ms at 8 TB/s (compute 12.7 us: memory bound).
    # bf16: 2.437e9 B of weights + 2 classes * 24576 B * 24 * 101 of KV = 2.556e9 B
    #      -> 0.3195 ms. Total 1.465 ms.
    model = CostModel(deployment())
    w = (FP4_RESIDENT - FP4_ACTIVE) / 28
    fp4_bytes = 32 * (1 - (28 / 32) ** 24) * w * 0.5
    bf16_bytes = BF16_ACTIVE * 2 + 2 * KV_BYTES_PER_POSITION_PER_CLASS * 24 * 101
    expected = fp4_bytes / 8e12 + bf16_bytes / 8e12
    cost = model.step_cost(24, decodes(model, [100] * 24))
    assert cost.seconds == pytest.approx(expected, rel=1e-9)
    assert cost.seconds == pytest.approx(1.465e-3, abs=0.005e-3)
    assert cost.bound == "memory"


def test_sliding_window_layers_attend_at_most_the_window():
    model = CostModel(deployment())
    assert model.caps == (0, 128)
    short = decodes(model, [1000])
    # m = 1001: full layers read 1001 positions, windowed layers 128.
    assert short.decode_p == (1001, 128)


def test_a_prefill_chunk_attends_its_mean_causal_context():
    load = attention_load((0, 128), [(16, 0)])
    # m = 0 + ceil(16/2) = 8; FLOP positions n*m = 128.
    assert load.prefill_p == (8, 8) and load.prefill_np == (128, 128) and load.sequences == 1


def test_a_large_prefill_is_compute_bound():
    model = CostModel(deployment())
    cost = model.step_cost(8192, attention_load(model.caps, [(8192, 0)]))
    assert cost.bound == "compute"


def test_tensor_parallel_adds_two_all_reduces_per_layer():
    one = CostModel(deployment("llama-3.1-70b", tp=1))
    two = CostModel(deployment("llama-3.1-70b", tp=2))
    load = AttentionLoad()
    t1 = one.step_cost(8, load).seconds
    t2 = two.step_cost(8, load).seconds
    # Weights split over two GPUs halve the memory time; 160 all-reduces of
    # 8 tokens * 8192 hidden * 2 B each at 900 GB/s plus 5 us latency are added.
    collectives = 2 * 80 * (5e-6 + 8 * 8192 * 2 / 9e11)
    assert t2 == pytest.approx(t1 / 2 + collectives, rel=1e-9)


def test_time_correction_applies_alpha_and_beta():
    plain = CostModel(deployment())
    corrected = CostModel(deployment(time_correction=TimeCorrection(alpha=2.0, beta=1e-3)))
    load = decodes(plain, [50] * 4)
    assert corrected.step_cost(4, load).seconds == pytest.approx(
        2.0 * plain.step_cost(4, load).seconds + 1e-3)


def test_a_precision_the_hardware_lacks_is_priced_at_the_next_wider_one(caplog):
    caplog.set_level(logging.INFO)
    # fp4 experts on an H100 run at its fp8 rate, and the load says so.
    model = CostModel(deployment(hardware="h100"))
    assert "fp4 is priced at fp8" in caplog.text
    # 8192 tokens are compute bound in both streams (weights alone, no attention):
    # fp4 at the fp8 rate 2 * 2.389e9 * 8192 / 1.979e15 = 19.78 ms,
    # bf16 2 * 1.218e9 * 8192 / 9.895e14 = 20.17 ms.
    big = model.step_cost(8192, AttentionLoad())
    expected = 2 * FP4_ACTIVE * 8192 / 1.979e15 + 2 * BF16_ACTIVE * 8192 / 9.895e14
    assert big.seconds == pytest.approx(expected, rel=1e-9)
    assert big.bound == "compute"


def test_a_steps_flops_and_bytes_per_gpu_are_the_rooflines_terms_with_the_new_kv_written():
    # 24 decodes with 100 computed positions each (m = 101 < window 128), as above.
    # FLOPs: 2 * active params per token (fp4 experts + bf16 rest) + attention, 2 classes
    #        of 12 layers * 4 * 64 heads * 64 per (new, attended) pair, 101 pairs each.
    # Reads: the step's weight and KV bytes (the time's terms). Writes: each of the 24 new
    #        positions' K and V in all 24 layers, 8 heads of 64 in bf16: 49,152 B each.
    model = CostModel(deployment())
    w = (FP4_RESIDENT - FP4_ACTIVE) / 28
    flops = 2 * (FP4_ACTIVE + BF16_ACTIVE) * 24 + 2 * 12 * 4 * 64 * 64 * 24 * 101
    reads = (32 * (1 - (28 / 32) ** 24) * w * 0.5 + BF16_ACTIVE * 2
             + 2 * KV_BYTES_PER_POSITION_PER_CLASS * 24 * 101)
    writes = 24 * 2 * KV_BYTES_PER_POSITION_PER_CLASS
    cost = model.step_cost(24, decodes(model, [100] * 24))
    assert (cost.flops, cost.read_bytes, cost.write_bytes) == pytest.approx((flops, reads, writes), rel=1e-12)
    # Per GPU, as vLLM counts them: at tp 2 each GPU does half the work and holds 4 of
    # the 8 KV heads, so every term halves.
    split = CostModel(deployment(tp=2)).step_cost(24, decodes(model, [100] * 24))
    assert (split.flops, split.read_bytes, split.write_bytes) == pytest.approx(
        (flops / 2, reads / 2, writes / 2), rel=1e-12)


def test_a_prefill_chunk_writes_the_kv_of_every_position_it_computes():
    # 16 new positions from 0 (m = 8): FLOPs 2 * active * 16 + 2 classes * 49,152 FLOPs
    # per pair * 16 * 8 pairs; KV read for 8 attended positions per class; 16 written.
    model = CostModel(deployment())
    w = (FP4_RESIDENT - FP4_ACTIVE) / 28
    cost = model.step_cost(16, attention_load(model.caps, [(16, 0)]))
    assert cost.flops == pytest.approx(2 * (FP4_ACTIVE + BF16_ACTIVE) * 16 + 2 * 12 * 4 * 64 * 64 * 16 * 8)
    assert cost.read_bytes == pytest.approx(32 * (1 - (28 / 32) ** 16) * w * 0.5 + BF16_ACTIVE * 2
                                            + 2 * KV_BYTES_PER_POSITION_PER_CLASS * 8)
    assert cost.write_bytes == 16 * 2 * KV_BYTES_PER_POSITION_PER_CLASS

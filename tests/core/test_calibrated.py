"""The calibrated timing model: its formula by hand, where its parameters come from, and
that the roofline stays the default."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from inference_lab.calibrate import fit_presets
from inference_lab.engine.sim import catalog
from inference_lab.engine.sim.config import ConfigError, load_deployment
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.cost import CostModel, attention_load
from inference_lab.engine.sim.specs import Calibration, Deployment, LayerClass, Model, SchedulerConfig, WeightStream

ROOT = Path(__file__).resolve().parents[2]
CAL = Calibration(flops_efficiency=0.5, flops_half_tokens=100.0, bandwidth_efficiency=0.8,
                  comm_efficiency=0.5, step_overhead=1e-3, request_overhead=20e-3)


def dense(timing: str = "calibrated") -> Deployment:
    model = Model(name="tiny", num_layers=2, hidden_size=4096, max_seq_len=8192,
                  weight_streams=(WeightStream("bf16", 1e9, 1e9),),
                  layer_classes=(LayerClass(2, 8, 128, 8),))
    hw = replace(catalog.load_hardware("b200"), calibration=CAL)
    return Deployment(name="tiny", model=model, hardware=hw, scheduler=SchedulerConfig(block_size=64),
                      timing=timing)


def test_a_calibrated_decode_step_by_hand():
    # 1 token, no attention: bytes 2e9 at 8e12 x 0.8 = 312.5 us; FLOPs 2e9 at
    # 2.25e15 x 0.5 x 1 / (1 + 100) = 11.14e12 -> 179.6 us: memory-bound; + 1 ms overhead.
    cost = CostModel(dense())
    load = attention_load(cost.caps, [])
    assert cost.step_cost(1, load).seconds == pytest.approx(1e-3 + 2e9 / (8e12 * 0.8), rel=1e-12)
    assert CostModel(dense("roofline")).step_cost(1, load).seconds == pytest.approx(2e9 / 8e12, rel=1e-12)


def test_calibrated_compute_ramps_with_the_tokens_of_a_step():
    # 900 tokens: efficiency 0.5 x 900 / 1000 = 0.45 -> 2e9 x 900 / (2.25e15 x 0.45) = 1.778 ms
    cost = CostModel(dense())
    load = attention_load(cost.caps, [])
    assert cost.step_cost(900, load).seconds == pytest.approx(1e-3 + 2e9 * 900 / (2.25e15 * 0.45), rel=1e-12)


def test_a_request_reaches_the_scheduler_after_its_overhead():
    engine = EngineCore(dense())
    req = engine.submit(16, 4, 0.0)
    first = engine.step(0.0)
    assert first.start == pytest.approx(20e-3) and req in first.admitted
    assert EngineCore(dense("roofline")).submit(16, 4, 0.0).ready == 0.0


def test_timing_is_chosen_per_entry_or_by_the_flag_and_needs_a_fit(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('model = "llama-3.1-8b"\n[hardware.h100]\ntiming = "calibrated"\n[hardware.a100]\n')
    assert load_deployment(path, "h100").timing == "calibrated"
    assert load_deployment(path, "h100", timing="roofline").timing == "roofline"
    assert load_deployment(path, "a100").timing == "roofline"
    with pytest.raises(ConfigError, match="calibrated timing needs a \\[calibration\\] table in the a100"):
        load_deployment(path, "a100", timing="calibrated")
    with pytest.raises(ConfigError, match="--timing: expected 'roofline', 'calibrated' or "
                                          "'calibrated-v<vLLM version>' .*got 'fast'"):
        load_deployment(path, "h100", timing="fast")


def test_the_fitted_presets_name_their_fit():
    for name in ("b200", "h100", "h200", "mi300x"):
        cal = catalog.load_hardware(name).calibration
        assert cal is not None and cal.fit.startswith(f"{fit_presets.PROVENANCE} on ")
        assert 0 < cal.bandwidth_efficiency <= 1 and 0 < cal.flops_efficiency <= 1
        assert cal.provenance == "fitted"


@pytest.mark.parametrize("name,source", [("b300", "b200"), ("gb200", "b200"),
                                         ("mi355x", "mi300x")])
def test_the_unfitted_presets_carry_their_neighbours_fit_unchanged(name, source):
    # The transfer rule (docs/timing.md): fractions of peak and fixed time costs carry over.
    cal, fitted = catalog.load_hardware(name).calibration, catalog.load_hardware(source).calibration
    assert cal is not None and cal.provenance == f"transferred from {source}"
    assert cal.fit == f"transferred from {source}: {fitted.fit}"
    assert replace(cal, fit="", transferred_from="") == replace(fitted, fit="")


def test_calibrated_deepseek_on_b300_is_slower_than_the_roofline_and_says_where_it_came_from(caplog):
    from inference_lab.common.workload import LengthDist, WorkloadSpec
    from inference_lab.engine.drivers.offline import run_offline

    spec = WorkloadSpec(arrival_pattern="closed_loop", num_concurrent_users=4, num_requests=8, seed=1,
                        input_len_dist=LengthDist("fixed", 1024), output_len_dist=LengthDist("fixed", 64))
    config = ROOT / "configs" / "deepseek-v3.toml"
    runs = {}
    for timing in ("roofline", "calibrated"):
        with caplog.at_level("WARNING", logger="inference_lab.engine.sim.config"):
            runs[timing] = run_offline(load_deployment(config, "b300", timing=timing), spec)
    assert runs["roofline"]["timing"] == {"model": "roofline"}
    assert runs["calibrated"]["timing"]["calibration"] == "transferred from b200"
    assert runs["calibrated"]["timing"]["fit"].startswith(
        f"transferred from b200: {fit_presets.PROVENANCE} on ")
    roof, cal = runs["roofline"]["latency_metrics"], runs["calibrated"]["latency_metrics"]
    assert cal["per_token_ms"]["mean"] > 2 * roof["per_token_ms"]["mean"]
    assert cal["ttft_ms"]["mean"] > roof["ttft_ms"]["mean"]
    load_deployment(config, "b300", timing="calibrated")  # logged once per process, not per load
    said = [r for r in caplog.records if "transferred from the b200 fit" in r.getMessage()]
    assert len(said) <= 1 and all("b300" in r.getMessage() for r in said)


def test_every_calibration_data_file_carries_its_provenance_and_a_held_out_part():
    files = sorted(fit_presets.DATA.glob("*.toml"))
    assert files
    for path in files:
        source = tomllib.loads(path.read_text())["source"]
        assert {"title", "url", "engine", "date", "settings"} <= set(source), path
    rows = fit_presets.load_rows()
    assert any(r.holdout for r in rows) and any(not r.holdout for r in rows)
    assert all(r.measured for r in rows)


def test_every_layer_adds_its_kernel_floor_to_a_calibrated_step():
    # 2 layers x 50 us on top of the 1-token step worked out above
    dep = dense()
    dep.hardware = replace(dep.hardware, calibration=replace(CAL, layer_overhead=50e-6))
    load = attention_load(CostModel(dep).caps, [])
    assert CostModel(dep).step_cost(1, load).seconds == pytest.approx(
        1e-3 + 2 * 50e-6 + 2e9 / (8e12 * 0.8), rel=1e-12)


def moe(ep: int = 1, expert_overhead: float = 2e-6) -> Deployment:
    # 8 experts top-2 over 4 MoE layers, 1e8 params per expert in all layers together
    stream = WeightStream("bf16", 2e8, 8e8, num_experts=8, top_k=2, moe_layers=4)
    model = Model(name="tiny-moe", num_layers=4, hidden_size=1024, max_seq_len=8192,
                  weight_streams=(stream,), layer_classes=(LayerClass(4, 8, 128, 8),))
    cal = Calibration(bandwidth_efficiency=0.5, expert_overhead=expert_overhead)
    hw = replace(catalog.load_hardware("b200"), calibration=cal)
    return Deployment(name="tiny-moe", model=model, hardware=hw, tp=ep, ep=ep,
                      scheduler=SchedulerConfig(block_size=64), timing="calibrated")


def test_every_touched_expert_adds_its_kernel_floor_per_moe_layer():
    # 3 tokens x top-2 over 8 experts touch 8 (1 - (6/8)^3) = 4.625 experts per layer;
    # bytes 4.625 x 1e8 x 2 B at 8e12 x 0.5; floor 4.625 x 4 layers x 2 us; with ep 2
    # each GPU holds half the experts: half the floor (and twice the bandwidth).
    touched = 8 * (1 - (6 / 8) ** 3)
    for ep in (1, 2):
        dep = moe(ep)
        cost = CostModel(dep)
        load = attention_load(cost.caps, [])
        expected = touched * 4 * 2e-6 / ep + touched * 1e8 * 2 / (8e12 * ep * 0.5)
        if ep > 1:  # the FFN and attention all-reduces of 3 tokens
            expected += 8 * (5e-6 + 3 * 1024 * 2 / 9e11)
        assert cost.step_cost(3, load).seconds == pytest.approx(expected, rel=1e-9)
    no_floor = CostModel(moe(1, 0.0))
    assert no_floor.step_cost(3, attention_load(no_floor.caps, [])).seconds == pytest.approx(
        touched * 1e8 * 2 / (8e12 * 0.5), rel=1e-9)


def test_the_calibrated_lm_head_computes_logits_once_per_sequence():
    # 1e9 params of which the LM head 32,000 x 4096 = 131.072e6; a 4,000-token prefill of
    # one sequence in one step is compute-bound: 2 (1e9 - 131.072e6) x 4000 + 2 x 131.072e6
    # FLOPs (+ attention) at 2.25e15. The roofline keeps charging every position.
    def build(timing: str) -> CostModel:
        dep = dense(timing)
        dep.model = replace(dep.model, vocab_size=32000)
        dep.hardware = replace(dep.hardware, calibration=Calibration())
        return CostModel(dep)
    head = 32000 * 4096
    cal, roof = build("calibrated"), build("roofline")
    load = attention_load(cal.caps, [(4000, 0)])
    attention = roof.step_cost(4000, load).seconds - 2e9 * 4000 / 2.25e15
    assert cal.step_cost(4000, load).seconds == pytest.approx(
        (2 * (1e9 - head) * 4000 + 2 * head) / 2.25e15 + attention, rel=1e-9)
    # without a vocab size nothing moves
    assert CostModel(dense()).step_cost(1, attention_load(cal.caps, [])).seconds == pytest.approx(
        1e-3 + 2e9 / (8e12 * 0.8), rel=1e-12)


def test_mla_layers_and_sequences_add_their_floors():
    # DeepSeek-R1: 61 MLA layers x 100 us more per step; 3 decodes x 30 us of host work
    def step(cal: Calibration) -> float:
        hw = replace(catalog.load_hardware("h200"), calibration=cal)
        dep = Deployment(name="r1", model=catalog.load_model("deepseek-r1"), hardware=hw, tp=8,
                         scheduler=SchedulerConfig(block_size=64), timing="calibrated")
        cost = CostModel(dep)
        return cost.step_cost(3, attention_load(cost.caps, (), (3000.0,) * len(cost.caps), 1, 3)).seconds
    base = step(Calibration())
    assert step(Calibration(mla_layer_overhead=100e-6)) - base == pytest.approx(61 * 100e-6, rel=1e-9)
    assert step(Calibration(sequence_overhead=30e-6)) - base == pytest.approx(3 * 30e-6, rel=1e-9)
    assert step(Calibration(layer_overhead=10e-6)) - base == pytest.approx(61 * 10e-6, rel=1e-9)


def test_moe_flops_run_at_their_own_efficiency():
    # 1000 tokens of the tiny MoE (no attention FLOPs counted here: none in the layers'
    # pairs of an empty load): 2 x 2e8 x 1000 FLOPs at 2.25e15 x 0.1 -- compute-bound
    # (all 8 experts' 1.6e9 B at 4e12 B/s take 0.4 ms, the FLOPs 1.78 ms); with
    # moe_flops_efficiency 0 they run at flops_efficiency (0.4).
    def step(moe_eff: float) -> float:
        dep = moe(1, 0.0)
        dep.hardware = replace(dep.hardware, calibration=Calibration(
            flops_efficiency=0.4, moe_flops_efficiency=moe_eff, bandwidth_efficiency=0.5))
        cost = CostModel(dep)
        return cost.step_cost(1000, attention_load(cost.caps, [])).seconds
    assert step(0.1) == pytest.approx(2 * 2e8 * 1000 / (2.25e15 * 0.1), rel=1e-9)
    assert step(0.0) == pytest.approx(2 * 2e8 * 1000 / (2.25e15 * 0.4), rel=1e-9)


def test_a_request_also_waits_its_host_time_per_prompt_token():
    # 20 ms + 1,000 prompt tokens x 4 us = 24 ms before the scheduler may take it
    dep = dense()
    dep.hardware = replace(dep.hardware, calibration=replace(CAL, prompt_token_overhead=4e-6))
    engine = EngineCore(dep)
    req = engine.submit(1000, 4, 0.0)
    assert req.ready == pytest.approx(24e-3, rel=1e-12)
    assert engine.step(0.0).start == pytest.approx(24e-3, rel=1e-12)


def test_a_request_waits_its_host_time_per_stream_already_in_the_engine():
    # 20 ms + 3 requests in the engine x 0.5 ms: the third arrival is schedulable at
    # 21 ms after it came, the first at 20 ms; none is delayed without the key
    dep = dense()
    dep.hardware = replace(dep.hardware, calibration=replace(CAL, stream_overhead=5e-4))
    engine = EngineCore(dep)
    first = engine.submit(100, 4, 0.0)
    second = engine.submit(100, 4, 0.0)
    third = engine.submit(100, 4, 0.0)
    assert first.ready == pytest.approx(20e-3, rel=1e-12)
    assert second.ready == pytest.approx(20.5e-3, rel=1e-12)
    assert third.ready == pytest.approx(21e-3, rel=1e-12)
    plain = EngineCore(dense())
    plain.submit(100, 4, 0.0)
    assert plain.submit(100, 4, 0.0).ready == plain.submit(100, 4, 0.0).ready


@pytest.mark.parametrize("batch", [1, 4, 16, 64, 128])
def test_a_decode_step_reads_the_experts_its_batch_touches_not_all_of_them(batch):
    # gpt-oss-120b: B sequences each routed to k = 4 of E = 128 distinct experts touch
    # E (1 - (1 - k/E)^B) of them: 15.3 at B = 4, 125.8 at 128, not all 128; a roofline
    # decode step reads the experts' bytes in that proportion (448 MB per expert over the
    # 36 layers, fp4).
    from inference_lab.engine.sim.cost import expected_distinct_experts

    e, k = 128, 4
    touched = e * (1 - (1 - k / e) ** batch)
    assert expected_distinct_experts(e, k, batch) == pytest.approx(touched, rel=1e-12)
    dep = Deployment(name="m", model=catalog.load_model("gpt-oss-120b"), hardware=catalog.load_hardware("b200"),
                     scheduler=SchedulerConfig(block_size=16))
    cost = CostModel(dep)
    empty = attention_load(cost.caps, [])
    per_expert = 114_661_785_600 / 128 * 0.5
    one = cost.step_cost(1, empty).seconds
    assert cost.step_cost(batch, empty).seconds - one == pytest.approx(
        (expected_distinct_experts(e, k, batch) - expected_distinct_experts(e, k, 1)) * per_expert / 8e12, rel=1e-6)


def test_a_step_that_carries_prefill_pays_the_mixed_step_overhead_and_a_decode_step_does_not():
    # gpt-oss-120b on one B200: 3 decodes alone, then the same 3 decodes beside a
    # 512-token prefill chunk; 5 ms more for the mixed step only.
    def steps(cal: Calibration) -> tuple[float, float]:
        hw = replace(catalog.load_hardware("b200"), calibration=cal)
        cost = CostModel(Deployment(name="g", model=catalog.load_model("gpt-oss-120b"), hardware=hw,
                                    scheduler=SchedulerConfig(block_size=16), timing="calibrated"))
        decodes = (3000.0,) * len(cost.caps)
        decode = cost.step_cost(3, attention_load(cost.caps, [], decodes, 1, 3)).seconds
        mixed = cost.step_cost(515, attention_load(cost.caps, [(512, 0)], decodes, 1, 3)).seconds
        return decode, mixed
    base_decode, base_mixed = steps(Calibration())
    decode, mixed = steps(Calibration(mixed_step_overhead=5e-3))
    assert decode == base_decode
    assert mixed - base_mixed == pytest.approx(5e-3, rel=1e-9)


def test_a_negative_mixed_step_overhead_is_refused_by_name():
    table = {"flops_bf16": 1e15, "memory_bandwidth": 1e12, "memory_capacity": 1e11,
             "calibration": {"mixed_step_overhead": -1e-3}}
    with pytest.raises(ConfigError, match="mixed_step_overhead: expected a number >= 0 \\(seconds\\), got -0.001"):
        catalog.parse_hardware(table, "hardware.x", name="x")


def test_the_fitter_recovers_a_mixed_step_overhead_from_ttft_and_tpot():
    # Points measured by the lab itself with 2 ms per mixed step: a fit of that one key,
    # from 0, finds it again (a prompt of 2048 tokens over 1024-token steps: two mixed
    # steps per request, seen in its TTFT and, with 8 clients, in its TPOT).
    from inference_lab.calibrate.fitting import Evaluator, fit
    from inference_lab.calibrate.simulate import Point, simulate

    hw = replace(catalog.load_hardware("b200"), calibration=Calibration(step_overhead=1e-3))
    dep = Deployment(name="g", model=catalog.load_model("gpt-oss-20b"), hardware=hw, timing="calibrated",
                     scheduler=SchedulerConfig(block_size=64, max_num_batched_tokens=1024))
    truth = replace(hw.calibration, mixed_step_overhead=2e-3)
    points = []
    for c in (2, 8):
        p = Point(f"c={c}", dep, c, 2048, 32, {"ttft_ms": 1.0, "tpot_ms": 1.0}, requests=4 * c)
        sim = simulate(p, truth)
        points.append(replace(p, measured={"ttft_ms": sim["ttft_ms"], "tpot_ms": sim["tpot_ms"]}))
    result = fit(Evaluator(points), hw.calibration, ["mixed_step_overhead"], [0, 1], max_iter=8)
    assert result.fitted == ["mixed_step_overhead"]
    assert result.calibration.mixed_step_overhead == pytest.approx(2e-3, rel=0.05)


def _gpt_oss_120b(cal: Calibration) -> CostModel:
    hw = replace(catalog.load_hardware("b200"), calibration=cal)
    return CostModel(Deployment(name="g", model=catalog.load_model("gpt-oss-120b"), hardware=hw,
                                scheduler=SchedulerConfig(block_size=16), timing="calibrated"))


def test_a_skewed_router_touches_fewer_experts_at_a_middling_batch_and_all_of_them_at_a_large_one():
    from inference_lab.engine.sim.cost import expected_distinct_experts

    e, k = 128, 4
    assert expected_distinct_experts(e, k, 32, 0.0) == pytest.approx(e * (1 - (1 - k / e) ** 32), rel=1e-12)
    # Zipf exponent 1 by hand: the e-th expert is chosen with probability k e^-1 / H_128
    h = sum(1 / i for i in range(1, e + 1))
    by_hand = sum(1 - (1 - min(1.0, k / (i * h))) ** 32 for i in range(1, e + 1))
    assert expected_distinct_experts(e, k, 32, 1.0) == pytest.approx(by_hand, rel=1e-12)
    assert by_hand < 0.7 * expected_distinct_experts(e, k, 32, 0.0)
    assert expected_distinct_experts(e, k, 1, 1.0) == pytest.approx(k, rel=1e-12)  # one token: its k
    assert expected_distinct_experts(e, k, 100_000, 1.0) == pytest.approx(e, rel=1e-6)
    # and a decode step of 32 reads that many experts' bytes, no more
    cal = Calibration()
    plain, skewed = _gpt_oss_120b(cal), _gpt_oss_120b(replace(cal, routing_skew=1.0))
    empty = attention_load(plain.caps, [])
    per_expert = 114_661_785_600 / 128 * 0.5
    saved = plain.step_cost(32, empty).seconds - skewed.step_cost(32, empty).seconds
    assert saved == pytest.approx((expected_distinct_experts(e, k, 32) - by_hand) * per_expert / 8e12, rel=1e-6)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_the_unhidden_share_of_a_streams_shorter_time_adds_to_its_longer(fraction):
    # the tiny dense model at 1 token is memory-bound (312.5 us of bytes, 179.6 us of
    # FLOPs: test_a_calibrated_decode_step_by_hand); the share of the FLOPs' time not
    # hidden under the bytes adds to the step
    dep = dense()
    dep = replace(dep, hardware=replace(dep.hardware, calibration=replace(CAL, unoverlapped_fraction=fraction)))
    cost = CostModel(dep)
    flops_time = 2e9 / (2.25e15 * 0.5 / 101)
    assert cost.step_cost(1, attention_load(cost.caps, [])).seconds == pytest.approx(
        1e-3 + 2e9 / (8e12 * 0.8) + fraction * flops_time, rel=1e-9)


@pytest.mark.parametrize("key,value,message", [
    ("unoverlapped_fraction", 1.5, "unoverlapped_fraction: expected a number in \\[0, 1\\], got 1.5"),
    ("routing_skew", -0.1, "routing_skew: expected a number >= 0 \\(Zipf exponent\\), got -0.1"),
])
def test_an_out_of_range_overlap_or_routing_skew_is_refused_by_name(key, value, message):
    table = {"flops_bf16": 1e15, "memory_bandwidth": 1e12, "memory_capacity": 1e11,
             "calibration": {key: value}}
    with pytest.raises(ConfigError, match=message):
        catalog.parse_hardware(table, "hardware.x", name="x")


@pytest.mark.parametrize("tokens", [1, 900])
def test_the_collectives_token_bytes_run_at_their_own_bandwidth_fraction_and_their_latency_does_not(tokens):
    # tp 2 on b200 (in-switch reduction: f = 1): 2 layers -> 4 all-reduces a step, each
    # 5 us / comm_efficiency + tokens x 4096 x 2 bytes / 900e9 / comm_bandwidth_efficiency.
    def cost(comm_bw: float) -> float:
        dep = dense()
        dep = replace(dep, tp=2, hardware=replace(dep.hardware, calibration=replace(
            CAL, comm_bandwidth_efficiency=comm_bw)))
        model = CostModel(dep)
        return model.step_cost(tokens, attention_load(model.caps, [])).seconds

    per_byte_time = 4 * tokens * 4096 * 2 / 900e9
    assert cost(0.25) - cost(0.0) == pytest.approx(per_byte_time * (1 / 0.25 - 1 / 0.5), rel=1e-9)
    assert cost(0.5) == pytest.approx(cost(0.0), rel=1e-12)  # 0: as comm_efficiency (0.5)


def test_an_out_of_range_collective_bandwidth_fraction_is_refused_by_name():
    table = {"flops_bf16": 1e15, "memory_bandwidth": 1e12, "memory_capacity": 1e11,
             "calibration": {"comm_bandwidth_efficiency": 1.5}}
    with pytest.raises(ConfigError, match=r"comm_bandwidth_efficiency: expected a number in \[0, 1\] "
                                          r"\(0: as comm_efficiency\), got 1.5"):
        catalog.parse_hardware(table, "hardware.x", name="x")


def moe_at(precision: str, cal: Calibration) -> Deployment:
    # the tiny MoE of moe() with its experts stored at `precision`
    stream = WeightStream(precision, 2e8, 8e8, num_experts=8, top_k=2, moe_layers=4)
    model = Model(name="tiny-moe", num_layers=4, hidden_size=1024, max_seq_len=8192,
                  weight_streams=(stream,), layer_classes=(LayerClass(4, 8, 128, 8),))
    hw = replace(catalog.load_hardware("b200"), calibration=cal)
    return Deployment(name="tiny-moe", model=model, hardware=hw,
                      scheduler=SchedulerConfig(block_size=64), timing="calibrated")


@pytest.mark.parametrize("fp4_floor", [None, 0.0, 5e-6])
def test_four_bit_experts_pay_their_own_floor_when_it_is_set_and_others_never_do(fp4_floor):
    # 3 tokens touch 4.625 of 8 experts in each of 4 MoE layers (the test above)
    touched = 8 * (1 - (6 / 8) ** 3)
    cal = Calibration(bandwidth_efficiency=0.5, expert_overhead=2e-6, fp4_expert_overhead=fp4_floor)

    def seconds(precision: str, c: Calibration) -> float:
        cost = CostModel(moe_at(precision, c))
        return cost.step_cost(3, attention_load(cost.caps, [])).seconds

    no_floor = replace(cal, expert_overhead=0.0, fp4_expert_overhead=0.0)
    fp4_floor_paid = seconds("fp4", cal) - seconds("fp4", no_floor)
    assert fp4_floor_paid == pytest.approx(touched * 4 * (2e-6 if fp4_floor is None else fp4_floor),
                                           rel=1e-9, abs=1e-15)
    # fp8 (and bf16) experts pay expert_overhead whatever the 4-bit floor
    for precision in ("fp8", "bf16"):
        assert seconds(precision, cal) - seconds(precision, no_floor) == pytest.approx(
            touched * 4 * 2e-6, rel=1e-9)


def test_the_four_bit_expert_floor_is_absent_unless_given_and_refused_below_zero():
    table = {"flops_bf16": 1e15, "memory_bandwidth": 1e12, "memory_capacity": 1e11,
             "calibration": {"expert_overhead": 2e-6}}
    assert catalog.parse_hardware(table, "hardware.x", name="x").calibration.fp4_expert_overhead is None
    table["calibration"]["fp4_expert_overhead"] = 0
    assert catalog.parse_hardware(table, "hardware.x", name="x").calibration.fp4_expert_overhead == 0.0
    table["calibration"]["fp4_expert_overhead"] = -1e-6
    with pytest.raises(ConfigError, match=r"fp4_expert_overhead: expected a number >= 0 "
                                          r"\(seconds; absent: as expert_overhead\), got -1e-06"):
        catalog.parse_hardware(table, "hardware.x", name="x")


@pytest.mark.parametrize("key, other, unset, set_to", [
    ("moe_flops_efficiency", "flops_efficiency", 0.0, 0.1),
    ("comm_bandwidth_efficiency", "comm_efficiency", 0.0, 0.9),
    ("kv_bandwidth_efficiency", "bandwidth_efficiency", 0.0, 0.95),
    ("fp4_expert_overhead", "expert_overhead", None, 0.0),  # 0: no floor, not unset
])
def test_a_key_left_unset_takes_effect_as_the_key_it_stands_for(key, other, unset, set_to):
    cal = Calibration(flops_efficiency=0.4, comm_efficiency=0.3, bandwidth_efficiency=0.8,
                      expert_overhead=2e-6)
    assert getattr(cal, key) == unset
    assert cal.resolved(key) == getattr(cal, other)
    assert replace(cal, **{key: set_to}).resolved(key) == set_to
    assert cal.resolved(other) == getattr(cal, other)  # a key with no stand-in is itself


def test_the_fitter_names_why_a_four_bit_floor_cannot_be_fitted_without_four_bit_experts():
    from inference_lab.calibrate.fitting import applicable
    from inference_lab.calibrate.simulate import Point

    def point(precision: str) -> Point:
        return Point("c=1", moe_at(precision, Calibration()), 1, 128, 16, {"tpot_ms": 1.0})

    keep, why = applicable([point("fp8")], ["fp4_expert_overhead", "expert_overhead"])
    assert keep == ["expert_overhead"]
    assert why == {"fp4_expert_overhead": "no point serves a model with 4-bit experts"}
    keep, why = applicable([point("fp8"), point("fp4")], ["fp4_expert_overhead"])
    assert keep == ["fp4_expert_overhead"] and why == {}


def test_a_written_preset_carries_the_four_bit_floor_only_when_it_is_set():
    from inference_lab.calibrate.preset import calibration_table

    unset = calibration_table(Calibration(expert_overhead=2e-6), [])
    assert "expert_overhead = 2e-06" in unset and "fp4_expert_overhead" not in unset
    written = calibration_table(Calibration(expert_overhead=2e-6, fp4_expert_overhead=0.0), [])
    assert "fp4_expert_overhead = 0.0" in written
    table = tomllib.loads(written)["calibration"]
    assert catalog.parse_hardware({"flops_bf16": 1e15, "memory_bandwidth": 1e12, "memory_capacity": 1e11,
                                   "calibration": table}, "h", name="h").calibration.fp4_expert_overhead == 0.0


@pytest.mark.parametrize("value", ["-0.1", "nan", "strong"])
def test_fit_presets_refuses_a_prior_weight_below_zero_naming_the_flag(value, capsys, monkeypatch):
    # a negative weight would act as its square, the same hold as the positive one
    monkeypatch.setattr("sys.argv", ["fit_presets", "--prior", value, "--report-only"])
    with pytest.raises(SystemExit) as exit_:
        fit_presets.main()
    assert exit_.value.code == 2
    assert f"argument --prior: expected a weight of 0 or more, got '{value}'" in capsys.readouterr().err

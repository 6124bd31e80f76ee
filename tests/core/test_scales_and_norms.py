"""Two costs a model's own format and layers add: the block scales a microscaled weight
format stores beside its values (NVFP4: an FP8 scale per 16 values), which a step reads
and the GPU holds, and the all-reduce a norm over all heads needs under tensor
parallelism (MiniMax-M2's QK norm)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from factories import inline_model

from inference_lab.engine.sim import catalog, kv
from inference_lab.engine.sim.config import ConfigError, load_deployment
from inference_lab.engine.sim.cost import CostModel, attention_load
from inference_lab.engine.sim.specs import Calibration, Deployment, SchedulerConfig

NVFP4_EXPERTS = 224_680_476_672  # MiniMax-M2.5's routed expert params (62 layers x 256 experts)


def minimax(model: str = "minimax-m2.5-nvfp4", tp: int = 1, timing: str = "roofline",
            cal: Calibration | None = None) -> Deployment:
    hw = catalog.load_hardware("b200")
    if cal is not None:
        hw = replace(hw, calibration=cal)
    return Deployment(name="m", model=catalog.load_model(model), hardware=hw, tp=tp, timing=timing,
                      scheduler=SchedulerConfig(block_size=16, kv_cache_dtype="fp8"))


def test_nvfp4_experts_weigh_their_scales_too():
    # 0.5 B per value + one FP8 scale per 16 values = 0.5625 B; the bf16 rest 4,008,443,904 x 2
    stream = catalog.load_model("minimax-m2.5-nvfp4").weight_streams[0]
    assert (stream.precision, stream.scale_block, stream.bytes_per_value) == ("fp4", 16, 0.5625)
    assert kv.weight_bytes(minimax()) == NVFP4_EXPERTS * 0.5625 + 4_008_443_904 * 2 == 134_399_655_936
    # one B200: 192e9 x 0.9 - 134,399,655,936 B = 38,400,344,064 B of KV; a block of 16
    # positions at fp8 is 16 x 126,976 B -> 18,901 blocks (25,813 without the scales)
    assert kv.total_blocks(minimax()) == 38_400_344_064 // (16 * 126_976) == 18_901


def test_a_decode_step_reads_the_scales_of_the_experts_it_touches():
    # 4 decodes touch 256 (1 - (1 - 8/256)^4) experts per layer; the roofline step reads
    # each one's values and scales: 1/16 B per value more than the bare fp4 values.
    with_scales = CostModel(minimax())
    bare_model = catalog.load_model("minimax-m2.5-nvfp4")
    bare_model = replace(bare_model, weight_streams=(replace(bare_model.weight_streams[0], scale_block=0),
                                                     *bare_model.weight_streams[1:]))
    bare = CostModel(replace(minimax(), model=bare_model))
    empty = attention_load(with_scales.caps, [])
    touched = 256 * (1 - (1 - 8 / 256) ** 4)
    expected = touched * NVFP4_EXPERTS / 256 / 16 / 8e12
    assert with_scales.step_cost(4, empty).seconds - bare.step_cost(4, empty).seconds == pytest.approx(
        expected, rel=1e-9)


def test_a_scale_block_must_be_a_positive_integer(tmp_path: Path):
    path = tmp_path / "m.toml"
    path.write_text(inline_model('precision = "fp4"\nscale_block = 0\nactive_params = 1.0e9\n'
                                 'resident_params = 1.0e9\n'))
    with pytest.raises(ConfigError) as info:
        load_deployment(path, "b200")
    assert "model.weights[0].scale_block: expected an integer >= 1, got 0" in str(info.value)


@pytest.mark.parametrize("tokens", [4, 2048])
def test_the_qk_norm_of_minimax_all_reduces_its_variances_once_per_layer_under_tp(tokens):
    # 62 layers, each one more all-reduce over the TP group: 5 us + 8 B per token over
    # the switch (in-network reduction); none on one GPU.
    def step(tp: int, norms: int) -> float:
        dep = minimax("minimax-m2.5-fp8", tp)
        classes = tuple(replace(c, norm_all_reduces=norms) for c in dep.model.layer_classes)
        cost = CostModel(replace(dep, model=replace(dep.model, layer_classes=classes)))
        return cost.step_cost(tokens, attention_load(cost.caps, [])).seconds
    assert catalog.load_model("minimax-m2.5-fp8").layer_classes[0].norm_all_reduces == 1
    assert step(2, 1) - step(2, 0) == pytest.approx(62 * (5e-6 + tokens * 8 / 9e11), rel=1e-9)
    assert step(1, 1) == step(1, 0)


def test_gpu_work_per_sequence_splits_over_the_tp_group_and_host_work_does_not():
    # 3 decodes: 40 us of kernel work per sequence over 4 GPUs, 2 us of host work each
    def step(cal: Calibration) -> float:
        cost = CostModel(minimax(tp=4, timing="calibrated", cal=cal))
        return cost.step_cost(3, attention_load(cost.caps, [], (9000.0,) * len(cost.caps), 1, 3)).seconds
    base = step(Calibration())
    assert step(Calibration(sequence_kernel_overhead=40e-6)) - base == pytest.approx(3 * 40e-6 / 4, rel=1e-9)
    assert step(Calibration(sequence_overhead=2e-6)) - base == pytest.approx(3 * 2e-6, rel=1e-9)

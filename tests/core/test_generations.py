"""vLLM generations of the calibrated timing (engine.sim.generations) and the decode
attention's own KV bandwidth: how a timing name picks a fit, how a preset declares one,
and a KV read priced by hand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from inference_lab.engine.sim import catalog, generations
from inference_lab.engine.sim.catalog import Catalog
from inference_lab.engine.sim.config import ConfigError, load_deployment
from inference_lab.engine.sim.cost import CostModel, attention_load, decode_sums
from inference_lab.engine.sim.specs import Calibration, Deployment, LayerClass, Model, SchedulerConfig, WeightStream

GPU = """\
flops_bf16 = 1.0e15
memory_bandwidth = 4.0e12
memory_capacity = 80e9
[calibration]
vllm_version = "0.11"
step_overhead = 1e-3
[calibration.generations."0.22"]
step_overhead = 2e-3
"""


def test_timing_names_and_the_generation_they_ask_for():
    assert generations.parse_timing("roofline") == ("roofline", "")
    assert generations.parse_timing("calibrated") == ("calibrated", "")
    assert generations.parse_timing("calibrated-v0.22") == ("calibrated", "0.22")
    for bad in ("calibrated-0.22", "calibrated-v", "calibrated-vX", "fast"):
        with pytest.raises(ValueError, match="calibrated-v<vLLM version>"):
            generations.parse_timing(bad)


def gpu_catalog(tmp_path: Path, text: str = GPU) -> Catalog:
    (tmp_path / "cat" / "hardware").mkdir(parents=True)
    (tmp_path / "cat" / "hardware" / "gpu.toml").write_text(text)
    (tmp_path / "m.toml").write_text('model = "llama-3.1-8b"\n[hardware.gpu]\n')
    return Catalog([str(tmp_path / "cat")])


def test_a_preset_carries_one_fit_per_vllm_generation(tmp_path):
    cat = gpu_catalog(tmp_path)
    hw = cat.load_hardware("gpu")
    assert hw.calibration.vllm_version == "0.11" and hw.calibration.step_overhead == 1e-3
    assert [g.vllm_version for g in hw.generations] == ["0.22"]
    assert generations.versions(hw) == ["0.11", "0.22"]
    m = tmp_path / "m.toml"
    own = load_deployment(m, "gpu", catalog=cat, timing="calibrated")
    assert own.hardware.calibration.step_overhead == 1e-3
    assert load_deployment(m, "gpu", catalog=cat, timing="calibrated-v0.11").hardware == own.hardware
    newer = load_deployment(m, "gpu", catalog=cat, timing="calibrated-v0.22")
    assert newer.timing == "calibrated"
    assert (newer.hardware.calibration.vllm_version, newer.hardware.calibration.step_overhead) == ("0.22", 2e-3)


def test_a_generation_the_preset_lacks_is_refused_naming_those_it_has(tmp_path):
    cat = gpu_catalog(tmp_path)
    with pytest.raises(ConfigError, match=r"no calibration for vLLM 0.16 \(it has: calibrated-v0.11, "
                                          r"calibrated-v0.22\)"):
        load_deployment(tmp_path / "m.toml", "gpu", catalog=cat, timing="calibrated-v0.16")


def test_a_generation_table_must_be_named_by_a_release(tmp_path):
    cat = gpu_catalog(tmp_path, GPU.replace('"0.22"', '"newest"'))
    with pytest.raises(ConfigError, match="calibration.generations.newest"):
        cat.load_hardware("gpu")


def test_the_shipped_presets_name_the_vllm_generation_they_imitate():
    assert catalog.load_hardware("b200").calibration.vllm_version == "0.11"
    h200 = catalog.load_hardware("h200")
    assert h200.calibration.vllm_version == "0.11"
    newer = generations.calibration_for(h200, "0.22")
    assert newer is not None and "vllm022" in newer.fit
    assert generations.calibration_for(catalog.load_hardware("b200"), "0.22") is None


def attention_only(cal: Calibration) -> Deployment:
    """One full-attention layer of 8 KV heads x 128 (bf16: 4,096 B a position), no weights."""
    model = Model(name="attn", num_layers=1, hidden_size=1024, max_seq_len=65536,
                  weight_streams=(WeightStream("bf16", 1.0, 1.0),),
                  layer_classes=(LayerClass(1, 8, 128, 8),))
    hw = replace(catalog.load_hardware("b200"), calibration=cal)
    return Deployment(name="attn", model=model, hardware=hw, scheduler=SchedulerConfig(block_size=16),
                      timing="calibrated")


def test_the_kv_cache_is_read_at_its_own_fraction_of_the_peak():
    # 64 decodes at context 8,191 (m = 8,192): 64 x 8,192 x 4,096 B = 2.147e9 B of KV.
    # At bandwidth_efficiency 0.8 they take 2.147e9 / 6.4e12 = 335.5 us; read at
    # kv_bandwidth_efficiency 0.5 they take 2.147e9 / 4e12 = 536.9 us, 201.3 us more.
    plain = CostModel(attention_only(Calibration(bandwidth_efficiency=0.8)))
    slow = CostModel(attention_only(Calibration(bandwidth_efficiency=0.8, kv_bandwidth_efficiency=0.5)))
    load = attention_load(plain.caps, [], decode_sums(plain.caps, [8191] * 64), decodes=64)
    kv = 64 * 8192 * 4096
    a, b = plain.step_cost(64, load), slow.step_cost(64, load)
    assert b.seconds - a.seconds == pytest.approx(kv / 4e12 - kv / 6.4e12, rel=1e-6)
    assert b.read_bytes == a.read_bytes  # the bytes are the same; only their time differs


def test_a_vllm_generation_is_refused_on_another_engine_profile(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('model = "gpt-oss-120b"\n[scheduler]\nengine = "sglang"\n[hardware.h200]\n')
    with pytest.raises(ConfigError, match="calibrated-v0.22 is a fit of vLLM; the sglang engine profile"):
        load_deployment(path, "h200", timing="calibrated-v0.22")

"""The calibrated timing model: its formula by hand, where its parameters come from, and
that the roofline stays the default."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

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
    path.write_text('model = "llama-3.1-8b"\n[hardware.h100]\ntiming = "calibrated"\n[hardware.b200]\n')
    assert load_deployment(path, "h100").timing == "calibrated"
    assert load_deployment(path, "h100", timing="roofline").timing == "roofline"
    assert load_deployment(path, "b200").timing == "roofline"
    with pytest.raises(ConfigError, match="calibrated timing needs a \\[calibration\\] table in the b200"):
        load_deployment(path, "b200", timing="calibrated")
    with pytest.raises(ConfigError, match="--timing: expected 'roofline' or 'calibrated', got 'fast'"):
        load_deployment(path, "h100", timing="fast")


def test_the_fitted_presets_name_their_fit():
    for name in ("h100", "h200", "mi300x"):
        cal = catalog.load_hardware(name).calibration
        assert cal is not None and cal.fit.startswith("calibration/fit.py on ")
        assert 0 < cal.bandwidth_efficiency <= 1 and 0 < cal.flops_efficiency <= 1


def test_every_calibration_data_file_carries_its_provenance_and_a_held_out_part():
    spec = importlib.util.spec_from_file_location("fit", ROOT / "calibration" / "fit.py")
    fit = importlib.util.module_from_spec(spec)
    sys.modules["fit"] = fit  # dataclasses look their module up
    try:
        spec.loader.exec_module(fit)
    finally:
        del sys.modules["fit"]
    files = sorted((ROOT / "calibration" / "data").glob("*.toml"))
    assert files
    for path in files:
        source = tomllib.loads(path.read_text())["source"]
        assert {"title", "url", "engine", "date", "settings"} <= set(source), path
    rows = fit.load_rows(ROOT / "calibration" / "data")
    assert any(r.holdout for r in rows) and any(not r.holdout for r in rows)
    assert all(r.measured for r in rows)

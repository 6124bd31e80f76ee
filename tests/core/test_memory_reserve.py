"""The memory a calibrated engine keeps outside the weights and the KV pool
(`memory_reserve`): the pool loses exactly that much under calibrated timing and nothing
under the roofline, a reserve that leaves no pool is refused by name, and a calibrated
preset written by `calibrate` keeps it."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from inference_lab.calibrate.preset import calibration_table
from inference_lab.engine.sim import catalog, generations, kv
from inference_lab.engine.sim.catalog import Catalog
from inference_lab.engine.sim.config import ConfigError, load_deployment
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.specs import Calibration, Deployment, LayerClass, Model, SchedulerConfig, WeightStream

# 2 layers x 2 (K, V) x 8 KV heads x 128 x 2 bytes = 8,192 bytes a position; 64 a block
BLOCK = 8192 * 64


def tiny(reserve: float, timing: str = "calibrated") -> Deployment:
    model = Model(name="tiny", num_layers=2, hidden_size=4096, max_seq_len=8192,
                  weight_streams=(WeightStream("bf16", 1e9, 1e9),),
                  layer_classes=(LayerClass(2, 8, 128, 8),))
    hw = replace(catalog.load_hardware("b200"), calibration=Calibration(memory_reserve=reserve))
    return Deployment(name="tiny", model=model, hardware=hw, scheduler=SchedulerConfig(block_size=64),
                      timing=timing)


def test_the_calibrated_pool_is_the_arithmetic_less_the_reserve_and_the_roofline_keeps_it_all():
    ideal = 192e9 * 0.9 - 2e9  # HBM x gpu_memory_utilization - weights (1e9 params, bf16)
    assert kv.bytes_per_token(tiny(0)) * 64 == BLOCK
    assert kv.kv_capacity_bytes(tiny(0)) == pytest.approx(ideal)
    assert kv.kv_capacity_bytes(tiny(10e9)) == pytest.approx(ideal - 10e9)
    assert kv.kv_capacity_bytes(tiny(10e9, "roofline")) == pytest.approx(ideal)
    assert EngineCore(tiny(10e9)).total_blocks == int((ideal - 10e9) // BLOCK)
    assert EngineCore(tiny(10e9, "roofline")).total_blocks == int(ideal // BLOCK)


def test_a_reserve_leaving_k_blocks_gives_exactly_k_and_a_byte_more_gives_one_fewer():
    ideal = kv.kv_capacity_bytes(tiny(0))
    exact = ideal - 7 * BLOCK
    assert kv.total_blocks(tiny(exact)) == 7
    assert kv.total_blocks(tiny(exact + 1)) == 6
    assert kv.total_blocks(tiny(exact - 1)) == 7


def test_a_configured_kv_capacity_is_taken_as_given():
    dep = tiny(10e9)
    dep = replace(dep, scheduler=replace(dep.scheduler, kv_cache_capacity=100 * BLOCK))
    assert kv.total_blocks(dep) == 100


def test_the_b200_fit_keeps_its_reserve_out_of_the_minimax_pool(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('model = "minimax-m2.5-fp8"\n[hardware.b200]\ntp = 2\n'
                    '[hardware.b200.scheduler]\nkv_cache_dtype = "fp8"\n')
    roof = load_deployment(path, "b200", timing="roofline")
    cal = load_deployment(path, "b200", timing="calibrated")
    reserve = cal.hardware.calibration.memory_reserve
    assert reserve == 14e9
    block = kv.bytes_per_token(cal) * cal.scheduler.block_size
    assert kv.kv_capacity_bytes(roof) - kv.kv_capacity_bytes(cal) == pytest.approx(reserve)
    assert kv.total_blocks(roof) - kv.total_blocks(cal) in (int(reserve // block), int(reserve // block) + 1)


def test_a_reserve_that_leaves_no_pool_is_refused_naming_it(tmp_path):
    root = tmp_path / "cat"
    (root / "hardware").mkdir(parents=True)
    (root / "hardware" / "small.toml").write_text(
        'flops_bf16 = 1e15\nmemory_bandwidth = 1e12\nmemory_capacity = 24e9\n'
        '[calibration]\nmemory_reserve = 20e9\n')
    path = tmp_path / "m.toml"
    path.write_text('model = "llama-3.1-8b"\n[hardware.small]\n')
    cat = Catalog([root])
    assert load_deployment(path, "small", catalog=cat, timing="roofline") is not None
    with pytest.raises(ConfigError, match=r"calibrated memory reserve \(20.0 GB per GPU\) leave no KV cache"):
        load_deployment(path, "small", catalog=cat, timing="calibrated")


def test_a_negative_reserve_is_refused_by_name():
    table = {"flops_bf16": 1e15, "memory_bandwidth": 1e12, "memory_capacity": 1e11,
             "calibration": {"memory_reserve": -1.0}}
    with pytest.raises(ConfigError, match=r"memory_reserve: expected a number >= 0 \(bytes per GPU\), got -1"):
        catalog.parse_hardware(table, "hardware.x", name="x")


def test_a_preset_written_by_calibrate_keeps_the_reserve_it_started_from():
    text = calibration_table(Calibration(step_overhead=1e-3, memory_reserve=14e9, fit="f"), [])
    table = tomllib.loads(text)["calibration"]
    assert table["memory_reserve"] == 14e9 and table["step_overhead"] == 1e-3
    assert "memory_reserve" not in tomllib.loads(calibration_table(Calibration(fit="f"), []))["calibration"]


def test_the_h200_reserve_is_the_gap_to_the_pool_its_server_reported():
    data = Path(__file__).resolve().parents[2] / "inference_lab/calibrate/data"
    source = tomllib.loads((data / "inferencex-profiling-gpt-oss-120b-h200-vllm022.toml").read_text())
    reported = source["deployments"][0]["num_gpu_blocks"]
    h200 = generations.select(catalog.load_hardware("h200"), "0.22")
    model = catalog.load_model("gpt-oss-120b")
    dep = Deployment(name="g", model=model, hardware=h200,
                     scheduler=SchedulerConfig(block_size=16), timing="calibrated")
    assert dep.hardware.calibration.vllm_version == "0.22"
    # the lab's pool under the 0.22 fit is the server's, to the reserve's three digits
    # (5 MB: 9 blocks of 590 kB), where the arithmetic alone is 7,000 blocks over
    assert abs(kv.total_blocks(dep) - reported) <= 10
    assert kv.total_blocks(replace(dep, timing="roofline")) - reported > 7000


def calibrate_args(*flags: str):
    import argparse

    from inference_lab.cli import cmd_calibrate
    parser = argparse.ArgumentParser()
    cmd_calibrate.register(parser.add_subparsers())
    return parser.parse_args(["calibrate", "m.csv", "--name", "n", "-o", "out", *flags])


def test_calibrate_takes_the_servers_kv_cache_per_gpu_and_its_memory_fraction():
    from inference_lab.cli.cmd_calibrate import _deployment
    args = calibrate_args("--model", "llama-3.1-8b", "--hardware", "b200", "--tp", "2",
                          "--kv-cache-memory-bytes", "1000000000")
    dep = _deployment(args, catalog.BUNDLED)
    block = kv.bytes_per_token(dep) * dep.scheduler.block_size
    assert kv.kv_capacity_bytes(dep) == 1e9  # per GPU, whatever the timing
    assert kv.total_blocks(replace(dep, timing="calibrated")) == int(1e9 // block)
    half = _deployment(calibrate_args("--model", "llama-3.1-8b", "--hardware", "b200",
                                      "--gpu-memory-utilization", "0.5"), catalog.BUNDLED)
    assert half.scheduler.gpu_memory_utilization == 0.5
    assert kv.kv_capacity_bytes(half) == pytest.approx(192e9 * 0.5 - kv.weight_bytes(half))


def test_calibrate_refuses_a_start_whose_reserve_leaves_no_pool_naming_it(tmp_path):
    from inference_lab.cli import UsageError
    from inference_lab.cli.cmd_calibrate import _deployment
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "small.toml").write_text(
        'flops_bf16 = 1e15\nmemory_bandwidth = 1e12\nmemory_capacity = 24e9\n'
        '[calibration]\nmemory_reserve = 20e9\n')
    args = calibrate_args("--model", "llama-3.1-8b", "--hardware", "small")
    with pytest.raises(UsageError, match=r"memory_reserve \(20 GB per GPU\) leave no KV cache room on "
                                         r"1 x small: raise --tp, or give the server's --kv-cache-memory-bytes"):
        _deployment(args, Catalog([tmp_path]))
    given = calibrate_args("--model", "llama-3.1-8b", "--hardware", "small", "--kv-cache-memory-bytes", "2000000000")
    assert kv.total_blocks(replace(_deployment(given, Catalog([tmp_path])), timing="calibrated")) > 0

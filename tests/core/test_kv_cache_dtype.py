"""The deployment's KV-cache dtype (vLLM's --kv-cache-dtype): bytes per token, the pool's
capacity and the KV a step reads all follow it; `auto` keeps the model's own precision."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from factories import fixed_workload

from inference_lab.engine.sim import catalog, kv, layers
from inference_lab.engine.sim.config import ConfigError, load_deployment
from inference_lab.engine.sim.cost import CostModel, attention_load, decode_sums
from inference_lab.engine.sim.specs import Deployment, SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]


def gpt_oss_120b(kv_cache_dtype: str = "auto") -> Deployment:
    return Deployment(name="m", model=catalog.load_model("gpt-oss-120b"),
                      hardware=catalog.load_hardware("b200"),
                      scheduler=SchedulerConfig(block_size=16, kv_cache_dtype=kv_cache_dtype))


def test_fp8_halves_the_bytes_per_token_of_a_bf16_cache():
    # gpt-oss-120b pages its 18 full layers: 18 x 2 (K, V) x 8 heads x 64 dims x 2 B = 36,864 B;
    # at fp8 one byte per value: 18,432 B
    assert kv.bytes_per_token(gpt_oss_120b()) == 36_864
    assert kv.bytes_per_token(gpt_oss_120b("bf16")) == 36_864
    assert kv.bytes_per_token(gpt_oss_120b("fp8")) == 18_432
    assert kv.bytes_per_token(gpt_oss_120b("fp8_e4m3")) == 18_432


def test_fp8_doubles_the_blocks_that_fit():
    # capacity 192e9 x 0.9 - 61,584,998,400 B of weights = 111,215,001,600 B per GPU;
    # a block of 16: 589,824 B at bf16 -> 188,556 blocks; 294,912 B at fp8 -> 377,112
    assert kv.total_blocks(gpt_oss_120b()) == 111_215_001_600 // 589_824 == 188_556
    assert kv.total_blocks(gpt_oss_120b("fp8")) == 111_215_001_600 // 294_912 == 377_112


def test_fp8_halves_the_kv_a_decode_step_reads_and_nothing_else():
    # 64 decodes at 8,000 context: the full layers read 64 x 8,001 x 36,864 B (bf16) or
    # x 18,432 B (fp8); the windowed layers 64 x 128 positions x the same per-token bytes;
    # the weights and the FLOPs do not change. The roofline step is memory-bound, so the
    # difference of the two steps is the saved bytes over 8 TB/s.
    bf16, fp8 = CostModel(gpt_oss_120b()), CostModel(gpt_oss_120b("fp8"))
    load = attention_load(bf16.caps, [], decode_sums(bf16.caps, [8000] * 64), 1, 64)
    saved = 64 * (8001 + 128) * 18_432
    assert bf16.step_cost(64, load).seconds - fp8.step_cost(64, load).seconds == pytest.approx(
        saved / 8e12, rel=1e-9)


def test_auto_keeps_each_layers_own_precision_and_the_model_is_untouched():
    model = catalog.load_model("deepseek-r1")
    assert layers.with_kv_cache_dtype(model, "auto") is model
    fp8 = layers.with_kv_cache_dtype(model, "fp16")
    assert {c.kv_precision for c in fp8.layer_classes} == {"fp16"} and fp8.kv_precision == "fp16"
    assert model.kv_precision != "fp16"


CONFIG = 'model = "gpt-oss-120b"\n[scheduler]\nblock_size = 16\n{line}\n[hardware.b200]\n{entry}\n'


def test_the_scheduler_table_and_the_override_set_it(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(CONFIG.format(line='kv_cache_dtype = "fp8"', entry=""))
    assert load_deployment(path, "b200").scheduler.kv_cache_dtype == "fp8"
    assert load_deployment(path, "b200", kv_cache_dtype="auto").scheduler.kv_cache_dtype == "auto"
    path.write_text(CONFIG.format(line="", entry='scheduler = { kv_cache_dtype = "bf16" }'))
    assert load_deployment(path, "b200").scheduler.kv_cache_dtype == "bf16"


def test_a_bad_kv_cache_dtype_is_refused_naming_the_choices(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(CONFIG.format(line='kv_cache_dtype = "int4"', entry=""))
    with pytest.raises(ConfigError, match=r"scheduler\.kv_cache_dtype: expected one of 'auto', 'bf16'.*"
                                          r"got 'int4'"):
        load_deployment(path, "b200")
    path.write_text(CONFIG.format(line="", entry=""))
    with pytest.raises(ConfigError, match="--kv-cache-dtype: expected one of 'auto'.*got 'fp4'"):
        load_deployment(path, "b200", kv_cache_dtype="fp4")


def _sim(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    workload = fixed_workload(tmp_path / "w.toml", 16, 8192, 64, users=8)
    return subprocess.run([sys.executable, "-P", "-m", "inference_lab", "--log-level", "WARNING", "sim",
                           "--config", str(ROOT / "configs" / "gpt-oss-120b.toml"), "--hardware", "b200",
                           "--workload", str(workload), "-q", *extra],
                          capture_output=True, text=True, timeout=120)


def test_the_sim_flag_makes_decoding_long_contexts_faster_and_refuses_a_bad_value(tmp_path):
    import re

    def per_token(out: subprocess.CompletedProcess) -> float:
        assert out.returncode == 0, out.stderr
        return float(re.search(r"per token\s+│\s+([\d.]+)", out.stdout).group(1))

    assert per_token(_sim(tmp_path, "--kv-cache-dtype", "fp8")) < per_token(_sim(tmp_path))
    bad = _sim(tmp_path, "--kv-cache-dtype", "fp4")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--kv-cache-dtype: expected one of 'auto'" in bad.stderr

"""`inference-lab catalog` and `--catalog` / INFERENCE_LAB_CATALOG through the real command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from factories import fixed_workload

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "inference_lab", "--log-level", "WARNING", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_catalog_lists_models_with_parameters_kv_and_layer_kinds():
    out = cli("catalog")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip()}
    assert "671.03e9" in rows["deepseek-v3"] and "70,272" in rows["deepseek-v3"] and "61 mla" in rows["deepseek-v3"]
    assert "linear" in rows["qwen3.5-397b-a17b-fp8"]
    assert {"mi300x", "mi355x", "gb200"} <= set(rows)


def test_catalog_show_prints_one_preset_and_refuses_an_unknown_one():
    out = cli("catalog", "show", "deepseek-r1")
    assert out.returncode == 0 and "256 experts, 8 per token, 58 MoE layers" in out.stdout
    assert "KV per token on one GPU: 70,272 B" in out.stdout
    bad = cli("catalog", "show", "gpt-5")
    assert bad.returncode == 2 and "no preset 'gpt-5'" in bad.stderr and "Traceback" not in bad.stderr


def test_sim_takes_a_model_from_a_user_catalog_in_the_environment(tmp_path):
    (tmp_path / "cat" / "models").mkdir(parents=True)
    text = (Path(__file__).resolve().parents[2] / "engine/sim/presets/models/llama-3.1-8b.toml").read_text()
    (tmp_path / "cat" / "models" / "my-llama.toml").write_text(text.replace('"llama-3.1-8b"', '"my-llama"'))
    config = tmp_path / "my.toml"
    config.write_text('model = "my-llama"\n[memory]\ntiers = []\n[hardware.b200]\n')
    workload = fixed_workload(tmp_path / "w.toml", 4, 8, 4)
    args = ("sim", "--config", str(config), "--workload", str(workload), "-o", str(tmp_path / "o.json"))
    missing = cli(*args)
    assert missing.returncode == 2 and "unknown model preset 'my-llama'" in missing.stderr
    out = cli(*args, env={"INFERENCE_LAB_CATALOG": str(tmp_path / "cat")})
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "o.json").read_text())["requests"]["completed"] == 4
    assert "memory tiers (none): parsed, not modelled" in out.stderr
    summary = json.loads((tmp_path / "o.json").read_text())
    assert summary["unmodelled"] == ["memory tiers (none): parsed, not modelled"]


def test_catalog_show_states_the_memory_a_calibrated_pool_keeps_out():
    out = cli("catalog", "show", "h200")
    assert out.returncode == 0, out.stderr
    assert ("calibrated KV pool: 4.16 GB per GPU kept outside the weights and the pool "
            "(vLLM 0.11, 0.22;") in out.stdout
    h100 = cli("catalog", "show", "h100")
    assert h100.returncode == 0 and "calibrated KV pool" not in h100.stdout

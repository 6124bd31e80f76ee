"""User catalogs (--catalog DIR / INFERENCE_LAB_CATALOG): what they add, what wins, and
the refusal of a bad catalog file naming the file, the key and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference_lab.engine.sim.catalog import Catalog
from inference_lab.engine.sim.config import ConfigError, load_deployment

TINY = """\
name = "tiny"
hidden_dim = 1024
max_seq_len = 4096
[[weights]]
precision = "bf16"
active_params = {active}
resident_params = 1.2e9
[[layers]]
kind = "attention"
count = 16
heads = 16
head_dim = 64
kv_heads = 4
"""

FAST_B200 = """\
flops_bf16 = 9.0e15
memory_bandwidth = 1.6e13
memory_capacity = 192e9
[fabric]
scale_up = { bandwidth = 9.0e11, latency = 5e-6 }
"""


def catalog_dir(root: Path, models: dict[str, str] = {}, hardware: dict[str, str] = {}) -> Path:
    for kind, files in (("models", models), ("hardware", hardware)):
        (root / kind).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (root / kind / f"{name}.toml").write_text(text)
    return root


def test_a_user_catalog_adds_a_model_next_to_the_bundled_ones(tmp_path):
    cat = Catalog([catalog_dir(tmp_path / "a", models={"tiny": TINY.format(active=1.0e9)})])
    assert "tiny" in cat.model_names() and "gpt-oss-20b" in cat.model_names()
    assert cat.load_model("tiny").weight_streams[0].active_params == 1.0e9
    config = tmp_path / "tiny.toml"
    config.write_text('model = "tiny"\n[hardware.b200]\n')
    assert load_deployment(config, "b200", catalog=cat).model.name == "tiny"


def test_a_later_catalog_overrides_an_earlier_one_and_both_override_the_bundled(tmp_path):
    first = catalog_dir(tmp_path / "first", models={"tiny": TINY.format(active=1.0e9)},
                        hardware={"b200": FAST_B200})
    second = catalog_dir(tmp_path / "second", models={"tiny": TINY.format(active=0.5e9)})
    assert Catalog([first, second]).load_model("tiny").weight_streams[0].active_params == 0.5e9
    assert Catalog([second, first]).load_model("tiny").weight_streams[0].active_params == 1.0e9
    assert Catalog([first]).load_hardware("b200").hbm_bandwidth == 1.6e13
    assert Catalog().load_hardware("b200").hbm_bandwidth == 8.0e12


def test_an_unknown_preset_names_where_it_looked(tmp_path):
    cat = Catalog([catalog_dir(tmp_path / "mine")])
    with pytest.raises(ConfigError) as info:
        cat.load_model("gpt-5")
    assert f"looked in engine/sim/presets/models, {tmp_path / 'mine' / 'models'}" in str(info.value)


def test_a_bad_catalog_file_is_refused_with_its_file_key_and_expectation(tmp_path):
    cat = Catalog([catalog_dir(tmp_path / "bad", models={"tiny": TINY.format(active=1.0e9).replace(
        "kv_heads = 4", "kv_heads = 5")})])
    path = tmp_path / "bad" / "models" / "tiny.toml"
    with pytest.raises(ConfigError) as info:
        cat.load_model("tiny")
    assert str(info.value) == f"{path}: layers[0].kv_heads: expected an integer >= 1 dividing heads (16), got 5"
    config = tmp_path / "tiny.toml"
    config.write_text('model = "tiny"\n[hardware.b200]\n')
    with pytest.raises(ConfigError, match=f"^{path}: layers\\[0\\].kv_heads"):
        load_deployment(config, "b200", catalog=cat)


def test_a_catalog_that_is_not_a_directory_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="catalog directory: no such directory"):
        Catalog([tmp_path / "missing"])

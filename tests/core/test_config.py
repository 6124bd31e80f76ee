"""The catalog presets and deployment configs: what loads, the numbers the roofline needs,
and every refusal naming the file and the key path."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import pytest
from factories import inline_model

from inference_lab.engine.sim import catalog
from inference_lab.engine.sim.config import ConfigError, default_deployments, load_config_dir, load_deployment
from inference_lab.engine.sim.specs import BYTES_PER_VALUE

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHIPPED = sorted(
    (path.name, hw)
    for path in CONFIGS.glob("*.toml")
    for hw in tomllib.loads(path.read_text())["hardware"]
)

MINIMAL = """\
model = "gpt-oss-20b"
[scheduler]
max_num_seqs = 256
max_num_batched_tokens = 8192
block_size = 64
[hardware.b200]
tp = 1
"""


def write(tmp_path: Path, text: str, name: str = "m.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refusal(path: Path, hardware: str = "b200", **kw) -> str:
    with pytest.raises(ConfigError) as info:
        load_deployment(path, hardware, **kw)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---- presets -------------------------------------------------------------------------

def test_the_catalog_lists_the_required_presets():
    assert set(catalog.hardware_names()) >= {"b200", "b300", "h100", "h200", "gh200", "a100"}
    assert set(catalog.model_names()) >= {
        "gpt-oss-20b", "gpt-oss-120b", "llama-3.1-8b", "llama-3.1-70b",
        "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b"}


@pytest.mark.parametrize("name", catalog.hardware_names())
def test_every_hardware_preset_loads_with_bf16_hbm_and_a_fabric(name):
    hw = catalog.load_hardware(name)
    assert hw.name == name
    assert hw.flops["bf16"] > 0 and hw.hbm_bandwidth > 0 and hw.hbm_bytes > 0
    assert hw.link_bandwidth > 0 and hw.link_latency == 5e-6


@pytest.mark.parametrize("name", catalog.model_names())
def test_every_model_preset_loads_with_consistent_streams(name):
    model = catalog.load_model(name)
    assert model.name == name
    # every token-mixing layer is a block; blocks without one (Nemotron-NAS's attention-free
    # blocks, an FFN alone) count in num_layers only, as the catalog's loader allows
    mixing = sum(cls.count for cls in model.layer_classes)
    assert mixing == model.num_layers or (mixing < model.num_layers and name.startswith(
        "llama-3.3-nemotron")), (mixing, model.num_layers)
    for stream in model.weight_streams:
        assert 0 < stream.active_params <= stream.resident_params
        assert (stream.num_experts == 0) == (stream.top_k == 0)


def test_the_b200_preset_has_the_datasheet_numbers_of_anchors():
    hw = catalog.load_hardware("B200")  # lookups are case-insensitive
    assert hw.flops == {"fp4": 9.0e15, "fp8": 4.5e15, "bf16": 2.25e15, "fp16": 2.25e15}
    assert (hw.hbm_bandwidth, hw.hbm_bytes, hw.link_bandwidth) == (8.0e12, 192e9, 9.0e11)


def test_gpt_oss_20b_resident_weights_are_13_150_126_080_bytes():
    model = catalog.load_model("GPT-OSS-20B")
    fp4, bf16 = model.weight_streams
    # 19,110,297,600 * 0.5 + 1,797,488,640 * 2 = 9,555,148,800 + 3,594,977,280
    assert catalog.weight_bytes(model) == 13_150_126_080
    assert (fp4.precision, fp4.num_experts, fp4.top_k) == ("fp4", 32, 4)
    assert (bf16.active_params, bf16.resident_params) == (1_218_355_200, 1_797_488_640)


def test_gpt_oss_20b_on_a_b200_leaves_about_101_500_kv_blocks_of_64():
    model, hw = catalog.load_model("gpt-oss-20b"), catalog.load_hardware("b200")
    capacity = hw.hbm_bytes * 0.9 - catalog.weight_bytes(model)  # 172.8e9 - 13.15e9
    assert capacity == pytest.approx(159.65e9, rel=1e-4)
    # only the 12 full layers grow: 12 layers * 2 (K, V) * 8 heads * 64 dims * 2 B * 64 tokens
    full = [cls for cls in model.layer_classes if cls.window == 0]
    block_bytes = sum(c.count * 2 * c.kv_heads * c.head_dim for c in full) * BYTES_PER_VALUE[model.kv_precision] * 64
    assert block_bytes == 1_572_864
    assert capacity // block_bytes == pytest.approx(101_500, abs=50)
    assert [cls.window for cls in model.layer_classes] == [128, 0]


def test_gpt_oss_120b_streams_add_up_to_the_published_totals():
    model = catalog.load_model("gpt-oss-120b")
    active = sum(s.active_params for s in model.weight_streams)
    resident = sum(s.resident_params for s in model.weight_streams)
    assert active == pytest.approx(5.13e9, rel=2e-3)
    assert resident == pytest.approx(116.83e9, rel=1e-3)
    assert (model.num_layers, model.weight_streams[0].num_experts) == (36, 128)


def test_qwen3_30b_a3b_streams_add_up_to_the_published_totals():
    model = catalog.load_model("qwen3-30b-a3b")
    experts, rest = model.weight_streams
    assert (experts.num_experts, experts.top_k) == (128, 8)
    assert experts.resident_params + rest.resident_params == pytest.approx(30.53e9, rel=1e-3)
    embedding = 151_936 * 2048  # resident, not a matmul: the published 3.35e9 counts it
    assert experts.active_params + rest.active_params + embedding == pytest.approx(3.35e9, rel=1e-3)


def test_a_precision_the_hardware_lacks_is_priced_at_the_next_wider_one():
    assert catalog.compute_precision(catalog.load_hardware("b200"), "fp4") == "fp4"
    assert catalog.compute_precision(catalog.load_hardware("h100"), "fp4") == "fp8"
    assert catalog.compute_precision(catalog.load_hardware("a100"), "fp8") == "bf16"


def test_an_unknown_preset_name_is_refused_listing_the_known_ones():
    with pytest.raises(ConfigError, match="unknown model preset 'gpt-5'.*gpt-oss-20b"):
        catalog.load_model("gpt-5")


# ---- shipped configs -----------------------------------------------------------------

@pytest.mark.parametrize(("file", "hardware"), SHIPPED)
def test_every_shipped_config_loads_for_each_of_its_hardware_entries(file, hardware):
    dep = load_deployment(CONFIGS / file, hardware)
    assert dep is not None and dep.name == Path(file).stem
    assert dep.hardware.name == hardware and dep.tp >= 1


@pytest.mark.parametrize(("file", "hardware"), SHIPPED)
def test_every_shipped_deployment_has_kv_room_for_one_full_length_sequence(file, hardware):
    dep = load_deployment(CONFIGS / file, hardware)
    kv = dep.hardware.hbm_bytes * dep.tp * dep.scheduler.gpu_memory_utilization - catalog.weight_bytes(dep.model)
    per_token = sum(2 * c.count * c.kv_heads * c.head_dim for c in dep.model.layer_classes if c.window == 0)
    assert kv >= per_token * BYTES_PER_VALUE[dep.model.kv_precision] * dep.model.max_seq_len


def test_the_shipped_gpt_oss_20b_config_has_the_reference_scheduler():
    dep = load_deployment(CONFIGS / "gpt-oss-20b.toml", "b200")
    s = dep.scheduler
    assert (s.max_num_batched_tokens, s.max_num_seqs, s.policy) == (8192, 256, "fcfs")
    assert (s.enable_chunked_prefill, s.block_size, s.max_waiting) == (True, 64, 0)


def test_the_embedded_default_is_gpt_oss_20b_with_the_shipped_scheduler():
    (default,) = default_deployments()
    shipped = load_deployment(CONFIGS / "gpt-oss-20b.toml", "b200")
    assert default.name == "gpt-oss-20b" and default.hardware.name == "b200"
    assert default.model == shipped.model and default.scheduler == shipped.scheduler


def test_the_embedded_default_runs_on_every_preset_and_takes_the_max_waiting_override():
    for hw in catalog.hardware_names():
        (dep,) = default_deployments(hw, max_waiting=64)
        assert dep.hardware.name == hw and dep.scheduler.max_waiting == 64


def test_a_config_dir_loads_every_model_with_that_hardware_in_name_order():
    names = [dep.name for dep in load_config_dir(CONFIGS, "b200")]
    assert names == sorted(names) and "gpt-oss-20b" in names and "llama-3.1-70b" in names


# ---- deployment layout ---------------------------------------------------------------

def test_a_minimal_config_gets_the_defaults_and_its_file_stem_as_name(tmp_path):
    dep = load_deployment(write(tmp_path, MINIMAL, "my-model.toml"), "b200")
    assert dep.name == "my-model" and dep.tp == 1 and dep.source.endswith("my-model.toml")
    assert dep.scheduler.gpu_memory_utilization == 0.9 and dep.scheduler.max_waiting == 0
    assert (dep.time_correction.alpha, dep.time_correction.beta) == (1.0, 0.0)


def test_a_hardware_entry_overrides_the_scheduler_and_sets_time_correction(tmp_path):
    text = MINIMAL.replace("tp = 1", 'tp = 2\nscheduler = { max_num_seqs = 8 }\n'
                           "time_correction = { alpha = 1.1, beta = 0.0002 }")
    dep = load_deployment(write(tmp_path, 'name = "served"\n' + text), "b200")
    assert dep.name == "served" and dep.tp == 2
    assert (dep.scheduler.max_num_seqs, dep.scheduler.max_num_batched_tokens) == (8, 8192)
    assert (dep.time_correction.alpha, dep.time_correction.beta) == (1.1, 0.0002)


def test_an_inline_model_table_is_parsed_like_a_preset(tmp_path):
    inline = inline_model('precision = "bf16"\nactive_params = 1.0e9\nresident_params = 1.2e9\n',
                          'kv_precision = "fp8"\n', hardware="h100")
    dep = load_deployment(write(tmp_path, inline, "tiny.toml"), "h100")
    assert dep.model.name == "tiny" and dep.model.num_layers == 16
    assert dep.model.kv_precision == "fp8" and dep.model.weight_streams[0].resident_params == 1.2e9


def test_the_max_waiting_override_replaces_every_models_value(tmp_path):
    write(tmp_path, MINIMAL.replace("[scheduler]", "[scheduler]\nmax_waiting = 10"), "a.toml")
    write(tmp_path, 'model = "llama-3.1-8b"\n[hardware.b200]\n', "b.toml")
    assert [d.scheduler.max_waiting for d in load_config_dir(tmp_path, "b200")] == [10, 0]
    assert [d.scheduler.max_waiting for d in load_config_dir(tmp_path, "b200", max_waiting=3)] == [3, 3]
    with pytest.raises(ConfigError, match=r"--max-waiting: expected an integer >= 0 \(0 = unbounded\), got -1"):
        load_config_dir(tmp_path, "b200", max_waiting=-1)


def test_a_model_without_that_hardware_entry_is_skipped_with_one_log_line(tmp_path, caplog):
    path = write(tmp_path, MINIMAL)
    with caplog.at_level(logging.INFO, logger="inference_lab.engine.sim.config"):
        assert load_deployment(path, "h200") is None
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "[hardware.h200]" in caplog.text and "skipped" in caplog.text


def test_a_config_dir_reads_only_toml_files_directly_inside_it(tmp_path):
    write(tmp_path, MINIMAL, "a.toml")
    write(tmp_path, "not toml at all [", "notes.txt")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", MINIMAL, "b.toml")
    write(tmp_path, MINIMAL.replace("b200", "h100"), "c.toml")
    assert [d.name for d in load_config_dir(tmp_path, "b200")] == ["a"]
    assert [d.name for d in load_config_dir(tmp_path / "sub" / "b.toml", "b200")] == ["b"]


def test_a_config_dir_without_that_hardware_anywhere_is_refused(tmp_path):
    write(tmp_path, MINIMAL)
    with pytest.raises(ConfigError, match=r"no model has a \[hardware.a100\] entry"):
        load_config_dir(tmp_path, "a100")


def test_a_missing_config_dir_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no such file or directory"):
        load_config_dir(tmp_path / "nope", "b200")


def test_two_configs_serving_the_same_name_are_refused(tmp_path):
    write(tmp_path, MINIMAL, "a.toml")
    write(tmp_path, 'name = "a"\n' + MINIMAL, "b.toml")
    with pytest.raises(ConfigError, match=r"b\.toml: name: served model name 'a' is already used"):
        load_config_dir(tmp_path, "b200")


# ---- refusals --------------------------------------------------------------------------

def test_an_unknown_top_level_key_is_refused_with_its_path(tmp_path):
    path = write(tmp_path, "modle = 1\n" + MINIMAL)
    assert refusal(path).startswith(f"{path}: modle: unknown key (known keys: name, model")


@pytest.mark.parametrize(("text", "key"), [
    (MINIMAL.replace("block_size", "block_sise"), "scheduler.block_sise"),
    (MINIMAL.replace("tp = 1", "tp = 1\nfoo = 2"), "hardware.b200.foo"),
    (MINIMAL.replace("tp = 1", "scheduler = { max_seqs = 2 }"), "hardware.b200.scheduler.max_seqs"),
    (MINIMAL.replace("tp = 1", "time_correction = { gamma = 2 }"), "hardware.b200.time_correction.gamma"),
])
def test_an_unknown_nested_key_is_refused_with_its_path(tmp_path, text, key):
    path = write(tmp_path, text)
    assert refusal(path).startswith(f"{path}: {key}: unknown key")


def test_an_unknown_key_in_an_inline_model_is_refused_with_its_path(tmp_path):
    path = write(tmp_path, '[model]\nhiden_dim = 3\n[hardware.b200]\n')
    assert refusal(path).startswith(f"{path}: model.hiden_dim: unknown key")


@pytest.mark.parametrize(("line", "message"), [
    ("max_num_seqs = true", "scheduler.max_num_seqs: expected an integer >= 1, got True"),
    ("max_num_seqs = 2.5", "scheduler.max_num_seqs: expected an integer >= 1, got 2.5"),
    ("max_num_seqs = 0", "scheduler.max_num_seqs: expected an integer >= 1, got 0"),
    ("enable_chunked_prefill = 1", "scheduler.enable_chunked_prefill: expected true or false, got 1"),
    ("policy = 'lifo'", "scheduler.policy: expected one of fcfs, priority, sif, lif, sof, lof, "
                         "stf, ltf, sjf, got 'lifo'"),
    ("gpu_memory_utilization = 1.5", "scheduler.gpu_memory_utilization: expected a number in (0, 1], got 1.5"),
    ("gpu_memory_utilization = 0", "scheduler.gpu_memory_utilization: expected a number in (0, 1], got 0"),
    ("max_waiting = -1", "scheduler.max_waiting: expected an integer >= 0 (0 = unbounded), got -1"),
    ("max_model_len = 200000", "scheduler.max_model_len: expected at most the model's max_seq_len (131072), got 200000"),
])
def test_a_bad_scheduler_value_is_refused_with_file_key_and_expectation(tmp_path, line, message):
    path = write(tmp_path, MINIMAL.replace("[scheduler]", f"[scheduler]\n{line}").replace(
        "max_num_seqs = 256\n", "" if line.startswith("max_num_seqs") else "max_num_seqs = 256\n"))
    assert refusal(path) == f"{path}: {message}"


@pytest.mark.parametrize("block_size", ["0", "-64", "16.0", '"64"'])
def test_a_block_size_that_is_not_a_positive_int_is_refused(tmp_path, block_size):
    path = write(tmp_path, MINIMAL.replace("block_size = 64", f"block_size = {block_size}"))
    assert refusal(path).startswith(f"{path}: scheduler.block_size: expected a positive integer, got ")


def test_a_token_budget_below_max_num_seqs_is_refused_where_it_was_set(tmp_path):
    path = write(tmp_path, MINIMAL.replace("tp = 1", "scheduler = { max_num_batched_tokens = 100 }"))
    assert refusal(path) == (f"{path}: hardware.b200.scheduler.max_num_batched_tokens: "
                             "expected an integer >= max_num_seqs (256), got 100")


@pytest.mark.parametrize(("tp", "got"), [("0", "0"), ("true", "True"), ('"2"', "'2'")])
def test_a_tp_that_is_not_an_int_of_at_least_one_is_refused(tmp_path, tp, got):
    path = write(tmp_path, MINIMAL.replace("tp = 1", f"tp = {tp}"))
    assert refusal(path) == f"{path}: hardware.b200.tp: expected an integer >= 1, got {got}"


def test_an_unknown_hardware_entry_is_refused_listing_the_presets(tmp_path):
    path = write(tmp_path, MINIMAL + "[hardware.tpu9]\ntp = 1\n")
    assert refusal(path) == (f"{path}: hardware.tpu9: unknown hardware preset 'tpu9'; "
                             f"known presets: {', '.join(catalog.hardware_names())} (or give `spec`)")


def test_an_unknown_hardware_argument_is_refused_listing_the_presets(tmp_path):
    path = write(tmp_path, MINIMAL)
    assert refusal(path, hardware="tpu9") == (
        f"unknown hardware 'tpu9'; known presets: {', '.join(catalog.hardware_names())}")
    with pytest.raises(ConfigError, match="unknown hardware 'tpu9'"):
        default_deployments("tpu9")


def test_a_missing_model_is_refused(tmp_path):
    path = write(tmp_path, MINIMAL.replace('model = "gpt-oss-20b"\n', ""))
    assert refusal(path).startswith(f"{path}: model: missing; expected a catalog model name (")


def test_an_unknown_model_is_refused_listing_the_presets(tmp_path):
    path = write(tmp_path, MINIMAL.replace("gpt-oss-20b", "gpt-5"))
    assert refusal(path).startswith(f"{path}: model: unknown model preset 'gpt-5'; known presets: ")


def test_bad_toml_is_refused_with_the_file(tmp_path):
    path = write(tmp_path, MINIMAL + "[scheduler\n")
    assert refusal(path).startswith(f"{path}: invalid TOML: ")


def test_weights_that_do_not_fit_are_refused_at_the_tp_key(tmp_path):
    path = write(tmp_path, 'model = "llama-3.1-70b"\n[hardware.h100]\ntp = 1\n')
    assert refusal(path, "h100").startswith(f"{path}: hardware.h100.tp: llama-3.1-70b weights (141.1 GB) "
                                            "do not fit in 1 x h100")


def test_a_bad_entry_for_other_hardware_is_refused_too(tmp_path):
    path = write(tmp_path, MINIMAL + "[hardware.h100]\ntp = 0\n")
    assert refusal(path).startswith(f"{path}: hardware.h100.tp: expected an integer >= 1")

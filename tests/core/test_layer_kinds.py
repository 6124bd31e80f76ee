"""The layer kinds of the catalog (attention, mla, linear), priced by hand from the
formulas in docs/timing.md, and the zoo: every bundled preset loads and its parameters
add up to the published total stated in its comment (within 2 %)."""

from __future__ import annotations

import re
from dataclasses import replace
from importlib import resources

import pytest

from inference_lab.engine.sim import catalog, layers
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.cost import CostModel, attention_load
from inference_lab.engine.sim.kv import fixed_blocks, total_blocks
from inference_lab.engine.sim.specs import Deployment, LayerClass, Model, SchedulerConfig, WeightStream
from factories import deployment

B200 = catalog.load_hardware("b200")


def tiny(*layer_classes: LayerClass, active: float = 1e9) -> Model:
    """A dense bf16 model of 1e9 parameters with the given layers."""
    return Model(name="tiny", num_layers=sum(c.count for c in layer_classes), hidden_size=4096,
                 max_seq_len=131072, weight_streams=(WeightStream("bf16", active, active),),
                 layer_classes=layer_classes)


def on_b200(model: Model, tp: int = 1) -> Deployment:
    return Deployment(name=model.name, model=model, hardware=B200, tp=tp,
                      scheduler=SchedulerConfig(block_size=64))


MLA = LayerClass(10, heads=128, kind="mla", latent_dim=512, rope_dim=64, qk_head_dim=192,
                 v_head_dim=128, kv_precision="bf16")


def test_kv_heads_are_never_split_so_tp_16_holds_one_of_8_per_gpu():
    model = catalog.load_model("llama-3.1-70b")
    # 80 layers x K,V x heads per GPU x 128 x 2 B
    assert layers.paged_bytes_per_token(model, 1) == 80 * 2 * 8 * 128 * 2  # 327,680
    assert layers.paged_bytes_per_token(model, 4) == 80 * 2 * 2 * 128 * 2  # 81,920
    assert layers.paged_bytes_per_token(model, 16) == 80 * 2 * 1 * 128 * 2  # 40,960, not 20,480
    # A block holds the same positions on every GPU: the pool per GPU decides the count.
    # b200 tp 16: 192e9 * 0.9 - 141.1e9 / 16 = 163.98e9 B per GPU / (40,960 * 64) B per block
    dep = replace(deployment("llama-3.1-70b", tp=16), scheduler=SchedulerConfig(block_size=64))
    assert total_blocks(dep) == int((192e9 * 0.9 - 141_107_412_992 / 16) // (40_960 * 64))


def test_kv_shared_layers_hold_half_the_cache():
    shared = LayerClass(4, 8, 128, 2, kv_shared=True)
    assert layers.attention_kv_bytes(shared) == 2 * 128 * 2  # K = V: one tensor
    assert layers.attention_kv_bytes(replace(shared, kv_shared=False)) == 2 * 2 * 128 * 2


def test_an_mla_cache_is_the_latent_and_rope_replicated_on_every_gpu():
    # (512 + 64) values x 2 B x 10 layers = 11,520 B per token, at tp 1 and at tp 8
    model = tiny(MLA)
    assert layers.paged_bytes_per_token(model, 1) == 11_520
    assert layers.paged_bytes_per_token(model, 8) == 11_520
    deepseek = catalog.load_model("deepseek-v3")
    assert layers.paged_bytes_per_token(deepseek, 8) == 61 * 576 * 2  # 70,272


def test_mla_decode_is_absorbed_and_prefill_up_projects_the_latents():
    dec, pre, up = layers.mla_flops(MLA, 4096)
    assert dec == 2 * 128 * (2 * 512 + 64)  # 278,528 per (new, attended) pair
    assert pre == 2 * 128 * (192 + 128)  # 81,920
    assert up == 2 * 512 * 128 * (128 + 128)  # 33,554,432 per attended position
    absorbed = replace(MLA, qk_head_dim=576, v_head_dim=512)
    assert layers.mla_flops(absorbed, 4096) == (dec, dec, 0.0)
    assert layers.mla_flops(replace(MLA, heads=0), 4096) == (4 * 4096, 4 * 4096, 0.0)


def test_an_mla_decode_step_by_hand():
    # One decode at 999 computed positions (m = 1000), 10 layers, b200 tp 1, bf16 stream:
    #   FLOPs = 2 * 1e9 + 10 * 278,528 * 1000 = 4.785e9 -> 2.127 us at 2.25e15
    #   bytes = 1e9 * 2 + 10 * 1152 * 1000 = 2.01152e9 -> 251.44 us at 8e12: memory-bound
    cost = CostModel(on_b200(tiny(MLA)))
    load = attention_load(cost.caps, [], (1000.0,), decodes=1)
    assert cost.step_cost(1, load).seconds == pytest.approx(2.01152e9 / 8e12, rel=1e-12)
    # A 1000-token prefill from scratch: m = 500 per position, n * m = 500,000 pairs:
    #   FLOPs = 2e9 * 1000 + 10 * (81,920 * 500,000 + 33,554,432 * 500) = 2.5775e12
    #   -> 1.1456 ms; bytes 2e9 + 10 * 1152 * 500 -> 0.25072 ms: compute-bound
    prefill = attention_load(cost.caps, [(1000, 0)])
    flops = 2e9 * 1000 + 10 * (81_920 * 500_000 + 33_554_432 * 500)
    assert cost.step_cost(1000, prefill).seconds == pytest.approx(flops / 2.25e15, rel=1e-12)


def test_an_mla_history_attends_a_strided_top_k_and_pays_its_indexer():
    from inference_lab.engine.sim.specs import History
    layer = replace(MLA, count=1, qk_head_dim=576, v_head_dim=512, window=128,
                    history=History(4, 1024, 64, 128, "fp8", "fp8"))
    terms = {(t.cap, t.scale): t for t in layers.terms(tiny(layer), 1)}
    assert set(terms) == {(128, 1.0), (4096, 0.25), (0, 0.25)}  # window, top-1024 of /4, indexer
    assert terms[(0, 0.25)].decode_flops == 2 * 64 * 128 and terms[(0, 0.25)].precision == "fp8"
    # paged: (576 * 2 B + 128 indexer keys * 1 B) / 4 per position; the window is not paged
    assert layers.paged_bytes_per_token(tiny(layer), 1) == (1152 + 128) / 4


def test_a_linear_layer_holds_a_fixed_state_read_and_written_each_step():
    attn = LayerClass(2, 8, 128, 8)  # 2 x 2 x 8 x 128 x 2 B = 8,192 B per token
    lin = LayerClass(6, kind="linear", state_bytes=1_000_000)
    model = tiny(attn, lin)
    dep = on_b200(model)
    # 6 MB of state per sequence = ceil(6e6 / (8,192 * 64)) = 12 blocks of 64 positions
    assert fixed_blocks(dep) == 12
    assert layers.fixed_bytes_per_sequence(model, 2) == 3_000_000  # split over tp
    # 4 decodes at 10 positions: bytes = 2e9 + 2 * 6e6 * 4 + 8,192 * 11 * 4
    cost = CostModel(dep)
    load = attention_load(cost.caps, [], (44.0,), decodes=4)
    assert cost.step_cost(4, load).seconds == pytest.approx(
        (2e9 + 2 * 6e6 * 4 + 8_192 * 44) / 8e12, rel=1e-12)
    # the state does not grow with context: only the attention part does
    longer = attention_load(cost.caps, [], (4 * 1001.0,), decodes=4)
    assert cost.step_cost(4, longer).seconds - cost.step_cost(4, load).seconds == pytest.approx(
        8_192 * 4 * 990 / 8e12, rel=1e-9)


def test_a_running_sequence_holds_its_state_blocks_until_it_ends():
    attn = LayerClass(2, 8, 128, 8)
    lin = LayerClass(6, kind="linear", state_bytes=1_000_000)
    engine = EngineCore(on_b200(tiny(attn, lin)))
    free = engine.scheduler.free_blocks
    req = engine.submit(100, 10, 0.0)
    engine.step(0.0)
    assert free - engine.scheduler.free_blocks == 2 + 12  # ceil(101 / 64) + the state
    while not req.finished:
        engine.step(0.0)
    assert engine.scheduler.free_blocks == free


# ---- the zoo ---------------------------------------------------------------------------

def _published(name: str) -> float | None:
    text = (resources.files("inference_lab.engine.sim") / "presets" / "models" / f"{name}.toml").read_text()
    found = re.search(r"^# published total: ([0-9.e+]+)", text, re.M)
    return float(found.group(1)) if found else None


ZOO = catalog.model_names()


def test_the_zoo_has_every_model_of_inference_labs_catalog_and_deepseek():
    assert {"deepseek-v3", "deepseek-r1", "kimi-k2.5", "deepseek-v4-pro", "qwen3.5-397b-a17b-fp8",
            "nemotron-3-super-120b", "gemma-4-31b-it", "glm-5.1-fp8", "llama-3-70b"} <= set(ZOO)
    assert len(ZOO) >= 41
    assert {"b200", "b300", "gb200", "h100", "h200", "gh200", "a100", "mi300x", "mi355x"} <= set(
        catalog.hardware_names())


@pytest.mark.parametrize("name", [n for n in ZOO if _published(n) is not None])
def test_a_presets_parameters_add_up_to_the_published_total_within_2_percent(name):
    model = catalog.load_model(name)
    total = sum(s.resident_params for s in model.weight_streams)
    assert total == pytest.approx(_published(name), rel=0.02)


def test_most_presets_state_a_published_total():
    assert sum(_published(n) is not None for n in ZOO) >= 28


def test_deepseek_v3_is_mla_with_256_routed_experts_3_dense_layers_and_fp8():
    model = catalog.load_model("deepseek-v3")
    experts = model.weight_streams[0]
    assert (experts.num_experts, experts.top_k, experts.moe_layers, experts.precision) == (256, 8, 58, "fp8")
    # one expert across the 58 layers; the shared part left over is exactly one more expert
    per = (experts.resident_params - experts.active_params) / (256 - 8)
    assert per == 3 * 7168 * 2048 * 58
    assert experts.active_params - 8 * per == per
    assert model.num_layers - experts.moe_layers == 3
    assert [c.kind for c in model.layer_classes] == ["mla"]

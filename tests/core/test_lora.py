"""LoRA adapters in the core: at most max_loras distinct adapters in a batch (others
wait, later requests may pass them), a modelled load when an adapter is not resident,
and adapter work in the step cost, scaled by rank."""

from __future__ import annotations

import pytest
from factories import core, run_until_idle

from inference_lab.engine.sim.lora import LOAD_BANDWIDTH, LoraError


def test_at_most_max_loras_adapters_run_and_later_requests_pass_a_blocked_one():
    engine = core()
    loras = engine.enable_lora(max_loras=1)
    a, b = loras.load("a", "/adapters/a", 8), loras.load("b", "/adapters/b", 8)
    first = engine.submit(100, 50, 0.0, lora=a)
    blocked = engine.submit(100, 50, 0.0, lora=b)
    same = engine.submit(100, 50, 0.0, lora=a)
    plain = engine.submit(100, 50, 0.0)
    result = engine.step(0.0)
    assert set(result.admitted) == {first, same, plain}  # b's request waits for the slot
    run_until_idle(engine, result.end)
    assert blocked.first_scheduled >= max(first.finish_time, same.finish_time)
    assert engine.scheduler.lora_running == {}


def test_a_non_resident_adapter_costs_its_load_and_a_resident_one_does_not():
    engine = core()
    loras = engine.enable_lora(max_loras=2)
    a = loras.load("a", "/adapters/a", 16)
    plain = engine.submit(200, 1, 0.0)
    end, _ = run_until_idle(engine)
    base_ttft = plain.first_token - plain.arrival
    cold = engine.submit(200, 1, end, lora=a)
    end, _ = run_until_idle(engine, end)
    warm = engine.submit(200, 1, end, lora=a)
    run_until_idle(engine, end)
    load = loras.bytes_per_rank * 16 / LOAD_BANDWIDTH
    work = loras.step_seconds({a: 200})
    assert cold.first_token - cold.arrival == pytest.approx(base_ttft + work + load, rel=1e-9)
    assert warm.first_token - warm.arrival == pytest.approx(base_ttft + work, rel=1e-9)


def test_adapter_work_scales_with_rank():
    engine = core()
    loras = engine.enable_lora(max_loras=2)
    small, big = loras.load("small", "/s", 8), loras.load("big", "/b", 64)
    # Prefill of 4,096 tokens: compute-bound, linear in rank.
    assert loras.step_seconds({big: 4096}) == pytest.approx(8 * loras.step_seconds({small: 4096}))


def test_the_registry_refuses_duplicates_unknown_names_and_more_than_its_limit():
    loras = core().enable_lora(max_loras=1, max_adapters=2)
    loras.load("a", "/a")
    with pytest.raises(LoraError, match="already been loaded"):
        loras.load("a", "/a")
    loras.load("b", "/b")
    with pytest.raises(LoraError, match="the most it may hold \\(2\\)"):
        loras.load("c", "/c")
    with pytest.raises(LoraError, match="cannot be found"):
        loras.unload("zzz")
    assert loras.unload("a").name == "a" and list(loras.adapters) == ["b"]


def test_prompts_through_different_adapters_do_not_share_cached_blocks():
    engine = core()
    loras = engine.enable_lora(max_loras=2)
    a, b = loras.load("a", "/a"), loras.load("b", "/b")
    prompt = bytes(range(256)) * 16  # 1,024 tokens
    engine.submit(0, 1, 0.0, token_ids=prompt, lora=a)
    end, _ = run_until_idle(engine)
    other = engine.submit(0, 1, end, token_ids=prompt, lora=b)
    end, _ = run_until_idle(engine, end)
    again = engine.submit(0, 1, end, token_ids=prompt, lora=a)
    run_until_idle(engine, end)
    assert other.cached_tokens == 0 and again.cached_tokens == 960

"""Workloads with structure (shared system prompts, multi-turn conversations) on the
offline driver: the prefix cache hits what the workload shares, and a multi-turn
conversation's modelled TTFT is exactly what the cost model predicts for the uncached
part of each prompt."""

from __future__ import annotations

import pytest
from factories import deployment

from inference_lab.common.conversations import Conversations
from inference_lab.common.workload import LengthDist, WorkloadSpec
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.cost import attention_load

BS = 64


def spec(**kw) -> WorkloadSpec:
    base = dict(arrival_pattern="closed_loop", num_concurrent_users=1, num_requests=8,
                input_len_dist=LengthDist("fixed", value=300),
                output_len_dist=LengthDist("fixed", value=100), seed=1)
    base.update(kw)
    return WorkloadSpec(**base)


def test_a_conversation_resends_its_history_and_shares_its_system_prompt():
    convs = Conversations(shared_prefix_len=128, num_shared_prefixes=1, num_turns=3, seed=0)
    first = convs.next_prompt("u", 10, 5)
    second = convs.next_prompt("u", 10, 5)
    third = convs.next_prompt("u", 10, 5)
    fourth = convs.next_prompt("u", 10, 5)  # a new conversation, same system prompt
    assert [len(p) // 4 for p in (first, second, third, fourth)] == [138, 153, 168, 138]
    assert second.startswith(first) and third.startswith(second)
    assert fourth[:4 * 128] == first[:4 * 128] and fourth != first


def test_multi_turn_ttft_drops_exactly_as_the_cost_model_predicts():
    """One user, 4 turns per conversation, 2 conversations, each request alone in the
    engine: turn k's prompt is 2000 (system) + k * 400 - 100 tokens and its cached part
    is every full block of turn k - 1's prompt (the system prompt alone for turn 1)."""
    workload = spec(num_requests=8, shared_prefix_len=2000, num_turns=4)
    off = run_offline(deployment(enable_prefix_caching=False), workload)
    on = run_offline(deployment(), workload)
    cost = EngineCore(deployment()).cost

    def prefill(new: int, cached: int) -> float:
        return cost.step_cost(new, attention_load(cost.caps, [(new, cached)])).seconds

    prompts = [2000 + 300 + 400 * k for k in range(4)] * 2  # 2300, 2700, 3100, 3500
    cached = []
    for i, p in enumerate(prompts):
        shared = 2000 if i % 4 == 0 else prompts[i - 1]  # what the previous request left
        if i == 0:
            shared = 0  # nothing cached yet
        cached.append(min(shared // BS, (p - 1) // BS) * BS)
    assert cached[:5] == [0, 2240, 2688, 3072, 1984]
    expected_on = [prefill(p - c, c) for p, c in zip(prompts, cached)]
    expected_off = [prefill(p, 0) for p in prompts]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert on["latency_metrics"]["ttft_ms"]["mean"] == pytest.approx(mean(expected_on) * 1e3, rel=1e-12)
    assert off["latency_metrics"]["ttft_ms"]["mean"] == pytest.approx(mean(expected_off) * 1e3, rel=1e-12)
    assert on["prefix_cache"]["hits"] == sum(cached)
    assert on["prefix_cache"]["queries"] == sum(prompts)
    assert off["prefix_cache"] == {"enabled": False}


def test_a_shared_system_prompt_is_served_from_the_cache_under_load():
    workload = spec(num_concurrent_users=32, num_requests=400, shared_prefix_len=2000,
                    input_len_dist=LengthDist("uniform", min=50, max=500))
    on = run_offline(deployment(), workload)
    off = run_offline(deployment(enable_prefix_caching=False), workload)
    assert on["requests"]["completed"] == off["requests"]["completed"] == 400
    # All but the first wave of requests find the 31 full blocks of the system prompt.
    assert on["prefix_cache"]["hit_rate"] > 0.7
    assert on["latency_metrics"]["ttft_ms"]["mean"] < 0.8 * off["latency_metrics"]["ttft_ms"]["mean"]


def test_a_workload_sends_a_fraction_of_requests_through_each_adapter():
    workload = spec(num_concurrent_users=16, num_requests=300,
                    lora_adapters=(("sql", 0.3), ("chat", 0.3)), max_loras=1)
    one = run_offline(deployment(), workload)
    two = run_offline(deployment(), spec(num_concurrent_users=16, num_requests=300,
                                         lora_adapters=(("sql", 0.3), ("chat", 0.3)), max_loras=2))
    plain = run_offline(deployment(), spec(num_concurrent_users=16, num_requests=300))
    assert one["requests"]["completed"] == two["requests"]["completed"] == 300
    # One adapter slot serialises the two adapters' requests: slower than two slots,
    # and both slower than no adapters at all (load and adapter work).
    e2e = lambda out: out["latency_metrics"]["e2e_ms"]["mean"]  # noqa: E731
    assert e2e(one) > e2e(two) > e2e(plain)


@pytest.mark.parametrize("adapters", [{"sql": 0}, {"sql": 0.7, "chat": 0.5}, {"sql": "x"}, 3])
def test_bad_adapter_fractions_are_refused_with_the_key(adapters):
    from inference_lab.common.workload import ConfigError, parse_workload

    doc = {"workload": {"arrival_pattern": "closed_loop", "num_concurrent_users": 1,
                        "num_requests": 1, "input_len_dist": {"type": "fixed", "value": 1},
                        "output_len_dist": {"type": "fixed", "value": 1},
                        "lora_adapters": adapters}}
    with pytest.raises(ConfigError, match="lora_adapters"):
        parse_workload(doc, "w.toml")


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "x" * 129, "é"])
def test_adapter_names_must_be_plain_file_names(name):
    from inference_lab.common.workload import ConfigError, parse_workload

    doc = {"workload": {"arrival_pattern": "closed_loop", "num_concurrent_users": 1,
                        "num_requests": 1, "input_len_dist": {"type": "fixed", "value": 1},
                        "output_len_dist": {"type": "fixed", "value": 1},
                        "lora_adapters": {name: 0.5, "sql-v2.1_ok": 0.1}}}
    with pytest.raises(ConfigError, match="lora_adapters"):
        parse_workload(doc, "w.toml")

"""Engine profiles (engine.sim.profiles): SGLang's admission reserve, its separate prefill
and decode passes, its token-granular prefix hits, its queue bound and refusal text; the
vllm profile leaves a deployment as it was."""

import struct

import pytest

from inference_lab.engine.sim.core import EngineCore, QueueSaturated
from inference_lab.engine.sim.profiles import ProfileError, apply
from inference_lab.engine.sim.profiles.sglang import SglangScheduler
from factories import deployment, run_until_idle


def sglang_core(max_queued=None, **scheduler) -> EngineCore:
    return EngineCore(apply(deployment(**scheduler), "sglang", max_queued))


def tokens(ids) -> bytes:
    return struct.pack(f"<{len(ids)}I", *ids)


def test_the_vllm_profile_returns_the_deployment_unchanged():
    dep = deployment()
    assert apply(dep, "vllm") is dep
    assert type(EngineCore(dep).scheduler).__name__ == "Scheduler"


def test_an_unknown_engine_is_refused_naming_the_flag():
    with pytest.raises(ProfileError, match="--engine: expected one of vllm, sglang"):
        apply(deployment(), "trtllm")


def test_sglang_takes_page_size_1_its_chunk_default_by_memory_and_no_queue_bound():
    b200 = apply(deployment(hardware="b200", max_waiting=64), "sglang")
    h200 = apply(deployment(hardware="h200"), "sglang")
    assert b200.scheduler.block_size == 1 and b200.scheduler.engine == "sglang"
    assert b200.scheduler.max_num_batched_tokens == 16384  # 180 GB: 160 GiB or more
    assert h200.scheduler.max_num_batched_tokens == 8192  # 141 GB: below 160 GiB
    assert b200.scheduler.max_waiting == 0  # unbounded unless --max-queued-requests
    assert apply(deployment(), "sglang", 5).scheduler.max_waiting == 5


def test_a_step_is_a_prefill_pass_or_a_decode_pass_never_both():
    engine = sglang_core()
    assert isinstance(engine.scheduler, SglangScheduler)
    first = engine.submit(100, 10, 0.0)
    step = engine.step(0.0)
    assert step.prefill_tokens == 100 and step.num_decodes == 0
    engine.submit(50, 10, step.end)
    step = engine.step(step.end)  # the newcomer prefills; the first request waits
    assert step.prefill_tokens == 50 and step.num_decodes == 0
    assert engine.tokens_of(first) == 1
    step = engine.step(step.end)
    assert step.prefill_tokens == 0 and step.num_decodes == 2


def test_admission_reserves_the_running_requests_clipped_output_times_the_ratio():
    # 20,000 tokens of KV; one request running with 9,999 outputs to go: clipped at 4096,
    # x 0.7 = 2,867.2 reserved. A newcomer of 10,000 prompt + 4,096 (clipped) output needs
    # 14,096 < 20,000 - 100 (the runner's KV) - 2,867.2 = 17,032.8: admitted; one of
    # 13,000 + 4,096 = 17,096 is not, though its prompt alone fits the free KV.
    for prompt, admitted in ((10_000, True), (13_000, False)):
        engine = sglang_core(kv_cache_capacity=None)
        sched = engine.scheduler
        sched.free_blocks = sched.total_blocks = 20_000
        engine.submit(100, 10_000, 0.0)
        step = engine.step(0.0)
        engine.submit(prompt, 5_000, step.end)
        assert sched.new_token_ratio == pytest.approx(0.7)
        step = engine.step(step.end)
        assert bool(step.admitted) is admitted


def test_the_new_token_ratio_decays_over_600_decode_passes_to_its_floor():
    engine = sglang_core()
    engine.submit(10, 2000, 0.0)
    now = 0.0
    for _ in range(700):
        now = engine.step(now).end
    assert engine.scheduler.new_token_ratio == pytest.approx(0.7 * 0.14)
    run_until_idle(engine, now)
    engine.step(now)  # idle: the estimate starts over
    assert engine.scheduler.new_token_ratio == pytest.approx(0.7)


def test_a_prefix_hit_is_any_token_count_not_whole_blocks():
    shared = list(range(1, 38))  # 37 tokens: two blocks and 5 tokens at block size 16
    for engine, expected in ((sglang_core(), 37), (EngineCore(deployment(block_size=16)), 32)):
        first = engine.submit(0, 2, 0.0, token_ids=tokens(shared + [900, 901]))
        now, _ = run_until_idle(engine)
        second = engine.submit(0, 2, now, token_ids=tokens(shared + [700, 701, 702]))
        run_until_idle(engine, now)
        assert first.cached_tokens == 0
        assert second.cached_tokens == expected


def test_a_full_queue_is_refused_with_sglangs_text():
    engine = sglang_core(max_queued=1)
    engine.submit(10, 10, 0.0)
    with pytest.raises(QueueSaturated, match=r"^The request queue is full\.$"):
        engine.submit(10, 10, 0.0)


def test_without_a_bound_sglang_queues_every_arrival():
    engine = sglang_core(max_num_seqs=4)
    reqs = [engine.submit(100, 20, 0.0) for _ in range(300)]
    run_until_idle(engine)
    assert all(r.num_output == 20 for r in reqs)
    assert engine.scheduler.free_blocks == engine.total_blocks

"""The scheduler and EngineCore: admission, chunked prefill, preemption, draining,
cancellation and the aggregate decode group, all without a clock."""

import random

import pytest
from hypothesis import given, settings, strategies as st

from inference_lab.engine.sim.core import CapacityError, QueueSaturated, SubmitError
from inference_lab.engine.sim.kv import blocks_for
from inference_lab.engine.sim.request import Status
from factories import core, run_until_idle


def test_every_request_gets_exactly_its_tokens_and_blocks_all_return():
    engine = core()
    reqs = [engine.submit(16 + i, 50 + i, 0.0) for i in range(40)]
    run_until_idle(engine)
    assert all(r.status is Status.FINISHED_LENGTH for r in reqs)
    assert [r.num_output for r in reqs] == [50 + i for i in range(40)]
    assert engine.scheduler.free_blocks == engine.total_blocks
    assert engine.num_running == 0 and engine.num_waiting == 0


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget():
    engine = core()
    req = engine.submit(10_000, 2, 0.0)
    first = engine.step(0.0)
    assert first.num_tokens == 8192 and req.num_computed == 8192 and not first.first_token
    second = engine.step(first.end)
    assert second.first_token == [req]  # 1808 remaining positions, then the first token
    assert req.num_computed == 10_000


def test_without_chunked_prefill_a_prompt_beyond_the_budget_is_refused_at_submit():
    engine = core(enable_chunked_prefill=False)
    with pytest.raises(SubmitError, match="chunked prefill is off"):
        engine.submit(9000, 10, 0.0)


def test_a_prompt_that_can_never_fit_is_refused_at_submit_with_a_reason():
    engine = core(max_model_len=4096)
    with pytest.raises(SubmitError, match="exceeds max_model_len 4096"):
        engine.submit(4000, 200, 0.0)
    small_kv = core(kv_cache_capacity=64 * 24576 * 10)  # ten blocks of 64 positions
    with pytest.raises(SubmitError, match="KV blocks"):
        small_kv.submit(600, 100, 0.0)


def test_max_waiting_refuses_with_the_reference_message_and_counts_only_the_queue():
    engine = core(max_waiting=2)
    engine.submit(16, 10, 0.0)
    engine.submit(16, 10, 0.0)
    with pytest.raises(QueueSaturated) as refused:
        engine.submit(16, 10, 0.0)
    assert str(refused.value) == (
        "Server is at capacity: 2 requests waiting (max_waiting = 2). "
        "Retry with reduced concurrency.")
    engine.step(0.0)  # both admitted: the queue is empty again
    engine.submit(16, 10, 0.0)
    assert engine.num_waiting == 1


def test_under_kv_pressure_the_last_admitted_request_is_preempted_to_the_queue_front():
    # 8 blocks of 64 positions; three requests of 16 + 200 tokens need 4 blocks each
    # at the end, so the third admitted one must give its KV back.
    engine = core(kv_cache_capacity=8 * 64 * 24576)
    a, b, c = (engine.submit(16, 200, 0.0) for _ in range(3))
    now = 0.0
    preempted = []
    while engine.has_work():
        result = engine.step(now)
        now = result.end
        preempted += result.preempted
        if preempted and preempted[0] is c and c.status is Status.WAITING:
            # The victim lost its KV but kept its tokens, and waits at the front.
            assert c.num_computed == 0 and c.num_output > 0 and c.blocks == 0
            assert engine.scheduler.waiting.peek() is c
    assert preempted and preempted[0] is c
    assert [r.num_output for r in (a, b, c)] == [200, 200, 200]
    assert c.preemptions >= 1 and engine.scheduler.num_preemptions >= 1
    assert engine.scheduler.free_blocks == engine.total_blocks


def test_lowering_max_num_seqs_drains_the_batch_and_never_evicts():
    engine = core()
    reqs = [engine.submit(16, 100 + 4 * i, 0.0) for i in range(32)]
    result = engine.step(0.0)
    assert engine.num_running == 32
    engine.set_capacity(max_num_seqs=8)
    waiting_req = engine.submit(16, 10, result.end)
    now = result.end
    running_seen = []
    while engine.has_work():
        result = engine.step(now)
        now = result.end
        assert not result.preempted
        running_seen.append(engine.num_running)
        if engine.num_running > 8:  # still draining: nothing new is admitted
            assert waiting_req.status is Status.WAITING
    # Nobody is evicted: all 32 run until the first finishes (99 more decode steps),
    # then the batch shrinks as requests finish, and refills only below the new cap.
    assert running_seen[:98] == [32] * 98
    assert all(b <= a or b <= 8 for a, b in zip(running_seen, running_seen[1:]))
    assert min(running_seen[:-1]) <= 8
    assert all(r.num_output == r.max_tokens for r in reqs)
    assert waiting_req.num_output == 10


def test_capacity_settings_are_validated():
    engine = core()
    with pytest.raises(CapacityError, match="max_num_seqs must be an integer >= 1, got 0"):
        engine.set_capacity(max_num_seqs=0)
    with pytest.raises(CapacityError, match="max_waiting must be an integer >= 0"):
        engine.set_capacity(max_waiting=-1)
    with pytest.raises(CapacityError, match="max_num_batched_tokens"):
        engine.set_capacity(max_num_seqs=10_000)
    configured = engine.deployment.scheduler
    engine.set_capacity(max_num_seqs=16, max_waiting=0)
    assert engine.max_num_seqs == 16 and engine.max_waiting == 0
    assert engine.deployment.scheduler is configured and configured.max_num_seqs == 256


def test_priority_policy_admits_the_lowest_priority_value_first():
    engine = core(policy="priority", max_num_seqs=1)
    late = engine.submit(16, 5, 0.0, priority=5)
    urgent = engine.submit(16, 5, 0.0, priority=-1)
    engine.step(0.0)
    assert urgent.status is Status.RUNNING and late.status is Status.WAITING


def test_cancelling_frees_the_queue_slot_or_the_kv_blocks():
    engine = core()
    running = engine.submit(500, 100, 0.0)
    engine.step(0.0)
    queued = engine.submit(16, 10, 0.0)
    assert engine.scheduler.free_blocks < engine.total_blocks
    assert engine.cancel(running, 1.0) and engine.cancel(queued, 1.0)
    assert running.status is Status.FINISHED_CANCELLED
    assert engine.scheduler.free_blocks == engine.total_blocks
    assert engine.num_waiting == 0 and engine.num_running == 0 and not engine.has_work()
    assert not engine.cancel(running, 2.0)  # already final


def test_an_idle_engine_starts_the_next_step_at_the_arrival_not_in_the_past():
    engine = core()
    engine.submit(16, 3, 0.0)
    end, _ = run_until_idle(engine)
    engine.submit(16, 3, end + 5.0)
    assert engine.next_event_time() == end + 5.0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(12, 200),
       policy=st.sampled_from(["fcfs", "priority"]))
def test_the_decode_group_matches_per_request_bookkeeping(seed, blocks, policy):
    """Random arrivals, cancels and capacity changes under KV pressure: the group's
    aggregates equal sums over its members, blocks are conserved, and every request
    that is not cancelled finishes with exactly max_tokens tokens."""
    rng = random.Random(seed)
    engine = core(kv_cache_capacity=blocks * 64 * 24576, max_num_seqs=rng.randint(2, 40),
                  max_num_batched_tokens=512, policy=policy)
    group = engine.scheduler.group
    live, now = [], 0.0
    for _ in range(400):
        action = rng.random()
        if action < 0.3:
            try:
                live.append(engine.submit(rng.randint(1, 300), rng.randint(1, 120), now,
                                          priority=rng.randint(0, 3)))
            except SubmitError:
                pass
        elif action < 0.35 and live:
            engine.cancel(rng.choice(live), now)
        elif action < 0.38:
            engine.set_capacity(max_num_seqs=rng.randint(1, 40))
        if engine.has_work():
            members = [r for r in engine.scheduler.running.values() if r.in_group]
            full, wins = group.attention()
            assert full == sum(group.live_computed(r) + 1 for r in members)
            assert wins == (sum(min(group.live_computed(r) + 1, 128) for r in members),)
            assert group.blocks_needed() == sum(
                1 for r in members if group.live_computed(r) % 64 == 0)
            held = sum(blocks_for(group.live_computed(r), 64) if r.in_group else r.blocks
                       for r in engine.scheduler.running.values())
            assert held + engine.scheduler.free_blocks == engine.total_blocks
            now = engine.step(now).end
    run_until_idle(engine, now)
    for r in live:
        if r.status is Status.FINISHED_LENGTH:
            assert r.num_output == r.max_tokens
        else:
            assert r.status is Status.FINISHED_CANCELLED
    assert engine.scheduler.free_blocks == engine.total_blocks


def test_a_step_that_began_before_an_arrival_does_not_admit_it():
    # A driver catching up books steps at the previous step's end, which may be earlier
    # than requests it has already queued: those wait for a step that starts after them.
    engine = core()
    engine.submit(16, 50, 0.0)
    first = engine.step(0.0)
    late = engine.submit(16, 5, first.end + 0.010)  # arrives 10 ms after the next start
    second = engine.step(first.end)
    assert late not in second.admitted and late.status is Status.WAITING
    now = second.end
    while late.status is Status.WAITING:
        now = engine.step(now).end
    assert late.first_scheduled >= late.arrival


def test_an_engine_that_runs_dry_while_catching_up_starts_at_the_next_arrival():
    engine = core()
    engine.submit(16, 2, 0.0)
    first = engine.step(0.0)  # prefill and the first token
    queued = engine.submit(16, 3, first.end + 5.0)  # the engine is busy: its clock stays
    second = engine.step(first.end)  # the last token; the queued one has not arrived
    assert queued not in second.admitted
    third = engine.step(second.end)
    assert third.start == queued.arrival and queued in third.admitted


def test_the_core_answers_tokens_at_a_step_and_steps_to_the_next_finish():
    # Two 16-token prompts, 3 and 5 tokens: step 1 prefills both (first token each),
    # then each step adds one token; the first finishes at step 3, the second at step 5.
    engine = core()
    short, long_ = engine.submit(16, 3, 0.0), engine.submit(16, 5, 0.0)
    assert engine.steps_to_next_finish() is None  # nobody decodes yet
    engine.step(0.0)
    before, after = engine.progress_marks()
    assert [engine.tokens_at(r, before) for r in (short, long_)] == [0, 0]
    assert [engine.tokens_at(r, after) for r in (short, long_)] == [1, 1]
    assert engine.is_decoding(short) and engine.steps_to_next_finish() == 2
    engine.step(0.0)
    finished = engine.step(0.0).finished
    assert finished == [short] and not engine.is_decoding(short)
    before, after = engine.progress_marks()
    assert (engine.tokens_at(short, before), engine.tokens_at(short, after)) == (2, 3)
    assert (engine.tokens_at(long_, before), engine.tokens_at(long_, after)) == (2, 3)
    assert engine.steps_to_next_finish() == 2
    engine.cancel(long_, 0.0)  # its finish-heap entry is now stale: no finish ahead
    assert engine.steps_to_next_finish() is None and engine.tokens_of(long_) == 3

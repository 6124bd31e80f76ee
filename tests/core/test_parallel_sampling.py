"""Parallel sampling (n > 1) in the core, as vLLM does it: one prefill, then n sequences
decoding, each in a running place of its own, sharing the prompt's full KV blocks; the
request counts once while it waits."""

import random

import pytest
from hypothesis import given, settings, strategies as st

from inference_lab.engine.sim.core import SubmitError
from inference_lab.engine.sim.request import Status
from factories import core, run_until_idle

BLOCK_BYTES = 64 * 24576  # one block of 64 positions of gpt-oss-20b


def test_a_request_of_three_sequences_waits_as_one_and_prefills_once():
    engine = core()
    req = engine.submit(100, 5, 0.0, n=3)
    assert engine.num_waiting == 1 and engine.num_running == 0
    step = engine.step(0.0)
    # One prefill of the 100 prompt positions; then three first tokens from it.
    assert step.prefill_tokens == 100 and step.num_tokens == 100
    assert step.sampled == 3 and len(step.first_token) == 3
    assert [s.index for s in step.spawned] == [1, 2]
    assert engine.num_waiting == 0 and engine.num_running == 3
    members = req.members
    assert [m.index for m in members] == [0, 1, 2] and all(m.family is req.family for m in members)
    _, results = run_until_idle(engine, step.end)
    assert all(m.status is Status.FINISHED_LENGTH and m.num_output == 5 for m in members)
    # All three decode in lockstep: they finish in the same step.
    assert len({m.finish_time for m in members}) == 1
    assert sum(r.sampled for r in [step, *results]) == 15
    assert engine.scheduler.free_blocks == engine.total_blocks


def test_the_prompts_full_blocks_are_held_once_for_the_family():
    engine = core()
    engine.submit(100, 5, 0.0, n=3)
    engine.step(0.0)
    used = engine.total_blocks - engine.scheduler.free_blocks
    # 100 positions: one full block (shared) + the partly filled second one (a copy each).
    assert used == 1 + 3 * 1
    alone = core()
    for _ in range(3):
        alone.submit(100, 5, 0.0)
    alone.step(0.0)
    assert alone.total_blocks - alone.scheduler.free_blocks == 3 * 2


def test_a_family_is_admitted_only_when_n_running_places_are_free():
    engine = core(max_num_seqs=4)
    single = engine.submit(16, 100, 0.0)
    family = engine.submit(16, 3, 0.0, n=4)
    small = engine.submit(16, 3, 0.0)  # behind the family in FCFS order: waits too
    run_until_idle(engine)
    # 1 + 4 > 4 places: the family starts in the step after the single request ended.
    assert family.first_scheduled >= single.finish_time
    assert small.first_scheduled >= family.first_scheduled
    assert family.all_finished and engine.scheduler.free_blocks == engine.total_blocks


def test_while_its_prompt_is_prefilled_the_siblings_places_count_as_running():
    engine = core(max_num_seqs=8)
    req = engine.submit(10_000, 3, 0.0, n=3)
    engine.step(0.0)  # 8192 of 10,000 positions: prefill not complete
    assert not req.family and engine.num_running == 3


def test_n_beyond_max_num_seqs_or_the_kv_cache_is_refused_at_submit():
    with pytest.raises(SubmitError, match=r"n \(5\) exceeds max_num_seqs 4"):
        core(max_num_seqs=4).submit(16, 2, 0.0, n=5)
    small = core(kv_cache_capacity=10 * BLOCK_BYTES)  # ten blocks
    assert small.total_blocks == 10
    # 64 + 256 = 320 positions: 5 blocks for one sequence, of which the prompt's one full
    # block is shared: 5 + 4 = 9 blocks for two sequences, 13 for three.
    small.submit(64, 256, 0.0, n=2)
    with pytest.raises(SubmitError, match="3 sequences of 320 tokens need 13 KV blocks"):
        small.submit(64, 256, 0.0, n=3)


def test_cancelling_every_member_frees_every_block():
    engine = core()
    req = engine.submit(200, 50, 0.0, n=4)
    now = 0.0
    for _ in range(5):
        now = engine.step(now).end
    assert len(req.members) == 4
    for member in req.members:
        assert engine.cancel(member, now)
    assert engine.num_running == 0 and engine.scheduler.free_blocks == engine.total_blocks


def test_cancelling_a_family_still_prefilling_releases_what_it_held_for_its_siblings():
    engine = core()
    req = engine.submit(10_000, 5, 0.0, n=4)
    engine.step(0.0)
    assert engine.num_running == 4
    engine.cancel(req, 0.1)
    assert engine.num_running == 0 and engine.scheduler.free_blocks == engine.total_blocks


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_under_kv_pressure_every_sequence_gets_its_tokens_and_every_block_returns(seed):
    """Families and single requests on a tiny cache: preemption (of parents, siblings and
    families still prefilling) never loses a token or a block."""
    rng = random.Random(seed)
    engine = core(kv_cache_capacity=24 * BLOCK_BYTES, max_num_seqs=8)
    reqs = [engine.submit(rng.randint(1, 300), rng.randint(1, 200), 0.0, n=rng.choice([1, 1, 2, 3, 4]))
            for _ in range(12)]
    _, results = run_until_idle(engine, max_steps=200_000)
    members = [m for r in reqs for m in r.members]
    assert len(members) == sum(r.n for r in reqs)
    assert all(m.status is Status.FINISHED_LENGTH and m.num_output == m.max_tokens for m in members)
    assert sum(r.sampled for r in results) == sum(m.max_tokens for m in members)
    assert engine.scheduler.free_blocks == engine.total_blocks
    assert engine.num_running == 0 and engine.scheduler.reserved_places == 0


def test_with_token_ids_the_siblings_share_the_prompt_through_the_prefix_cache():
    engine = core()
    prompt = random.Random(1).randbytes(4 * 200)  # 200 token IDs: 3 full blocks of 64
    req = engine.submit(0, 5, 0.0, token_ids=prompt, n=3)
    engine.step(0.0)
    assert [m.cached_refs for m in req.members] == [3, 3, 3]  # each references the 3
    used = engine.total_blocks - engine.scheduler.free_blocks
    assert used == 3 + 3 * 1  # the full blocks once, a copy of the last partial each
    run_until_idle(engine, 0.0)
    assert all(m.num_output == 5 for m in req.members)
    assert engine.scheduler.free_blocks == engine.total_blocks  # (cached blocks are free)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_with_the_prefix_cache_under_kv_pressure_no_token_or_block_is_lost(seed):
    rng = random.Random(seed)
    engine = core(kv_cache_capacity=24 * BLOCK_BYTES, max_num_seqs=8)
    prefixes = [rng.randbytes(4 * 128) for _ in range(2)]
    reqs = [engine.submit(0, rng.randint(1, 150), 0.0, n=rng.choice([1, 2, 3]),
                          token_ids=rng.choice(prefixes) + rng.randbytes(4 * rng.randint(1, 150)))
            for _ in range(10)]
    _, results = run_until_idle(engine, max_steps=200_000)
    members = [m for r in reqs for m in r.members]
    assert all(m.status is Status.FINISHED_LENGTH and m.num_output == m.max_tokens for m in members)
    assert engine.scheduler.free_blocks == engine.total_blocks
    assert engine.num_running == 0 and engine.scheduler.reserved_places == 0

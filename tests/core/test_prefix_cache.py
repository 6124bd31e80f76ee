"""Automatic prefix caching: content-hashed blocks, reuse of the longest cached prefix,
LRU eviction of freed blocks, and the block pool's accounting."""

from __future__ import annotations

import hashlib
import random
from array import array

from factories import core, run_until_idle

from inference_lab.engine.sim.cost import attention_load
from inference_lab.engine.sim.prefix_cache import CLEARED, REMOVED, STORED, PrefixCache, block_hashes

BS = 64


def ids(n: int, seed: int = 0) -> bytes:
    """n random token IDs, packed as the engine's API takes them."""
    return random.Random(seed).randbytes(4 * n)


def prefill_seconds(engine, new: int, cached: int) -> float:
    """The cost model's time for one step prefilling `new` positions after `cached`."""
    return engine.cost.step_cost(new, attention_load(engine.cost.caps, [(new, cached)])).seconds


# ---- hashing -------------------------------------------------------------------------------


def test_hashes_cover_full_blocks_only_and_chain_to_the_parent():
    a = ids(3 * BS + 10)
    assert len(block_hashes(a, BS)) == 3  # the 10-token tail is not a full block
    b = a[:2 * 4 * BS] + ids(BS, seed=9)  # same first two blocks, a different third
    ha, hb = block_hashes(a, BS), block_hashes(b, BS)
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    # Equal block contents under different parents hash differently (chained).
    c = ids(BS, seed=5) + a[4 * BS:2 * 4 * BS]
    assert block_hashes(c, BS)[1] != ha[1]
    assert block_hashes(a, BS, extra=b"lora") != ha


def test_hashes_are_the_documented_sha256_chain_so_stable_across_processes():
    tokens = array("I", range(2 * BS)).tobytes()
    first = hashlib.sha256(tokens[:4 * BS]).digest()[:8]
    second = hashlib.sha256(first + tokens[4 * BS:]).digest()[:8]
    assert block_hashes(tokens, BS) == [int.from_bytes(first, "big"), int.from_bytes(second, "big")]


# ---- reuse ---------------------------------------------------------------------------------


def test_a_repeated_prompt_reuses_every_full_block_but_the_last_position():
    engine = core()
    prompt = ids(2000)
    first = engine.submit(0, 8, 0.0, token_ids=prompt)
    end, _ = run_until_idle(engine)
    assert first.cached_tokens == 0 and first.prompt_len == 2000
    second = engine.submit(0, 8, end + 1.0, token_ids=prompt)
    run_until_idle(engine, end + 1.0)
    # 2000 tokens = 31 full blocks + 16; all 31 are cached (at least one position is
    # always computed, and 1999 // 64 = 31).
    assert second.cached_tokens == 31 * BS == 1984
    # TTFT is one step prefilling the 16 uncached positions after 1984 cached ones.
    assert second.first_token == second.arrival + prefill_seconds(engine, 16, 1984)
    assert first.first_token == first.arrival + prefill_seconds(engine, 2000, 0)
    stats = engine.prefix_cache.stats
    assert (stats.queries, stats.hits) == (4000, 1984)


def test_a_prompt_that_is_exactly_whole_blocks_recomputes_its_last_block():
    engine = core()
    prompt = ids(4 * BS)
    engine.submit(0, 4, 0.0, token_ids=prompt)
    end, _ = run_until_idle(engine)
    again = engine.submit(0, 4, end, token_ids=prompt)
    run_until_idle(engine, end)
    assert again.cached_tokens == 3 * BS  # (256 - 1) // 64 = 3 blocks


def test_only_the_shared_prefix_hits_when_prompts_diverge():
    engine = core()
    system = ids(10 * BS + 7, seed=1)  # 10 full blocks, then the prompts differ
    engine.submit(0, 4, 0.0, token_ids=system + ids(500, seed=2))
    end, _ = run_until_idle(engine)
    other = engine.submit(0, 4, end, token_ids=system + ids(500, seed=3))
    run_until_idle(engine, end)
    assert other.cached_tokens == 10 * BS


def test_prefix_caching_off_never_hits_and_requests_without_ids_never_hit():
    engine = core(enable_prefix_caching=False)
    assert engine.prefix_cache is None
    prompt = ids(1000)
    engine.submit(0, 4, 0.0, token_ids=prompt)
    end, _ = run_until_idle(engine)
    again = engine.submit(0, 4, end, token_ids=prompt)
    run_until_idle(engine, end)
    assert again.cached_tokens == 0
    on = core()
    on.submit(1000, 4, 0.0)
    end, _ = run_until_idle(on)
    assert on.submit(1000, 4, end).block_hashes is None


def test_concurrent_identical_prompts_share_blocks_and_the_pool_balances():
    engine = core()
    prompt = ids(30 * BS)
    reqs = [engine.submit(0, 20, 0.0, token_ids=prompt) for _ in range(8)]
    run_until_idle(engine)
    assert all(r.finished for r in reqs)
    sched = engine.scheduler
    assert sched.free_blocks == engine.total_blocks  # every block is free again
    cache = engine.prefix_cache
    assert len(cache) == 30 and cache.num_evictable == 30  # kept once, all unreferenced
    assert all(count == 0 for count in cache.refs.values())


def test_a_request_scheduled_in_the_same_step_hits_the_blocks_another_is_computing():
    """vLLM v1 caches a step's full blocks when it allocates their slots, before the step
    runs: a request scheduled after another in the same step (or while the other is still
    prefilling in chunks) reuses them. Requests with different prompts never do."""
    engine = core()
    shared = ids(24 * BS)  # 1,536 tokens: one step's prefill each
    a = engine.submit(0, 8, 0.0, token_ids=shared + ids(40, seed=1))
    b = engine.submit(0, 8, 0.0, token_ids=shared + ids(40, seed=2))
    other = engine.submit(0, 8, 0.0, token_ids=ids(24 * BS + 40, seed=3))
    engine.step(0.0)  # all three admitted in this one step
    assert a.first_scheduled == b.first_scheduled == other.first_scheduled
    assert (a.cached_tokens, b.cached_tokens, other.cached_tokens) == (0, 24 * BS, 0)
    stats = engine.prefix_cache.stats
    assert (stats.queries, stats.hits) == (3 * (24 * BS + 40), 24 * BS)
    run_until_idle(engine)
    assert engine.scheduler.free_blocks == engine.total_blocks


def test_a_request_arriving_mid_chunked_prefill_hits_only_the_blocks_scheduled_so_far():
    engine = core(max_num_batched_tokens=512)  # a 2,048-token prompt takes four steps
    prompt = ids(32 * BS)
    first = engine.submit(0, 4, 0.0, token_ids=prompt)
    now = engine.step(0.0).end  # blocks 0-7 scheduled
    now = engine.step(now).end  # blocks 8-15 scheduled
    assert first.num_computed == 16 * BS and first.first_token < 0
    second = engine.submit(0, 4, now, token_ids=prompt)
    run_until_idle(engine, now)
    # what the first request had scheduled when the second was admitted, never more
    assert 16 * BS <= second.cached_tokens < 32 * BS
    assert second.cached_tokens % BS == 0


def test_freed_blocks_are_evicted_least_recently_freed_first():
    # 40 blocks of KV in all: a 30-block prompt, then another, evicts 20 of the first.
    engine = core()
    engine.scheduler.total_blocks = engine.scheduler.free_blocks = engine.total_blocks = 40
    a, b = ids(30 * BS + 1, seed=1), ids(30 * BS + 1, seed=2)
    engine.submit(0, 1, 0.0, token_ids=a)
    end, _ = run_until_idle(engine)
    engine.submit(0, 1, end, token_ids=b)
    end, _ = run_until_idle(engine, end)
    cache = engine.prefix_cache
    # b needed 31 blocks: 10 never-cached ones, then 21 of a's 30 cached ones, tail first.
    ha = block_hashes(a, BS)
    assert [h in cache.refs for h in ha] == [True] * 9 + [False] * 21
    again = engine.submit(0, 1, end, token_ids=a)
    run_until_idle(engine, end)
    assert again.cached_tokens == 9 * BS
    assert engine.scheduler.free_blocks == 40


def test_preemption_releases_cached_blocks_and_readmission_hits_them():
    engine = core(max_num_seqs=4)
    engine.scheduler.total_blocks = engine.scheduler.free_blocks = engine.total_blocks = 24
    # Two requests of 10 blocks each growing by 200 tokens: KV pressure preempts one.
    reqs = [engine.submit(0, 200, 0.0, token_ids=ids(10 * BS, seed=s)) for s in (1, 2)]
    _, results = run_until_idle(engine)
    assert sum(len(r.preempted) for r in results) >= 1
    assert all(r.finished and r.num_output == 200 for r in reqs)
    assert engine.prefix_cache.stats.hits > 0  # the victim found its prompt blocks again
    assert engine.scheduler.free_blocks == 24


# ---- events --------------------------------------------------------------------------------


def replay(events: list[tuple]) -> set[int]:
    held: set[int] = set()
    for event in events:
        if event[0] == STORED:
            held.update(event[1])
        elif event[0] == REMOVED:
            held.difference_update(event[1])
        elif event[0] == CLEARED:
            held.clear()
    return held


def test_recorded_events_rebuild_the_resident_block_set_exactly():
    engine = core(max_num_seqs=16)
    engine = type(engine)(engine.deployment, record_kv_events=True)
    engine.scheduler.total_blocks = engine.scheduler.free_blocks = engine.total_blocks = 120
    rng = random.Random(7)
    system = ids(5 * BS, seed=100)
    now, events = 0.0, []
    for i in range(60):
        prompt = (system if i % 2 else b"") + ids(rng.randint(50, 900), seed=i)
        engine.submit(0, rng.randint(1, 40), now, token_ids=prompt)
        if i % 4 == 3:
            now, _ = run_until_idle(engine, now)
            events += engine.prefix_cache.take_events()
    now, _ = run_until_idle(engine, now)
    events += engine.prefix_cache.take_events()
    assert any(e[0] == REMOVED for e in events)  # eviction happened
    assert replay(events) == set(engine.prefix_cache.refs)
    stored = [e for e in events if e[0] == STORED]
    # Each BlockStored carries its blocks' tokens and the hash of its first block's parent.
    for _, hashes, parent, tokens, _lora in stored:
        assert len(tokens) == 4 * BS * len(hashes)
        assert block_hashes(tokens, BS)[0] == hashes[0] or parent is not None


def test_clear_forgets_unreferenced_blocks_as_all_blocks_cleared():
    cache = PrefixCache(BS, record_events=True)
    hashes = block_hashes(ids(3 * BS), BS)
    assert cache.store(hashes, 0, 3, ids(3 * BS)) == (0, 0)
    assert cache.release(hashes) == 3
    cache.clear()
    assert len(cache) == 0
    assert [e[0] for e in cache.take_events()] == [STORED, CLEARED]

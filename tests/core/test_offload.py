"""KV offloading to a host tier (engine.sim.offload): capacity as vLLM computes it, LRU
eviction, prompt-only stores submitted the step after they are offered, loads that hold
a request out of the queue while the copy runs beside other compute, per-request caps,
and the disk tier's promotion."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from factories import deployment, run_until_idle

from inference_lab.engine.sim.core import EngineCore
from inference_lab.engine.sim.kv import bytes_per_token
from inference_lab.engine.sim.kv_transfer import KvTransfer
from inference_lab.engine.sim.offload import (
    GIB_BYTES, OffloadConfig, OffloadConfigError, from_flags, parse_kv_transfer_config,
)
from inference_lab.engine.sim.offload.tier import ChunkTier
from inference_lab.engine.sim.prefix_cache import REMOVED, STORED

BS = 64
BPT = 24576.0  # gpt-oss-20b's KV bytes per position on one GPU (bf16)


def ids(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(4 * n)


def engine(gpu_blocks: int = 200, host_gib: float = 4.0, events: bool = False, tp: int = 1,
           **config) -> EngineCore:
    dep = deployment(tp=tp)
    assert bytes_per_token(dep) == BPT / tp
    dep.scheduler = replace(dep.scheduler, kv_cache_capacity=int(BPT * BS * gpu_blocks))
    dep.offload = OffloadConfig(host_gib * GIB_BYTES, **config)
    return EngineCore(dep, record_kv_events=events)


def stored_then_evicted(e: EngineCore, prompt: bytes) -> float:
    """`prompt` computed (its chunks stored to the host), then pushed out of the GPU by
    other prompts: when that is done."""
    e.submit(0, 4, 0.0, token_ids=prompt)
    t, _ = run_until_idle(e)
    return evict_from_gpu(e, t)


def evict_from_gpu(e: EngineCore, t: float, seeds=range(100, 106)) -> float:
    for s in seeds:
        e.submit(0, 4, t, token_ids=ids(4000, s))
    t, _ = run_until_idle(e, t)
    return t


# ---- capacity -----------------------------------------------------------------------------


def test_host_capacity_is_the_size_over_the_page_rounded_chunk_of_every_rank():
    # one GPU block on one rank: 64 x 24576 = 1,572,864 B (a whole number of pages)
    e = engine(host_gib=4.0)
    assert e.offload.chunk_bytes == 1_572_864
    assert e.offload.num_chunks == 4 * 2**30 // 1_572_864 == 2730
    # TP 2: each rank holds half a block, the chunk counts both halves; 3 blocks per
    # chunk: 3 x 1,572,864 = 4,718,592 B = 1152 pages exactly
    e2 = engine(host_gib=4.0, tp=2, blocks_per_chunk=3)
    assert e2.offload.chunk_bytes == 4_718_592 and e2.offload.num_chunks == 910
    assert e2.offload.cpu_tokens == 910 * 3 * BS


def test_a_chunk_not_a_whole_number_of_pages_is_rounded_up_to_one():
    dep = deployment()
    dep.offload = OffloadConfig(2**20 * 10)
    from inference_lab.engine.sim.offload import HostOffload
    off = HostOffload(dep.offload, 16, 1000.0)  # 16,000 B per chunk -> 16,384
    assert off.chunk_bytes == 16_384 and off.num_chunks == 10 * 2**20 // 16_384


# ---- the tier -------------------------------------------------------------------------


def test_lru_evicts_the_least_recently_used_idle_chunk_and_a_request_tail_first():
    events: list = []
    tier = ChunkTier(4, "CPU", events)
    assert tier.allocate([1, 2, 3])  # one request's chunks, head first
    tier.complete([1, 2, 3])
    assert list(tier.chunks) == [3, 2, 1]  # its tail goes first
    tier.touch([3])
    assert tier.allocate([9]) and tier.allocate([8])  # full: evicts 2, the LRU idle one
    assert 2 not in tier.chunks and (REMOVED, [2], "CPU") in events
    assert (STORED, [1], None, b"", None, "CPU", 0) in events


def test_pinned_and_unwritten_chunks_are_never_evicted_and_a_full_tier_fails():
    tier = ChunkTier(2, "CPU")
    assert tier.allocate([1, 2])  # both being written
    assert not tier.allocate([3]) and list(tier.chunks) == [2, 1]
    tier.complete([1, 2])
    tier.pin([1, 2])  # both being loaded
    assert not tier.allocate([3])
    assert tier.pinned_usage() == 1.0 and tier.usage() == 1.0
    tier.unpin([2])
    assert tier.allocate([3]) and 2 not in tier.chunks


# ---- stores ----------------------------------------------------------------------------


def test_stores_are_prompt_blocks_only_submitted_the_step_after_they_are_offered():
    e = engine()
    req = e.submit(0, 200, 0.0, token_ids=ids(1000, 1))  # 15 full blocks + 40 tokens
    first = e.step(0.0)  # the whole prompt: 15 chunks offered, nothing submitted yet
    assert req.offload.offered == 15 and e.offload.queued and not e.offload.jobs
    second = e.step(first.end)  # submitted at this step's start on the D2H FIFO
    assert not e.offload.queued and len(e.offload.jobs) == 1
    end, kind = e.offload.jobs[0][0], e.offload.jobs[0][2]
    # 15 blocks x 1,572,864 B at 50 GB/s + 50 us
    assert end == pytest.approx(second.start + 5e-5 + 15 * 1_572_864 / 5e10)
    assert len(e.offload.host) == 15 and not any(c.ready for c in e.offload.host.chunks.values())
    run_until_idle(e, second.end)
    assert req.offload.offered == 15  # 200 decoded tokens: no decode chunk was offered
    assert e.offload.stats.store_bytes == 15 * 1_572_864


def test_max_offload_tokens_caps_what_a_request_stores_and_zero_stores_nothing():
    e = engine()
    capped = e.submit(0, 2, 0.0, token_ids=ids(1000, 1), kv=KvTransfer(max_offload_tokens=300))
    none = e.submit(0, 2, 0.0, token_ids=ids(1000, 2), kv=KvTransfer(max_offload_tokens=0))
    run_until_idle(e)
    assert capped.offload.offered == 4  # 300 // 64
    assert none.offload.offered == 0 and len(e.offload.host) == 4


# ---- loads -----------------------------------------------------------------------------


def test_a_prompt_evicted_from_the_gpu_loads_from_the_host_and_its_ttft_drops():
    e = engine()
    prompt = ids(4000, 1)
    miss = e.submit(0, 4, 0.0, token_ids=prompt)
    t, _ = run_until_idle(e)
    t = evict_from_gpu(e, t)
    assert e.prefix_cache.lookup(miss.block_hashes, 100) == 0
    hit = e.submit(0, 4, t, token_ids=prompt)
    run_until_idle(e, t)
    assert hit.offload.host_tokens == 62 * BS == hit.cached_tokens == hit.external_tokens
    assert hit.first_token - hit.arrival < miss.first_token - miss.arrival
    stats = e.offload.stats
    assert stats.load_bytes == 62 * 1_572_864 and stats.host_tokens == 62 * BS
    # the load: 50 us + 62 blocks over 50 GB/s
    assert stats.load_time == pytest.approx(5e-5 + 62 * 1_572_864 / 5e10)


def test_the_loading_request_waits_out_of_the_queue_while_others_compute():
    e = engine()
    prompt = ids(4000, 1)
    t = stored_then_evicted(e, prompt)
    runner = e.submit(0, 400, t, token_ids=ids(500, 7))
    step = e.step(t)  # runner admitted
    loader = e.submit(0, 4, step.end, token_ids=prompt)
    s2 = e.step(step.end)  # loader starts its load, runner decodes
    assert loader.id in e.scheduler.loading and loader not in s2.admitted
    assert e.num_waiting == 1 and e.num_deferred == 1 and s2.num_decodes == 1
    end = e.scheduler.loads_ready_at()
    assert end == pytest.approx(s2.start + 5e-5 + 62 * 1_572_864 / 5e10)
    t = s2.end
    while loader.first_scheduled < 0:
        r = e.step(t)
        t = r.end
        assert r.num_decodes == 1  # the runner kept decoding beside the copy
    assert loader.first_scheduled >= end and loader.num_computed >= 62 * BS
    assert runner.status.name == "RUNNING"


def test_a_prompt_of_whole_blocks_recomputes_its_last_token_after_a_full_load():
    e = engine()
    prompt = ids(10 * BS, 3)
    t = stored_then_evicted(e, prompt)
    again = e.submit(0, 2, t, token_ids=prompt)
    _, results = run_until_idle(e, t)
    assert again.offload.host_tokens == 10 * BS - 1 == again.cached_tokens
    # the step that admitted it computed one position: the last, which samples
    first = next(r for r in results if again in r.admitted)
    assert first.prefill_tokens == 1


def test_max_load_tokens_caps_the_load_in_whole_chunks_and_zero_loads_nothing():
    e = engine()
    prompt = ids(4000, 1)
    t = stored_then_evicted(e, prompt)
    capped = e.submit(0, 4, t, token_ids=prompt, kv=KvTransfer(max_load_tokens=1000))
    t, _ = run_until_idle(e, t)
    assert capped.offload.host_tokens == 15 * BS  # 1000 // 64 whole blocks
    t = evict_from_gpu(e, t, range(200, 206))
    none = e.submit(0, 4, t, token_ids=prompt, kv=KvTransfer(max_load_tokens=0))
    run_until_idle(e, t)
    assert none.offload.host_tokens == 0 and none.cached_tokens == 0


def test_a_chunk_still_being_written_defers_the_lookup_until_its_store_ends():
    e = engine()
    prompt = ids(4000, 1)
    e.submit(0, 1, 0.0, token_ids=prompt)
    r1 = e.step(0.0)  # the prompt: offered
    r2 = e.step(r1.end)  # submitted: in flight until `end`
    end = e.offload.jobs[0][0]
    again = e.submit(0, 1, r2.end, token_ids=prompt)
    assert r2.end < end
    assert e.offload.lookup(again, 0, 62, r2.end) == -1  # HIT_PENDING: try again later
    e.offload.begin_step(end)
    assert e.offload.lookup(again, 0, 62, end) == 62
    assert e.offload.lookup(again, 10, 62, end) == 52  # from the GPU hit on


# ---- the disk tier ------------------------------------------------------------------


def test_a_disk_hit_is_promoted_to_the_host_then_loaded_and_counted_as_disk():
    e = engine(host_gib=0.1, disk_bytes=4 * GIB_BYTES, events=True)  # 68 host chunks
    assert e.offload.num_chunks == 68
    prompt = ids(4000, 1)
    e.submit(0, 4, 0.0, token_ids=prompt)
    t, _ = run_until_idle(e)
    t = evict_from_gpu(e, t)  # the host tier turned over too; the disk kept it
    hashes = e.submit(0, 1, t, token_ids=prompt, kv=KvTransfer(max_load_tokens=0)).block_hashes
    t, _ = run_until_idle(e, t)
    t = evict_from_gpu(e, t, range(300, 306))
    assert hashes[0] not in e.offload.host.chunks and e.offload.disk.chunks[hashes[0]].ready
    again = e.submit(0, 4, t, token_ids=prompt)
    run_until_idle(e, t)
    assert again.offload.disk_tokens == again.offload.host_tokens == 62 * BS
    assert e.offload.stats.disk_tokens == 62 * BS
    media = {ev[5] for ev in e.take_kv_events() if ev[0] == STORED and len(ev) > 5}
    assert media == {"CPU", "STORAGE"}


# ---- settings ---------------------------------------------------------------------------


def test_flags_resolve_as_vllm_and_bad_values_name_the_flag():
    config = from_flags(2.5, "lmcache")
    assert config.cpu_bytes == 2.5 * 2**30 and config.backend == "lmcache"
    assert config.kv_transfer_config()["kv_connector"] == "LMCacheMPConnector"
    assert from_flags(None) is None
    for args, flag in (((-1.0,), "--kv-offloading-size"), ((0.0,), "--kv-offloading-size"),
                       ((1.0, "other"), "--kv-offloading-backend"),
                       ((1.0, None, -2.0), "--kv-offloading-disk-size"),
                       ((None, None, 1.0), "--kv-offloading-disk-size")):
        with pytest.raises(OffloadConfigError, match=flag):
            from_flags(*args)


def test_the_kv_transfer_config_form_turns_offloading_on():
    text = ('{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":'
            '{"cpu_bytes_to_use":1073741824,"eviction_policy":"lru","blocks_per_chunk":2}}')
    config = from_flags(None, kv_transfer_config=text)
    assert (config.cpu_bytes, config.blocks_per_chunk, config.backend) == (2**30, 2, "native")
    assert config.kv_transfer_config()["kv_connector_extra_config"]["cpu_bytes_to_use"] == 2**30
    for bad in ('[1]', '{"kv_connector":"NixlConnector"}',
                '{"kv_connector":"OffloadingConnector","kv_connector_extra_config":{}}',
                '{"kv_connector":"OffloadingConnector","kv_connector_extra_config":'
                '{"cpu_bytes_to_use":1,"eviction_policy":"fifo"}}'):
        with pytest.raises(OffloadConfigError, match="--kv-transfer-config"):
            parse_kv_transfer_config(bad)


@pytest.mark.parametrize("config", [[], ["--config", "configs/gpt-oss-20b.toml"]])
def test_the_flag_reaches_the_embedded_default_and_a_config_alike(config):
    from inference_lab.cli import build_parser
    from inference_lab.cli.cmd_engine import load_deployments

    args = build_parser().parse_args(["engine", *config, "--kv-offloading-size", "4"])
    deployments = load_deployments(args)
    assert deployments and all(d.offload is not None and d.offload.cpu_bytes == 4 * 2**30
                               for d in deployments)
    args = build_parser().parse_args(["engine", *config])
    assert all(d.offload is None for d in load_deployments(args))

"""The engine's vLLM-compatible metrics without sockets: what each finish and step
records on the modelled timeline, bucket boundaries that contain vLLM's, and the fast
exposition equal, byte for byte, to prometheus-client's own rendering."""

from __future__ import annotations

from prometheus_client import generate_latest

from factories import core, run_until_idle
from inference_lab.engine.metrics import buckets as B
from inference_lab.engine.metrics.exposition import MetricsRegistry, _Collect
from inference_lab.engine.sim.request import Status


def drive(engine, metrics, results):
    model = metrics.for_model(engine)
    for result in results:
        model.on_step(result)
        for req in result.finished:
            model.on_finished(req, req.num_output, req.finish_time)
    return model


def test_a_completed_request_records_vllms_intervals_on_the_modelled_timeline():
    engine = core()
    metrics = MetricsRegistry([engine])
    req = engine.submit(100, 5, 0.0)
    _, results = run_until_idle(engine)
    model = drive(engine, metrics, results)
    # One prefill step then four decode steps; every interval is a difference of step ends.
    assert [len(r.first_token) for r in results] == [1, 0, 0, 0, 0]
    h = model.hists
    assert h["vllm:time_to_first_token_seconds"].sum == req.first_token - 0.0
    assert h["vllm:e2e_request_latency_seconds"].sum == req.finish_time
    assert h["vllm:request_queue_time_seconds"].sum == req.first_scheduled == 0.0
    assert h["vllm:request_prefill_time_seconds"].sum == req.first_token
    assert h["vllm:request_decode_time_seconds"].sum == req.finish_time - req.first_token
    itl = h["vllm:inter_token_latency_seconds"]
    assert sum(itl.counts) == 4  # one gap per token after the first
    assert abs(itl.sum - (req.finish_time - req.first_token)) < 1e-12
    tpot = h["vllm:request_time_per_output_token_seconds"]
    assert abs(tpot.sum - (req.finish_time - req.first_token) / 4) < 1e-12
    assert model.success["length"] == 1 and model.counters["vllm:generation_tokens"] == 5
    assert model.counters["vllm:prompt_tokens"] == 100
    assert sum(h["vllm:iteration_tokens_total"].counts) == 5  # one observation per step


def test_an_early_end_is_an_abort_with_what_it_had_received():
    engine = core()
    metrics = MetricsRegistry([engine])
    req = engine.submit(100, 50, 0.0)
    results = [engine.step(engine.clock) for _ in range(4)]  # first token + 3 more
    model = drive(engine, metrics, results)
    last = results[-1].end
    engine.cancel(req, last + 0.0001, Status.FINISHED_CANCELLED)
    model.on_finished(req, 4, last)
    h = model.hists
    assert model.success["abort"] == 1
    assert h["vllm:e2e_request_latency_seconds"].sum == req.finish_time == last + 0.0001
    assert h["vllm:request_generation_tokens"].sum == 4
    assert abs(h["vllm:request_decode_time_seconds"].sum - (last - req.first_token)) < 1e-12


def test_every_timing_histogram_contains_vllms_boundaries_and_reads_within_5_percent():
    for ours, vllm in ((B.TTFT, B.VLLM_TTFT), (B.PER_TOKEN, B.VLLM_PER_TOKEN),
                       (B.E2E, B.VLLM_REQUEST), (B.PHASE, B.VLLM_REQUEST)):
        assert set(vllm) <= set(ours)
        assert list(ours) == sorted(set(ours))
    for bounds, lo, hi in ((B.TTFT, 5e-4, 10.0), (B.PER_TOKEN, 2e-4, 0.2), (B.E2E, 0.01, 100.0)):
        inside = [b for b in bounds if lo <= b <= hi]
        assert max(b / a for a, b in zip(inside, inside[1:])) < 1.0505  # p99 of a point mass


def test_the_fast_exposition_is_prometheus_clients_own_text():
    engines = [core(), core(model="llama-3.1-8b")]
    metrics = MetricsRegistry(engines, engine_index=[3, 4])  # a replica index per core
    for engine in engines:
        for i in range(8):
            engine.submit(50 + i, 20, 0.0)
        _, results = run_until_idle(engine)
        drive(engine, metrics, results)
    metrics.for_model(engines[0]).on_rejected("QUEUE_SATURATED", 2)
    metrics.for_model(engines[1]).on_rejected("SOMETHING_NEW")  # a label value appears later
    for names in (None, ["gpt-oss-20b"], ["llama-3.1-8b"]):
        chosen = [m for m in metrics.models if not names or m.core.name in names]
        assert metrics.render(names) == generate_latest(_Collect(chosen))
    again = metrics.render()
    assert again == metrics.render()  # served from cache while nothing changed
    assert b'vllm:request_success_total{engine="3",finished_reason="length"' in again
    assert metrics.render(engines=[4]) == metrics.render(["llama-3.1-8b"])  # one replica's
    assert b'engine="3"' not in metrics.render(engines=[4])
    assert metrics.render(engines=[7]) == b""


def test_counts_from_a_million_on_are_written_as_prometheus_client_writes_them():
    engine = core()
    metrics = MetricsRegistry([engine])
    model = metrics.for_model(engine)
    itl = model.hists["vllm:inter_token_latency_seconds"]
    itl.observe(0.002, 999_999)
    assert metrics.render() == generate_latest(_Collect(metrics.models))  # "999999.0"
    itl.observe(0.003, 2)  # 1000001: Go's exponent form, 1.000001e+06
    model.version += 1
    text = metrics.render()
    assert text == generate_latest(_Collect(metrics.models))
    assert b'vllm:inter_token_latency_seconds_count{engine="0",model_name="gpt-oss-20b"} 1.000001e+06' in text


def test_every_update_point_moves_the_engine_wide_version_so_no_change_is_served_from_cache():
    engine = core()
    metrics = MetricsRegistry([engine])
    model = metrics.for_model(engine)
    metrics.render()  # cached at the version now
    model.on_relay(0.003)  # the gateway's lateness gauge
    seen = metrics.versions.n
    relayed = metrics.render()
    assert b"inference_lab_relay_lag_seconds" in relayed and b" 0.003\n" in relayed
    assert model.version == seen  # one counter orders every change (WatchMetrics relies on it)
    model.on_rejected("QUEUE_SATURATED")  # the next change must not reuse the relay's version
    assert metrics.versions.n == seen + 1 and model.version == seen + 1
    after = metrics.render()
    assert after != relayed  # not the relay's cached text
    assert b'reason="QUEUE_SATURATED"} 1.0\n' in after
    assert after == generate_latest(_Collect(metrics.models))


def spec_engine(alpha: float, gamma: int):
    from dataclasses import replace

    from factories import deployment
    from inference_lab.engine.sim.core import EngineCore
    from inference_lab.engine.sim.specs import Speculative
    from inference_lab.engine.sim.speculative import expected_accepted

    expected = tuple(expected_accepted([alpha] * gamma, g) for g in range(gamma + 1))
    return EngineCore(replace(deployment(), speculative=Speculative(gamma, expected, "fixed")))


def test_a_speculative_model_counts_its_drafts_and_accepted_tokens_as_vllm_names_them():
    # alpha 0.5, gamma 2: 1.75 tokens kept per step, carried as whole tokens: the decode
    # steps keep 1, 2, 2, 2, 1 (carry 0.75, 0.5, 0.25, 0, 0.75): 8 tokens after the
    # prefill's first. Five drafts of 2 tokens; accepted 0 + 1 + 1 + 1 + 0 = 3, all at
    # position 0 (none kept 2 drafted tokens).
    engine = spec_engine(0.5, 2)
    metrics = MetricsRegistry([engine])
    engine.submit(16, 9, 0.0)
    _, results = run_until_idle(engine)
    model = drive(engine, metrics, results)
    c = model.counters
    assert c["vllm:spec_decode_num_drafts"] == 5
    assert c["vllm:spec_decode_num_draft_tokens"] == 10
    assert c["vllm:spec_decode_num_accepted_tokens"] == 3
    text = metrics.render()
    assert text == generate_latest(_Collect(metrics.models))
    labels = 'engine="0",model_name="gpt-oss-20b"'
    assert f"counter\nvllm:spec_decode_num_drafts_total{{{labels}}} 5.0\n".encode() in text
    assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="0"}} 3.0\n'.encode() in text
    assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="1"}} 0.0\n'.encode() in text


def test_a_model_without_speculation_shows_no_spec_decode_series_even_beside_one_with_it():
    plain, spec = core(), spec_engine(0.6, 3)
    metrics = MetricsRegistry([plain, spec], engine_index=[0, 1])
    for engine in (plain, spec):
        engine.submit(16, 20, 0.0)
        _, results = run_until_idle(engine)
        drive(engine, metrics, results)
    assert b"spec_decode" not in metrics.render(engines=[0])
    merged = metrics.render()
    assert merged == generate_latest(_Collect(metrics.models))
    assert merged.count(b"# HELP vllm:spec_decode_num_drafts") == 1
    assert b'vllm:spec_decode_num_drafts_total{engine="1"' in merged
    assert b'vllm:spec_decode_num_drafts_total{engine="0"' not in merged
    positions = [line for line in merged.splitlines() if line.startswith(b"vllm:spec_decode_num_accepted_tokens_per_pos_total")]
    assert len(positions) == 3  # one per draft position, 0..gamma-1, as vLLM creates them


def test_each_finished_request_observes_its_preemptions_in_vllms_buckets():
    # The KV-pressure scenario of test_scheduler: the third of three requests is preempted
    # at least once; the other two never are (le="1" holds 0 and 1, as in vLLM).
    engine = core(kv_cache_capacity=8 * 64 * 24576)
    reqs = [engine.submit(16, 200, 0.0) for _ in range(3)]
    metrics = MetricsRegistry([engine])
    _, results = run_until_idle(engine)
    model = drive(engine, metrics, results)
    h = model.hists["vllm:request_num_preemptions"]
    assert h.bounds == B.VLLM_NUM_PREEMPTIONS == (1, 2, 3, 4, 5, 10, 20)
    assert h.n == 3 and h.sum == sum(r.preemptions for r in reqs) >= 1
    assert h.sum == model.counters["vllm:num_preemptions"]
    assert metrics.render() == generate_latest(_Collect(metrics.models))


def test_a_sampled_blocks_lifetime_idle_time_and_reuse_gaps_are_read_at_its_eviction():
    from inference_lab.engine.sim.prefix_cache import BlockResidency, PrefixCache

    cache = PrefixCache(16)
    residency = cache.residency = BlockResidency(1.0)  # every block sampled
    a, b = 11, 22
    residency.now = 1.0
    cache.store([a, b], 0, 2, None)  # both stored at 1
    cache.release([a, b])  # free, still cached: b then a queued for eviction
    residency.now = 3.0
    cache.acquire([a])  # a hit at 3
    cache.release([a])
    residency.now = 7.0
    cache.acquire([a])  # ... and at 7
    cache.release([a])  # a queued after b
    residency.now = 10.0
    cache.evict(2)
    # b: stored at 1, never hit: lifetime 9, idle 9, no gap; a: lifetime 9, idle 10 - 7 = 3,
    # one gap 7 - 3 = 4 between its kept accesses.
    assert residency.take() == [(9.0, 9.0, []), (9.0, 3.0, [4.0])]
    assert residency.blocks == {}


def test_kv_cache_metrics_turn_the_residency_histograms_on_with_vllms_boundaries():
    from inference_lab.engine.sim.core import EngineCore
    from factories import deployment

    off = EngineCore(deployment())
    assert off.kv_residency is None
    assert b"kv_block" not in MetricsRegistry([off]).render()
    engine = EngineCore(deployment(), kv_cache_metrics_sample=1.0)
    metrics = MetricsRegistry([engine])
    engine.kv_residency.evicted.append((9.0, 3.0, [4.0, 0.5]))  # as an eviction leaves it
    engine.submit(16, 2, 0.0)
    _, results = run_until_idle(engine)
    model = drive(engine, metrics, results)
    h = model.hists
    assert h["vllm:kv_block_lifetime_seconds"].bounds == B.VLLM_KV_RESIDENCY
    assert (h["vllm:kv_block_lifetime_seconds"].n, h["vllm:kv_block_lifetime_seconds"].sum) == (1, 9.0)
    assert (h["vllm:kv_block_idle_before_evict_seconds"].n, h["vllm:kv_block_idle_before_evict_seconds"].sum) == (1, 3.0)
    assert (h["vllm:kv_block_reuse_gap_seconds"].n, h["vllm:kv_block_reuse_gap_seconds"].sum) == (2, 4.5)
    text = metrics.render()
    assert text == generate_latest(_Collect(metrics.models))
    assert b'vllm:kv_block_lifetime_seconds_bucket{engine="0",le="10.0",model_name="gpt-oss-20b"} 1.0' in text


# gpt-oss-20b's active parameters (fp4 experts + bf16 rest) and attention FLOPs per
# (new, attended) pair: 2 classes of 12 layers, 4 * 64 heads * head_dim 64 each
ACTIVE = 2_388_787_200 + 1_218_355_200
PAIR_FLOPS = 2 * 12 * 4 * 64 * 64


def test_mfu_metrics_count_each_steps_flops_and_bytes_per_gpu_only_when_enabled():
    from inference_lab.engine.sim.core import EngineCore
    from factories import deployment

    off = EngineCore(deployment())
    assert not off.mfu_metrics
    assert b"estimated_" not in MetricsRegistry([off]).render()
    engine = EngineCore(deployment(), mfu_metrics=True)
    metrics = MetricsRegistry([engine])
    engine.submit(16, 2, 0.0)
    _, results = run_until_idle(engine)
    model = drive(engine, metrics, results)
    # step 1, the 16-position prefill: 2 * active * 16 + 16 * 8 pairs (m = ceil(16/2));
    # step 2, one decode at 16 computed (m = 17): 2 * active + 17 pairs
    flops = 2 * ACTIVE * 16 + PAIR_FLOPS * 16 * 8 + 2 * ACTIVE + PAIR_FLOPS * 17
    c = model.counters
    assert c["vllm:estimated_flops_per_gpu"] == flops
    # 17 positions computed, each writing K and V of 8 heads x 64 in 24 layers, bf16
    assert c["vllm:estimated_write_bytes_per_gpu"] == 17 * 24 * 2 * 8 * 64 * 2
    assert c["vllm:estimated_read_bytes_per_gpu"] == sum(r.read_bytes for r in results) > 0
    text = metrics.render()
    assert text == generate_latest(_Collect(metrics.models))
    assert (b'vllm:estimated_write_bytes_per_gpu_total{engine="0",model_name="gpt-oss-20b"} '
            b"835584.0") in text
    assert b"# HELP vllm:estimated_flops_per_gpu_total Estimated number of floating point" in text


def waiting_by_reason(engine, metrics) -> dict[str, float]:
    samples = metrics.for_model(engine).samples("vllm:num_requests_waiting_by_reason")
    return {reason: value for (reason,), value in samples}


def test_a_request_waiting_for_room_counts_as_capacity_and_one_held_by_a_lora_slot_as_deferred():
    engine = core(max_num_seqs=2)
    metrics = MetricsRegistry([engine])
    loras = engine.enable_lora(max_loras=1)
    a, b = loras.load("a", "/adapters/a", 8), loras.load("b", "/adapters/b", 8)
    engine.submit(100, 50, 0.0, lora=a)
    blocked = engine.submit(100, 50, 0.0, lora=b)
    engine.submit(100, 50, 0.0)
    engine.submit(100, 50, 0.0)
    assert waiting_by_reason(engine, metrics) == {"capacity": 4.0, "deferred": 0.0}
    engine.step(0.0)
    # a's request and the first plain one run (max_num_seqs 2); b's was passed over for
    # the LoRA slot (deferred), the second plain one found no running place (capacity)
    assert waiting_by_reason(engine, metrics) == {"capacity": 1.0, "deferred": 1.0}
    engine.scheduler.finish(blocked, Status.FINISHED_CANCELLED)
    assert waiting_by_reason(engine, metrics) == {"capacity": 1.0, "deferred": 0.0}
    text = metrics.render()  # (then vllm:lora_requests_info, stamped with the time)
    assert text.startswith(generate_latest(_Collect(metrics.models)))
    assert (b'vllm:num_requests_waiting_by_reason{engine="0",model_name="gpt-oss-20b",'
            b'reason="deferred"} 0.0') in text


def test_a_request_pulling_its_kv_from_a_prefill_replica_is_deferred_until_the_pull_ends():
    from inference_lab.engine.sim.kv_transfer import CONSUMER, KvTransfer

    engine = core()
    engine.kv_role = CONSUMER
    metrics = MetricsRegistry([engine])
    pulled = engine.submit(1500, 4, 0.0, kv=KvTransfer(remote_tokens=1500))
    assert pulled.transfer_s > 0
    assert waiting_by_reason(engine, metrics) == {"capacity": 0.0, "deferred": 1.0}
    result = engine.step(0.0)  # idle until the pull ends, then admitted
    assert result.start == pulled.ready and result.admitted == [pulled]
    assert waiting_by_reason(engine, metrics) == {"capacity": 0.0, "deferred": 0.0}

"""P/D disaggregation in the pure core: the producer holds a remote-decode prefill's blocks
until they are pulled or time out; the consumer pulls over a modelled link and computes
only the last prompt position; concurrent pulls share the link."""

from __future__ import annotations

import pytest

from inference_lab.engine.sim.kv import bytes_per_token
from inference_lab.engine.sim.kv_transfer import (
    CONSUMER, NONE, PRODUCER, HandoffsFull, KvTransfer, Link, LinkQueue, link_preset,
    parse_roles, prompt_digest,
)
from factories import core, deployment, run_until_idle

PROMPT = 1500  # 23 full blocks of 64 and a partial one: 24 blocks
DIGEST = prompt_digest(b"", PROMPT)  # what a pull of a prompt given by its length presents


def test_a_layout_gives_prefill_replicas_first_then_decode_ones():
    assert parse_roles("1:2", 3) == (PRODUCER, CONSUMER, CONSUMER)
    assert parse_roles("prefill,both", 2) == (PRODUCER, "kv_both")
    with pytest.raises(ValueError, match="1 \\+ 1 replicas; --replicas is 3"):
        parse_roles("1:1", 3)
    with pytest.raises(ValueError, match="unknown role 'x'"):
        parse_roles("x", 1)


def test_presets_take_the_hardware_fabric_and_nic():
    hw = deployment().hardware
    assert link_preset("nvlink", hw) == Link("nvlink", hw.link_bandwidth, hw.link_latency)
    assert link_preset("rdma", hw).bandwidth == hw.scale_out_bandwidth == 5.0e10
    assert link_preset("25@0.5", hw) == Link("25@0.5", 25e9, 0.5e-3)
    with pytest.raises(ValueError):
        link_preset("fast", hw)


def test_a_pull_alone_takes_setup_plus_bytes_over_bandwidth_and_two_at_once_share_the_link():
    q = LinkQueue(Link("x", 1e9, 1e-3))
    assert q.book(0.0, 1e6) == pytest.approx(0.002)  # 1 ms setup + 1 MB at 1 GB/s
    # a second pull that starts at once waits for the first's bytes: both end by 3 ms,
    # when an even share of the link would have ended them both
    assert q.book(0.0, 1e6) == pytest.approx(0.003)


def test_the_producer_holds_the_prompt_blocks_until_the_consumer_pulls_them():
    prefill = core()
    prefill.kv_role = PRODUCER
    prefill.kv_identity = {"remote_engine_id": "p0", "remote_host": "h", "remote_port": 5600}
    total = prefill.total_blocks
    req = prefill.submit(PROMPT, 1, 0.0, kv=KvTransfer(remote_decode=True))
    run_until_idle(prefill)
    params = prefill.kv_params(req)
    assert len(params["remote_block_ids"]) == 24  # ceil(1500 / 64)
    assert params["do_remote_prefill"] is True and params["remote_engine_id"] == "p0"
    assert prefill.handoffs.held_blocks == 24
    assert prefill.scheduler.free_blocks == total - 24  # held against its capacity
    handoff = prefill.take_handoff(params["remote_request_id"], DIGEST, 1.0)
    assert handoff is not None and handoff.tokens == PROMPT
    assert prefill.take_handoff(params["remote_request_id"], DIGEST, 1.0) is None  # pulled once
    prefill.free_handoff(handoff)
    assert prefill.scheduler.free_blocks == total
    assert (prefill.transfers.pulled, prefill.transfers.expired) == (1, 0)


def test_an_unpulled_handoff_is_freed_by_the_abort_timeout_and_counted():
    prefill = core()
    prefill.handoffs.timeout = 2.0
    req = prefill.submit(PROMPT, 1, 0.0, kv=KvTransfer(remote_decode=True))
    end, _ = run_until_idle(prefill)
    rid = prefill.kv_params(req)["remote_request_id"]
    assert prefill.expire_handoffs(end + 1.0) == 0
    assert prefill.take_handoff(rid, DIGEST, end + 2.0) is None  # past its timeout: gone
    assert prefill.transfers.expired == 1 and prefill.handoffs.held_blocks == 0
    assert prefill.scheduler.free_blocks == prefill.total_blocks


def test_a_consumer_skips_the_pulled_prefill_and_its_ttft_holds_the_transfer():
    decode, local = core(), core()
    decode.kv_role = CONSUMER
    pulled = decode.submit(PROMPT, 10, 0.0, kv=KvTransfer(remote_tokens=PROMPT))
    _, steps = run_until_idle(decode)
    plain = local.submit(PROMPT, 10, 0.0)
    run_until_idle(local)
    # 24 blocks x 64 positions x the KV bytes per position, over 50 GB/s after 20 us
    expect = 2e-5 + 24 * 64 * bytes_per_token(decode.deployment) / 5.0e10
    assert pulled.transfer_s == pytest.approx(expect)
    assert pulled.cached_tokens == PROMPT - 1  # only the last position is computed here
    assert steps[0].prefill_tokens == 1
    assert (decode.transfers.external_queries, decode.transfers.external_hits) == (PROMPT, PROMPT - 1)
    overhead = decode.cost.request_overhead + PROMPT * decode.cost.prompt_token_overhead
    assert pulled.first_scheduled == pytest.approx(overhead + expect)
    assert pulled.first_token - pulled.arrival < plain.first_token - plain.arrival


def test_a_preempted_consumer_request_recomputes_what_it_had_pulled():
    decode = core()
    req = decode.submit(PROMPT, 4, 0.0, kv=KvTransfer(remote_tokens=PROMPT))
    decode.step(0.0)
    decode.step(decode.clock)  # admitted with its pulled KV
    assert req.num_computed >= PROMPT
    assert decode.scheduler._external(req, 0) == 0  # a second admission pulls nothing


def tokens(*ids: int) -> bytes:
    return b"".join(i.to_bytes(4, "little") for i in ids)


def test_a_handoff_id_is_unguessable_and_a_pull_of_another_prompt_is_a_miss():
    prefill = core()
    prompt = tokens(*range(1000, 1000 + PROMPT))
    req = prefill.submit(0, 1, 0.0, token_ids=prompt, kv=KvTransfer(remote_decode=True))
    other = prefill.submit(0, 1, 0.0, token_ids=prompt, kv=KvTransfer(remote_decode=True))
    run_until_idle(prefill)
    rid = prefill.kv_params(req)["remote_request_id"]
    assert len(rid) == 32 and rid != str(req.id)  # 128 random bits, not the request counter
    assert rid != prefill.kv_params(other)["remote_request_id"]
    # another prompt of the same length, or the prompt's length alone: a miss, the handoff stays
    for digest in (prompt_digest(tokens(*range(7, 7 + PROMPT)), 0), DIGEST):
        assert prefill.take_handoff(rid, digest, 1.0) is None
    assert prefill.handoffs.held_blocks == 2 * 24
    assert prefill.take_handoff(rid, prompt_digest(prompt, 0), 1.0) is not None


def test_handoffs_are_capped_at_admission_and_a_short_request_still_runs_beside_them():
    prefill = core()
    prefill.handoffs.max_blocks = 3 * 24 + 23  # three prompts of 24 blocks, not four
    prompt = PROMPT
    admitted = [prefill.submit(prompt, 1, 0.0, kv=KvTransfer(remote_decode=True))
                for _ in range(3)]
    with pytest.raises(HandoffsFull, match="KV transfer capacity exhausted"):
        prefill.submit(prompt, 1, 0.0, kv=KvTransfer(remote_decode=True))
    prefill.cancel(admitted.pop(), 0.0)  # a cancelled one gives its reservation back
    admitted.append(prefill.submit(prompt, 1, 0.0, kv=KvTransfer(remote_decode=True)))
    short = prefill.submit(5, 1, 0.0)
    alone = core()
    alone_short = alone.submit(5, 1, 0.0)
    run_until_idle(alone)
    run_until_idle(prefill)
    assert all(r.handoff is not None for r in admitted)
    assert (prefill.handoffs.held_blocks, prefill.handoffs.reserved) == (3 * 24, 0)
    assert prefill.scheduler.free_blocks == prefill.total_blocks - 3 * 24
    # the short request ran beside the prefills (in their steps, so later than alone)
    assert short.finished and short.first_token > alone_short.first_token
    with pytest.raises(HandoffsFull):  # held now, not reserved: still counted
        prefill.submit(prompt, 1, 10.0, kv=KvTransfer(remote_decode=True))


def test_a_replica_without_a_connector_ignores_kv_transfer_params():
    plain = core()
    plain.kv_role = NONE
    plain.handoffs.max_blocks = 1
    req = plain.submit(PROMPT, 1, 0.0, kv=KvTransfer(remote_decode=True, remote_tokens=PROMPT))
    run_until_idle(plain)
    assert req.handoff is None and plain.kv_params(req) is None
    assert (req.external_tokens, plain.handoffs.held_blocks, plain.handoffs.reserved) == (0, 0, 0)

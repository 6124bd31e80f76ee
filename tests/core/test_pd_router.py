"""The load generator's P/D router (experiments.pd): the prefill's request as vllm-router
sends it, the decode's with the handoff, each pool's pick, and the decode side's
transfer counters read from /metrics."""

from __future__ import annotations

import json

from inference_lab.common.pd_pick import PoolPicker
from inference_lab.experiments.client import Endpoint
from inference_lab.experiments.fleet import Route
from inference_lab.experiments.pd import PdRouter, decode_metrics, pd_bodies, ratio_name


def test_the_prefill_is_the_request_with_one_token_unstreamed_and_do_remote_decode():
    raw = Endpoint("http://127.0.0.1:8080", "gpt-oss-20b").request_text("abcd" * 100, 50)
    prefill, decode, head = pd_bodies(raw)
    p_head, _, p_body = prefill.partition(b"\r\n\r\n")
    body = json.loads(p_body)
    assert body == {"model": "gpt-oss-20b", "prompt": "abcd" * 100, "max_tokens": 1, "stream": False,
                    "kv_transfer_params": {"do_remote_decode": True}}
    assert f"Content-Length: {len(p_body)}\r\n".encode() in p_head + b"\r\n"
    assert p_head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    # the decode: the request as it was (streamed, with usage), to carry the handoff
    assert decode == json.loads(raw.partition(b"\r\n\r\n")[2]) and decode["stream"] is True
    assert head == raw.partition(b"\r\n\r\n")[0]


def routes(*indices: int) -> list[Route]:
    return [Route(i, 8080 + i, None) for i in indices]


def test_least_loaded_picks_the_fewest_in_flight_and_the_lowest_index_on_a_tie():
    router = PdRouter(routes(0, 1), routes(2, 3, 4))
    assert router.pick("prefill").index == 0 and router.pick("decode").index == 2
    router.inflight.update({0: 2, 1: 1, 2: 1, 3: 0, 4: 0})
    assert router.pick("prefill").index == 1 and router.pick("decode").index == 3


def test_least_loaded_breaks_a_tie_by_replica_index_whatever_the_pool_s_order():
    router = PdRouter(routes(3, 1), routes(4, 2))
    assert router.pick("prefill").index == 1 and router.pick("decode").index == 2
    # the offline driver's pools use the same pick, by position (engine.drivers.disagg)
    picker = PoolPicker(range(3))
    assert picker.pick([2, 1, 1].__getitem__) == 1


def test_round_robin_takes_each_replica_of_a_pool_in_turn():
    router = PdRouter(routes(0), routes(1, 2, 3), "round_robin")
    assert [router.pick("decode").index for _ in range(5)] == [1, 2, 3, 1, 2]
    assert [router.pick("prefill").index for _ in range(2)] == [0, 0]


def test_the_decode_side_counters_are_summed_for_the_model_only():
    text = "\n".join([
        "# HELP vllm:external_prefix_cache_hits_total ...",
        'vllm:external_prefix_cache_hits_total{engine="1",model_name="gpt-oss-20b"} 1499.0',
        'vllm:external_prefix_cache_hits_total{engine="1",model_name="other"} 7.0',
        'vllm:external_prefix_cache_queries_total{engine="1",model_name="gpt-oss-20b"} 1500.0',
        'inference_lab_kv_transfer_recomputed_total{model_name="gpt-oss-20b"} 2',
    ])
    assert decode_metrics(text, "gpt-oss-20b") == {"external_hits": 1499.0, "external_queries": 1500.0,
                                                   "recomputed": 2.0}
    assert ratio_name((3, 1)) == "3:1"

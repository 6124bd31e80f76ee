"""The series each imitated engine's /metrics names for one signal: vLLM's `vllm:*` and
SGLang's `sglang:*` (sgl-project/sglang, python/sglang/srt/metrics/collector.py at
00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538; the lab renders them in engine.metrics.sglang).

One table for every reader of an exposition (the dashboard's feed, the experiment runner's
queue gauges, the autoscalers' samples, the conformance check): each reads its series
by vLLM's names, and `renamed` turns its table into the names of the engine whose text
it holds, which `engine_of` tells from the text itself. A signal one engine does not serve
(SGLang has no queue-time histogram, no preemption counter, no `vllm:cache_config_info`,
none of the lab's `inference_lab_*` capacity gauges) has no name there: its reader gets
nothing, as it would from a real SGLang server.

Equivalences, stated: `sglang:num_requests_total` (requests finished, any reason) stands
for `vllm:request_success_total` summed over its finished_reason; `sglang:token_usage`
(used over total KV tokens) for `vllm:kv_cache_usage_perc` (used over total blocks). The
rank is the label `engine` in vLLM's series, `dp_rank` in SGLang's scheduler gauges.

Knows names only: no parsing, HTTP or engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

__all__ = ["VLLM", "SGLANG", "ENGINES", "SERIES", "RANK_LABEL", "engine_of", "equivalent",
           "renamed"]

VLLM, SGLANG = "vllm", "sglang"
ENGINES = (VLLM, SGLANG)

# vLLM's sample name (or the lab's) -> SGLang's (None: SGLang serves no such series).
# Counters carry their `_total`; histograms are named by their base (readers add `_sum`,
# `_count`, `_bucket`).
SERIES: dict[str, str | None] = {
    "vllm:num_requests_waiting": "sglang:num_queue_reqs",
    "vllm:num_requests_running": "sglang:num_running_reqs",
    "vllm:kv_cache_usage_perc": "sglang:token_usage",
    "vllm:prompt_tokens_total": "sglang:prompt_tokens_total",
    "vllm:generation_tokens_total": "sglang:generation_tokens_total",
    "vllm:request_success_total": "sglang:num_requests_total",
    "vllm:time_to_first_token_seconds": "sglang:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds": "sglang:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds": "sglang:e2e_request_latency_seconds",
    "vllm:request_time_per_output_token_seconds": None,
    "vllm:request_queue_time_seconds": None,
    "vllm:num_preemptions_total": None,
    "vllm:cache_config_info": None,
    "inference_lab_max_num_seqs": None,
    "inference_lab_max_waiting": None,
    "inference_lab_rejections_total": None,
}
RANK_LABEL = {VLLM: "engine", SGLANG: "dp_rank"}  # the label a scheduler gauge's rank is in
_MARKER = "sglang:num_queue_reqs"  # a series only SGLang's exposition has

V = TypeVar("V")


def engine_of(text: str | bytes) -> str:
    """The engine whose names an exposition uses: SGLANG when it has SGLang's queue gauge,
    else VLLM (the lab's default, and what a server of neither is read as)."""
    marker = _MARKER if isinstance(text, str) else _MARKER.encode()
    return SGLANG if marker in text else VLLM


def equivalent(name: str, engine: str) -> str | None:
    """`name` (vLLM's or the lab's) as `engine` names it; None when it serves no such series.
    A name the table does not know is its own."""
    if engine == VLLM or name not in SERIES:
        return name
    return SERIES[name]


def renamed(table: Mapping[str, V], engine: str) -> dict[str, V]:
    """A reader's table keyed by vLLM's names, keyed by `engine`'s instead (a series the
    engine does not serve left out)."""
    out = {}
    for name, value in table.items():
        other = equivalent(name, engine)
        if other is not None:
            out[other] = value
    return out

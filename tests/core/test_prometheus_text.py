"""The series a scraper reads from an exposition, by label value matched whole: the
experiment runner's queue gauges, the P/D decode counters and the autoscalers' samples
all come from one parse (common.prometheus_text)."""

import pytest

from inference_lab.autoscale.metrics import parse_exposition
from inference_lab.common.prometheus_text import model_sums
from inference_lab.experiments.pd import decode_metrics
from inference_lab.experiments.runner import parse_gauges

WAITING = "vllm:num_requests_waiting"

# A LoRA-serving server names its base model in a label of its own; a model's name may
# hold a quote (escaped in the exposition). A substring search for `model_name="m"`
# counts the first line for "m" and misses the last one.
EXPOSITION = "\n".join([
    "# HELP vllm:num_requests_waiting Requests waiting.",
    "# TYPE vllm:num_requests_waiting gauge",
    'vllm:num_requests_waiting{base_model_name="m",engine="0",model_name="ab"} 9.0',
    'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0',
    'vllm:num_requests_waiting{engine="1",model_name="m"} 3.0',
    'vllm:num_requests_running{engine="0",model_name="m"} 4.0',
    'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 5.0',
    'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 1.0',
    'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 7.0',
    'vllm:external_prefix_cache_hits_total{engine="1",model_name="m"} 1499.0',
    'vllm:num_requests_waiting{engine="0",model_name="say \\"hi\\", then go"} 6.0',
    "",
])


def test_a_label_that_ends_in_model_name_is_not_the_model_s():
    assert model_sums(EXPOSITION, [WAITING], "m") == {WAITING: 5.0}
    assert model_sums(EXPOSITION, [WAITING], "ab") == {WAITING: 9.0}


def test_a_model_name_with_a_quote_and_a_comma_is_read_unescaped():
    assert model_sums(EXPOSITION, [WAITING], 'say "hi", then go') == {WAITING: 6.0}
    assert model_sums(EXPOSITION, [WAITING], "say") == {}


def test_each_series_is_summed_over_its_other_labels_and_absent_when_unseen():
    got = model_sums(EXPOSITION, ["vllm:request_success_total", "vllm:num_requests_running",
                                  "vllm:kv_cache_usage_perc"], "m")
    assert got == {"vllm:request_success_total": 6.0, "vllm:num_requests_running": 4.0}


def test_the_runner_the_pd_router_and_the_autoscalers_read_through_it():
    assert parse_gauges(EXPOSITION, "m") == {"waiting": 5.0, "running": 4.0}
    assert decode_metrics(EXPOSITION, "m") == {"external_hits": 1499.0, "external_queries": 0.0,
                                                "recomputed": 0.0}
    assert parse_exposition(EXPOSITION, "m") == {WAITING: 5.0, "vllm:num_requests_running": 4.0,
                                                 "vllm:request_success_total": 6.0}


def test_a_line_outside_the_format_is_an_error_not_a_guess():
    with pytest.raises(ValueError):
        model_sums('vllm:num_requests_waiting{model_name="m"} many\n', [WAITING], "m")

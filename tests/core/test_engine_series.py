"""One table of equivalent series: an exposition's engine is told from its text, and a
reader's table of vLLM names becomes SGLang's (a series SGLang lacks left out)."""

from inference_lab.autoscale.metrics import parse_exposition
from inference_lab.common.engine_series import SGLANG, VLLM, engine_of, equivalent, renamed
from inference_lab.experiments.scrape import parse_gauges

SGLANG_TEXT = """# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="0"} 3.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="1"} 4.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="0"} 2.0
sglang:num_running_reqs{model_name="other",engine_type="unified",tp_rank="0",pp_rank="0",dp_rank="0"} 9.0
"""
VLLM_TEXT = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="0"} 5.0
"""


def test_the_engine_is_told_from_the_text():
    assert engine_of(SGLANG_TEXT) == engine_of(SGLANG_TEXT.encode()) == SGLANG
    assert engine_of(VLLM_TEXT) == engine_of("") == VLLM


def test_a_readers_table_is_renamed_and_what_sglang_lacks_is_left_out():
    table = {"vllm:num_requests_waiting": "waiting", "vllm:request_queue_time_seconds": "queue_s",
             "inference_lab_steps_total": "steps"}
    assert renamed(table, VLLM) == table
    assert renamed(table, SGLANG) == {"sglang:num_queue_reqs": "waiting",
                                      "inference_lab_steps_total": "steps"}
    assert equivalent("vllm:kv_cache_usage_perc", SGLANG) == "sglang:token_usage"
    assert equivalent("inference_lab_max_waiting", SGLANG) is None


def test_the_runners_gauges_and_the_autoscalers_samples_read_sglangs_names():
    # the ranks' waiting summed (3 + 4), running of model m only
    assert parse_gauges(SGLANG_TEXT, "m") == {"waiting": 7.0, "running": 2.0}
    assert parse_gauges(VLLM_TEXT, "m") == {"waiting": 5.0}
    assert parse_exposition(SGLANG_TEXT, "m") == {"sglang:num_queue_reqs": 7.0,
                                                  "sglang:num_running_reqs": 2.0}

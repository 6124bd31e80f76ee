"""`serve --engine sglang`: SGLang's metric names on /metrics (and no vLLM ones), its
routes' shapes, its 503 "The request queue is full." with --max-queued-requests and no
refusal without it, and the openai SDK streaming from it."""

import json
import threading
import urllib.error
import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference_lab.testing.launch import serve
from inference_lab.testing.poll import wait_until

MODEL = "gpt-oss-20b"


def get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read().decode()


@pytest.fixture(scope="module")
def served():
    with serve("--engine", "sglang", "--max-queued-requests", "2") as s:
        yield s


def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base + "/v1", api_key="none", max_retries=0)


def test_the_openai_sdk_streams_from_it(served):
    stream = client(served).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=12,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 12
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 1


def test_metrics_carry_sglang_names_and_no_vllm_ones(served):
    client(served).completions.create(model=MODEL, prompt="x" * 200, max_tokens=5)
    _, text = get(served.base + "/metrics")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert not [name for name in families if name.startswith("vllm:")]
    for name, kind in (("sglang:num_running_reqs", "gauge"), ("sglang:num_queue_reqs", "gauge"),
                       ("sglang:token_usage", "gauge"), ("sglang:cache_hit_rate", "gauge"),
                       ("sglang:gen_throughput", "gauge"), ("sglang:prompt_tokens", "counter"),
                       ("sglang:generation_tokens", "counter"),
                       ("sglang:time_to_first_token_seconds", "histogram"),
                       ("sglang:inter_token_latency_seconds", "histogram"),
                       ("sglang:e2e_request_latency_seconds", "histogram")):
        assert families[name].type == kind, name
    running = families["sglang:num_running_reqs"].samples[0]
    assert set(running.labels) == {"model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank"}
    assert running.labels["engine_type"] == "unified"
    ttft = [s for s in families["sglang:time_to_first_token_seconds"].samples
            if s.name.endswith("_bucket")]
    assert [s.labels["le"] for s in ttft][:3] == ["0.1", "0.2", "0.4"]
    assert ttft[-1].labels["le"] == "+Inf" and ttft[-1].value >= 1
    generated = families["sglang:generation_tokens"].samples[0]
    assert generated.name == "sglang:generation_tokens_total" and generated.value >= 5


def test_server_info_load_model_info_health_generate_and_flush_cache_shapes(served):
    status, body = get(served.base + "/get_server_info")
    info = json.loads(body)
    assert status == 200 and info["model_path"] == MODEL and info["page_size"] == 1
    assert info["max_queued_requests"] == 2 and info["schedule_policy"] == "fcfs"
    assert info["scheduler_info"]["max_total_num_tokens"] > 0
    assert set(info["internal_states"][0]) >= {"last_gen_throughput", "memory_usage",
                                               "waiting_queue_size", "running_batch_size"}
    load = json.loads(get(served.base + "/get_load")[1])
    assert isinstance(load, list) and set(load[0]) == {"dp_rank", "num_reqs", "num_waiting_reqs",
                                                       "num_tokens", "ts_tic"}
    loads = json.loads(get(served.base + "/v1/loads")[1])
    assert loads["loads"][0]["max_total_num_tokens"] == info["scheduler_info"]["max_total_num_tokens"]
    model = json.loads(get(served.base + "/get_model_info")[1])
    assert model == {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True,
                     "preferred_sampling_params": None}
    assert get(served.base + "/health_generate")[0] == 200
    status, body = get(served.base + "/flush_cache")
    assert status == 200 and body.startswith("Cache flushed.")


def _stream(served, results: list) -> None:
    try:
        stream = client(served).completions.create(model=MODEL, prompt="hi", max_tokens=3000,
                                                   stream=True)
        results.append(sum(1 for _ in stream))
    except openai.APIError as exc:  # (the server stopping ends it)
        results.append(exc)


def test_a_full_queue_is_refused_with_sglangs_503(served):
    served.capacity({"model": MODEL, "max_num_seqs": 1})
    assert served.capacity()[0]["max_waiting"] == 2
    results: list = []
    threads = []
    try:
        for expected_waiting in (0, 1, 2):
            t = threading.Thread(target=_stream, args=(served, results), daemon=True)
            t.start()
            threads.append(t)
            wait_until(lambda: (lambda row: row["running"] == 1
                                and row["waiting"] == expected_waiting)(served.capacity()[0]),
                       timeout=15)
        with pytest.raises(openai.APIStatusError) as refused:
            client(served).completions.create(model=MODEL, prompt="hi", max_tokens=5)
        assert refused.value.status_code == 503
        assert refused.value.body["message"] == "The request queue is full."
    finally:
        served.capacity({"model": MODEL, "max_num_seqs": 256})
        for t in threads:
            t.join(timeout=30)
    assert results == [3001, 3001, 3001]  # 3000 token chunks and the finish chunk each


def test_without_a_bound_nothing_is_refused():
    with serve("--engine", "sglang") as unbounded:
        unbounded.capacity({"model": MODEL, "max_num_seqs": 1})
        sdk = openai.OpenAI(base_url=unbounded.base + "/v1", api_key="none", max_retries=0)
        results: list = []

        def one():
            results.append(sdk.completions.create(model=MODEL, prompt="hi",
                                                  max_tokens=3).usage.completion_tokens)
        threads = [threading.Thread(target=one) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert results == [3] * 40

"""Benchmark result files read as closed-loop points: each format by hand, and a clear
refusal (one line naming the file) for what cannot be a point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference_lab.calibrate.measurements import MeasurementError, read_file


def write(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_a_csv_gives_one_point_per_line_and_prefers_the_median_ttft(tmp_path):
    path = write(tmp_path, "sweep.csv", "concurrency,input_len,output_len,ttft_ms,tpot_ms,num_prompts\n"
                                        "4,1000,200,50.5,4.25,40\n\n"
                                        "16,1000,200,80,6.5,160\n")
    a, b = read_file(path)
    assert (a.concurrency, a.input_len, a.output_len, a.num_prompts) == (4, 1000, 200, 40)
    assert a.metrics == {"ttft_ms": 50.5, "tpot_ms": 4.25}
    assert b.metrics == {"ttft_ms": 80.0, "tpot_ms": 6.5} and b.where == f"{path}:4"
    path = write(tmp_path, "m.csv", "ttft_p50_ms,concurrency,input_len,output_len,ttft_ms,tpot_ms\n"
                                    "40,8,512,128,60,5\n")
    (c,) = read_file(path)
    assert c.metrics == {"ttft_p50_ms": 40.0, "tpot_ms": 5.0} and c.num_prompts == 0


@pytest.mark.parametrize("text, message", [
    ("concurrency,input_len,ttft_ms,tpot_ms\n4,100,5,1\n", "a CSV needs the header concurrency,input_len,"
     "output_len,ttft_ms,tpot_ms (optional: num_prompts, ttft_p50_ms); missing: output_len"),
    ("concurrency,input_len,output_len,ttft_ms,tpot_ms,itl\n4,1,2,3,4,5\n", "unknown CSV column(s) itl"),
    ("concurrency,input_len,output_len,ttft_ms,tpot_ms\n4,100,20,fast,1\n", ":2: ttft_ms: expected a number, got 'fast'"),
    ("concurrency,input_len,output_len,ttft_ms,tpot_ms\n2.5,100,20,5,1\n", ":2: concurrency: expected a positive integer, got '2.5'"),
    ("concurrency,input_len,output_len,ttft_ms,tpot_ms\n4,100,20,5\n", ":2: 4 values for 5 columns"),
    ("concurrency,input_len,output_len,ttft_ms,tpot_ms\n4,100,1,5,1\n", "output length 1: TPOT needs at least 2"),
    ("concurrency,input_len,output_len,ttft_ms,tpot_ms\n", "a header but no rows"),
])
def test_a_bad_csv_is_refused_naming_file_line_and_value(tmp_path, text, message):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(MeasurementError, match=None) as exc:
        read_file(path)
    assert str(exc.value).startswith(str(path)) and message in str(exc.value)


def test_a_vllm_bench_result_takes_its_mean_lengths_median_ttft_and_mean_tpot(tmp_path):
    # 40 requests of 8,000 + 1,000 tokens on average
    path = write(tmp_path, "vllm.json", {
        "backend": "vllm", "num_prompts": 40, "max_concurrency": 4, "request_rate": "inf",
        "completed": 40, "total_input_tokens": 320_000, "total_output_tokens": 40_000,
        "mean_ttft_ms": 158.6, "median_ttft_ms": 137.0, "mean_tpot_ms": 4.43, "median_tpot_ms": 4.44})
    (m,) = read_file(path)
    assert (m.concurrency, m.input_len, m.output_len, m.num_prompts) == (4, 8000, 1000, 40)
    assert m.metrics == {"ttft_p50_ms": 137.0, "tpot_ms": 4.43}


def test_an_open_loop_vllm_bench_run_is_refused(tmp_path):
    path = write(tmp_path, "rate.json", {"num_prompts": 10, "max_concurrency": None, "request_rate": 2.0,
                                         "completed": 10, "total_input_tokens": 10, "total_output_tokens": 100,
                                         "mean_ttft_ms": 1, "median_ttft_ms": 1, "mean_tpot_ms": 1})
    with pytest.raises(MeasurementError, match="open-loop run \\(request rate 2.0/s"):
        read_file(path)


def test_an_inference_perf_stage_is_read_in_seconds(tmp_path):
    path = write(tmp_path, "stage_0_lifecycle_metrics.json", {
        "load_summary": {"count": 80, "requested_rate": 1.0, "concurrency": 8},
        "successes": {"count": 80, "latency": {
            "time_to_first_token": {"mean": 0.06, "median": 0.05},
            "time_per_output_token": {"mean": 0.0042, "median": 0.0041}},
            "prompt_len": {"mean": 1024.4}, "output_len": {"mean": 255.6}},
        "failures": {"count": 0}})
    (m,) = read_file(path)
    assert (m.concurrency, m.input_len, m.output_len, m.num_prompts) == (8, 1024, 256, 80)
    assert m.metrics == pytest.approx({"ttft_p50_ms": 50.0, "tpot_ms": 4.2})


def test_an_aiperf_export_takes_the_concurrency_from_its_config(tmp_path):
    path = write(tmp_path, "profile_export_aiperf.json", {
        "input_config": {"loadgen": {"concurrency": 16}},
        "request_count": {"unit": "requests", "avg": 160},
        "time_to_first_token": {"unit": "ms", "avg": 90.0, "p50": 70.0},
        "inter_token_latency": {"unit": "ms", "avg": 6.5, "p50": 6.4},
        "input_sequence_length": {"unit": "tokens", "avg": 2048.0},
        "output_sequence_length": {"unit": "tokens", "avg": 512.0}})
    (m,) = read_file(path)
    assert (m.concurrency, m.input_len, m.output_len, m.num_prompts) == (16, 2048, 512, 160)
    assert m.metrics == {"ttft_p50_ms": 70.0, "tpot_ms": 6.5}
    old = write(tmp_path, "old.json", {"input_config": {"loadgen": {"concurrency": 2}}, "records": {
        "ttft": {"unit": "ms", "avg": 20.0}, "inter_token_latency": {"unit": "ms", "avg": 3.0},
        "input_sequence_length": {"avg": 100}, "output_sequence_length": {"avg": 50}}})
    assert read_file(old)[0].metrics == {"ttft_ms": 20.0, "tpot_ms": 3.0}


def test_a_guidellm_report_gives_one_point_per_closed_loop_benchmark(tmp_path):
    def bench(strategy, ttft):
        return {"config": {"strategy": strategy}, "metrics": {
            "time_to_first_token_ms": {"successful": {"mean": ttft + 5, "median": ttft}},
            "inter_token_latency_ms": {"successful": {"mean": 5.0}},
            "time_per_output_token_ms": {"successful": {"mean": 4.9}},
            "prompt_token_count": {"successful": {"mean": 512}},
            "output_token_count": {"successful": {"mean": 128}}}}
    path = write(tmp_path, "guidellm.json", {"benchmarks": [
        bench({"type_": "synchronous"}, 30.0), bench({"type_": "concurrent", "streams": 8}, 45.0)]})
    a, b = read_file(path)
    assert (a.concurrency, b.concurrency) == (1, 8)
    assert b.metrics == {"ttft_p50_ms": 45.0, "tpot_ms": 5.0} and (b.input_len, b.output_len) == (512, 128)
    path = write(tmp_path, "poisson.json", {"benchmarks": [bench({"type_": "poisson", "rate": 3}, 1)]})
    with pytest.raises(MeasurementError, match=r"benchmarks\[0\]: a poisson strategy"):
        read_file(path)


@pytest.mark.parametrize("content, message", [
    ('{"mean_ttft_ms": 1', "not JSON"),
    ({"something": 1}, "not a format calibrate reads"),
    ({"mean_ttft_ms": 5, "max_concurrency": 4, "completed": 4}, "a malformed result file (KeyError"),
])
def test_a_file_that_is_no_result_is_refused_in_one_line(tmp_path, content, message):
    path = write(tmp_path, "x.json", content)
    with pytest.raises(MeasurementError) as exc:
        read_file(path)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(MeasurementError, match="no such file"):
        read_file(tmp_path / "nope.csv")

"""Workload files in inference-lab's own shapes (its workloads/ directory): the keys this
lab had refused (closed_loop_jitter_secs, dataset_path, duration_secs, rate_schedule,
fixed_rate, burst, arrival_rate's default) load and run; session replay is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference_lab.common.toml import ConfigError
from inference_lab.common.workload import load_workload, open_loop_arrivals
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.engine.sim.config import load_deployment

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = """
[input_len_dist]
type = "fixed"
value = 100

[output_len_dist]
type = "fixed"
value = 20
"""


def write(tmp_path: Path, text: str, name: str = "w.toml") -> Path:
    path = tmp_path / name
    path.write_text(text + LENGTHS)
    return path


def batch_file(tmp_path: Path) -> Path:
    lines = [
        {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 7}},
        {"custom_id": "b", "method": "POST", "url": "/v1/completions",
         "body": {"model": "m", "prompt": "y" * 40}},
        {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "system", "content": "s" * 8},
                                             {"role": "user", "content": [{"type": "text", "text": "zz"}]}],
                  "max_completion_tokens": 3}},
    ]
    path = tmp_path / "examples" / "batch.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    return path


def simulate(workload: Path) -> dict:
    return run_offline(load_deployment(ROOT / "configs" / "gpt-oss-20b.toml", "b200"),
                       load_workload(workload))


def test_closed_loop_jitter_spreads_the_first_arrivals_and_the_run_completes(tmp_path):
    base = 'arrival_pattern = "closed_loop"\nnum_concurrent_users = 16\nnum_requests = 64\nseed = 7\n'
    plain = simulate(write(tmp_path, base, "a.toml"))
    jittered = simulate(write(tmp_path, base + "closed_loop_jitter_secs = 0.5\n", "b.toml"))
    assert load_workload(tmp_path / "b.toml").closed_loop_jitter_secs == 0.5
    assert jittered["requests"]["completed"] == plain["requests"]["completed"] == 64
    # staggered over half a second, the first users wait less for one another's prefill
    assert jittered["latency_metrics"]["ttft_ms"]["p99"] < plain["latency_metrics"]["ttft_ms"]["p99"]


def test_a_dataset_supplies_the_prompts_and_caps_the_outputs_and_ends_the_run(tmp_path, monkeypatch):
    batch_file(tmp_path)
    monkeypatch.chdir(tmp_path)  # inference-lab resolves dataset_path from the working directory
    w = write(tmp_path, 'dataset_path = "examples/batch.jsonl"\narrival_pattern = "poisson"\n'
                        'arrival_rate = 1.0\nseed = 42\n')
    spec = load_workload(w)
    assert (spec.num_requests, spec.arrival_rate) == (None, 1.0)
    summary = simulate(w)
    assert summary["requests"]["completed"] == summary["requests"]["total"] == 3
    # built-in tokenizer: 3 header tokens a message and 3 for the reply, 4 bytes a token
    prompts = (3 + 100 + 3) + 10 + (3 + 2 + 3 + 1 + 3)
    assert summary["prefix_cache"]["queries"] == prompts
    span, thr = summary["simulation"]["simulated_seconds"], summary["throughput_metrics"]
    assert thr["input_tokens_per_sec"] * span == pytest.approx(prompts)
    assert thr["output_tokens_per_sec"] * span == pytest.approx(7 + 20 + 3)  # min(20, the cap)


def test_a_dataset_beside_the_workload_is_found_and_a_missing_one_is_refused_by_key(tmp_path):
    batch_file(tmp_path)
    w = write(tmp_path, 'dataset_path = "examples/batch.jsonl"\narrival_pattern = "closed_loop"\n'
                        'num_concurrent_users = 2\nnum_requests = 100\nseed = 1\n')
    assert simulate(w)["requests"]["completed"] == 3
    gone = write(tmp_path, 'dataset_path = "nope.jsonl"\narrival_pattern = "batched"\nseed = 1\n', "g.toml")
    with pytest.raises(ConfigError, match=r"g\.toml: dataset_path: cannot read nope\.jsonl"):
        load_workload(gone)
    (tmp_path / "bad.jsonl").write_text('{"custom_id": "a"}\n')
    bad = write(tmp_path, 'dataset_path = "bad.jsonl"\narrival_pattern = "batched"\nseed = 1\n', "b.toml")
    with pytest.raises(ConfigError, match=r"dataset_path: .*bad\.jsonl: line 1: body: missing"):
        load_workload(bad)


def test_fixed_rate_burst_duration_and_a_square_rate_schedule(tmp_path):
    fixed = load_workload(write(tmp_path, 'arrival_pattern = "fixed_rate"\narrival_rate = 4.0\n'
                                          'num_requests = 3\nseed = 1\n', "f.toml"))
    assert [t for t, *_ in open_loop_arrivals(fixed)] == [0.25, 0.5, 0.75]
    burst = load_workload(write(tmp_path, 'arrival_pattern = "burst"\nnum_requests = 400\nseed = 1\n', "b.toml"))
    gaps = [b - a for (a, *_), (b, *_) in zip(open_loop_arrivals(burst), list(open_loop_arrivals(burst))[1:])]
    assert all(0.001 <= g <= 0.01 or 0.5 <= g <= 2.0 for g in gaps)
    assert 0.1 < sum(g < 0.1 for g in gaps) / len(gaps) < 0.3
    timed = load_workload(write(tmp_path, 'arrival_pattern = "poisson"\narrival_rate = 50.0\n'
                                          'duration_secs = 2.0\nseed = 3\n', "d.toml"))
    times = [t for t, *_ in open_loop_arrivals(timed)]
    assert timed.num_requests is None and max(times) <= 2.0 and 70 < len(times) < 130
    square = load_workload(write(tmp_path, 'arrival_pattern = "poisson"\nnum_requests = 2000\nseed = 3\n'
                                           'rate_schedule = { type = "square", low = 10.0, high = 100.0, '
                                           'period_secs = 10.0, duty = 0.5 }\n', "s.toml"))
    times = [t for t, *_ in open_loop_arrivals(square)]
    high = sum(1 for t in times if t % 10.0 < 5.0)
    assert high / len(times) == pytest.approx(100 / 110, abs=0.03)
    trace = load_workload(write(tmp_path, 'arrival_pattern = "uniform"\nnum_requests = 3\nseed = 3\n'
                                          'rate_schedule = { type = "trace", points = [[0.0, 2.0], [10.0, 2.0]] }\n',
                                "t.toml"))
    assert [t for t, *_ in open_loop_arrivals(trace)] == [0.5, 1.0, 1.5]


@pytest.mark.parametrize(("text", "message"), [
    ('sessions_path = "data/s.jsonl"\narrival_pattern = "poisson"\nnum_sessions = 2\nseed = 1\n',
     "workload.toml: sessions_path: session replay is not simulated by this lab"),
    ('arrival_pattern = "poisson"\nseed = 1\n',
     "workload.toml: num_requests: missing; expected an integer >= 1 (or duration_secs or dataset_path"),
    ('arrival_pattern = "poisson"\nnum_requests = 5\nseed = 1\nrate_schedule = { type = "sine", min = 5, max = 1, period_secs = 1 }\n',
     "workload.toml: rate_schedule.max: expected a number >= min (5.0), got 1"),
    ('arrival_pattern = "poisson"\nnum_requests = 5\nseed = 1\nrate_schedule = { type = "trace", points = [[1, 2], [0, 1]] }\n',
     "workload.toml: rate_schedule.points: expected one or more [time_secs, rate] pairs"),
    ('arrival_pattern = "poisson"\nnum_requests = 5\nseed = 1\nclosed_loop_jitter_secs = -1\n',
     "workload.toml: closed_loop_jitter_secs: expected a number >= 0 (seconds), got -1"),
])
def test_refusals_name_the_key(tmp_path, text, message):
    path = write(tmp_path, text, "workload.toml")
    with pytest.raises(ConfigError) as info:
        load_workload(path)
    assert message in str(info.value)


def test_the_summary_has_inference_labs_output_layout(tmp_path):
    w = write(tmp_path, 'arrival_pattern = "closed_loop"\nnum_concurrent_users = 16\nnum_requests = 64\nseed = 7\n')
    summary = simulate(w)
    for name in ("ttft_ms", "e2e_ms", "per_token_ms"):
        stats = summary["latency_metrics"][name]
        assert set(stats) == {"min", "mean", "p50", "p90", "p99"} and 0 < stats["min"] <= stats["p50"]
    util = summary["utilization"]
    assert set(util) == {"avg_kv_cache_util", "avg_flops_util", "avg_bandwidth_util"}
    assert all(0 < v <= 1 for v in util.values())
    # 16 decodes of a 20-token reply on a B200: weight reads dominate, not FLOPs
    assert util["avg_bandwidth_util"] > 5 * util["avg_flops_util"]
    assert summary["requests"]["rejected"] == 0
    assert summary["preemptions"] == {"total": 0, "per_request_mean": 0.0}

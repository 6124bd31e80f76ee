"""Production traces: the three formats, their shipped samples, windows and speed, prompts
from Mooncake's hash ids, refusals naming the line, and replay through the offline driver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference_lab.common.toml import ConfigError
from inference_lab.common.traces import MOONCAKE_BLOCK, TraceError, block_tokens, load_trace
from inference_lab.common.workload import load_workload, open_loop_arrivals
from inference_lab.engine.drivers.offline import run_offline
from factories import deployment

TRACES = Path(__file__).resolve().parents[2] / "configs" / "traces"
WORKLOADS = Path(__file__).resolve().parents[2] / "configs" / "workloads"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def mooncake_row(ts: int, inp: int, out: int, ids: list[int]) -> str:
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids})


# ---- the shipped samples ------------------------------------------------------------------

@pytest.mark.parametrize("name, fmt", [("mooncake-sample.jsonl", "mooncake"),
                                       ("azure-sample.csv", "azure"),
                                       ("burstgpt-sample.csv", "burstgpt")])
def test_each_shipped_sample_loads_in_time_order_with_its_lengths(name, fmt):
    trace = load_trace(TRACES / name, fmt)
    assert trace.rows == 300
    assert len(trace) + trace.skipped == 300
    assert all(a <= b for a, b in zip(trace.times, trace.times[1:]))
    assert 40 < trace.duration < 90  # about a minute at ~5 requests/s
    assert min(trace.inputs) >= 1 and min(trace.outputs) >= 1


def test_burstgpt_failed_requests_are_skipped_and_counted():
    # the sample logs a few failures as BurstGPT does: 0 response tokens
    lines = (TRACES / "burstgpt-sample.csv").read_text().splitlines()[1:]
    failures = sum(1 for line in lines if line.split(",")[3] == "0")
    trace = load_trace(TRACES / "burstgpt-sample.csv", "burstgpt")
    assert failures > 0
    assert (trace.skipped, len(trace)) == (failures, 300 - failures)


def test_azure_times_count_from_the_first_row_to_the_tenth_of_a_microsecond(tmp_path):
    path = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n"
                 "2023-11-17 00:00:00.0000000,5,6\n")
    trace = load_trace(path, "azure")
    assert trace.times[0] == 0.0
    assert trace.times[1] == pytest.approx(4.314579, abs=1e-6)
    # across midnight: 5 h 44 min 13.3194100 s after the first row
    assert trace.times[2] == pytest.approx(5 * 3600 + 44 * 60 + 13.31941, abs=1e-6)
    assert list(trace.inputs) == [374, 396, 5] and list(trace.outputs) == [44, 109, 6]


def test_mooncake_timestamps_are_milliseconds():
    trace = load_trace(TRACES / "mooncake-sample.jsonl", "mooncake")
    first = json.loads((TRACES / "mooncake-sample.jsonl").read_text().splitlines()[0])
    assert trace.times[0] == first["timestamp"] / 1000
    assert trace[0].hash_ids == tuple(first["hash_ids"])


# ---- window and speed ------------------------------------------------------------------------

def test_a_window_keeps_its_requests_and_starts_the_replay_at_its_start(tmp_path):
    path = write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                 + "".join(f"{t},ChatGPT,10,20,30,API log\n" for t in (1, 5, 10, 15, 20)))
    trace = load_trace(path, "burstgpt", window=(5.0, 15.0))
    assert list(trace.times) == [0.0, 5.0]  # 5 and 10; 15 is past the window's end
    fast = load_trace(path, "burstgpt", window=(5.0, 15.0), speed=2.0)
    assert list(fast.times) == [0.0, 2.5]
    assert list(load_trace(path, "burstgpt", speed=4.0).times) == [0.25, 1.25, 2.5, 3.75, 5.0]


def test_rows_out_of_order_are_replayed_in_time_order_keeping_ties_in_file_order(tmp_path):
    path = write(tmp_path, "m.jsonl", "\n".join([mooncake_row(3000, 10, 1, [1]), mooncake_row(1000, 20, 2, [2]),
                                                mooncake_row(1000, 30, 3, [3])]))
    trace = load_trace(path, "mooncake")
    assert list(trace.times) == [1.0, 1.0, 3.0]
    assert list(trace.inputs) == [20, 30, 10]
    assert list(trace.lines) == [2, 3, 1]


# ---- prompts from hash ids ---------------------------------------------------------------------

def test_equal_hash_ids_give_equal_blocks_and_the_last_block_is_cut_to_the_prompt(tmp_path):
    path = write(tmp_path, "m.jsonl", "\n".join([
        mooncake_row(0, 2 * MOONCAKE_BLOCK + 100, 5, [7, 8, 9]),
        mooncake_row(10, 2 * MOONCAKE_BLOCK + 1, 5, [7, 8, 10]),
        mooncake_row(20, 3 * MOONCAKE_BLOCK, 5, [11, 8, 9])]))
    trace = load_trace(path, "mooncake")
    a, b, c = (trace.prompt_ids(i) for i in range(3))
    assert (len(a), len(b), len(c)) == (4 * (2 * 512 + 100), 4 * (2 * 512 + 1), 4 * 3 * 512)
    two = 4 * 2 * MOONCAKE_BLOCK
    assert a[:two] == b[:two]  # the first two blocks are shared
    assert a[two:two + 4] != b[two:two + 4]  # block 9 against block 10
    assert a[:4 * 512] != c[:4 * 512]  # block 7 against 11 ...
    assert a[4 * 512:two] == c[4 * 512:two]  # ... and block 8 is block 8 wherever it sits
    assert block_tokens(8) == block_tokens(8) != block_tokens(8, seed=1)


def test_a_trace_without_hash_ids_has_no_token_ids():
    trace = load_trace(TRACES / "azure-sample.csv", "azure")
    assert not trace.has_blocks and trace.prompt_ids(0) == b""


# ---- refusals name the line ----------------------------------------------------------------------

@pytest.mark.parametrize("row, message", [
    ("not json", "line 2: not JSON"),
    ('{"timestamp": 1, "input_length": 5, "hash_ids": [1]}', "line 2: output_length: missing"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "line 2: timestamp: expected a number >= 0"),
    ('{"timestamp": 1, "input_length": 5.5, "output_length": 1, "hash_ids": [1]}', "line 2: input_length: expected an integer"),
    ('{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1]}', "line 2: hash_ids: 1 ids for 600 input tokens; expected ceil(600 / 512) = 2"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}', "line 2: hash_ids: expected an array of integers"),
    ('[1, 2]', "line 2: expected an object"),
])
def test_a_malformed_mooncake_row_is_refused_naming_its_line(tmp_path, row, message):
    path = write(tmp_path, "m.jsonl", mooncake_row(0, 5, 1, [1]) + "\n" + row + "\n")
    with pytest.raises(TraceError) as err:
        load_trace(path, "mooncake")
    assert f"{path}: {message}" in str(err.value)


@pytest.mark.parametrize("fmt, text, message", [
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1,2\n2023-11-16 25:00:00,1,2\n",
     "line 3: TIMESTAMP: expected a date and time"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,1\n", "line 2: 2 fields; the header has 3"),
    ("azure", "TIMESTAMP,Context,GeneratedTokens\n2023-11-16 18:15:46.68,1,2\n", "line 1: the header lacks ContextTokens"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n\n2023-11-16 18:15:46.68,x,2\n", "line 3: ContextTokens: expected an integer >= 0, got 'x'"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,ChatGPT,5,-3,2,API log\n",
     "line 2: Response tokens: expected an integer in [0, 10000000], got -3"),
    ("burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\nsoon,ChatGPT,5,3,8,API log\n",
     "line 2: Timestamp: expected a number >= 0, got 'soon'"),
    ("burstgpt", "", "empty file"),
])
def test_a_malformed_csv_row_is_refused_naming_its_line(tmp_path, fmt, text, message):
    path = write(tmp_path, "t.csv", text)
    with pytest.raises(TraceError) as err:
        load_trace(path, fmt)
    assert f"{path}: {message}" in str(err.value)


def test_an_unknown_format_or_a_missing_file_is_refused(tmp_path):
    with pytest.raises(TraceError, match="unknown trace format 'sharegpt'"):
        load_trace(TRACES / "azure-sample.csv", "sharegpt")
    with pytest.raises(TraceError, match="cannot read .*nope.csv"):
        load_trace(tmp_path / "nope.csv", "azure")


# ---- workloads -----------------------------------------------------------------------------------

def test_a_trace_workload_finds_its_file_beside_it_and_replays_every_request(tmp_path):
    spec = load_workload(WORKLOADS / "trace-mooncake-sample.toml")
    assert spec.arrival_pattern == "trace" and Path(spec.trace_path).is_file()
    arrivals = list(open_loop_arrivals(spec))
    trace = load_trace(TRACES / "mooncake-sample.jsonl", "mooncake")
    assert len(arrivals) == len(trace) == 300
    assert [a[0] for a in arrivals] == list(trace.times)
    assert [(a[1], a[2]) for a in arrivals] == list(zip(trace.inputs, trace.outputs))
    assert all(len(a[3]) == 4 * a[1] for a in arrivals)


def test_num_requests_and_duration_cut_a_trace_short(tmp_path):
    base = (f'[workload]\narrival_pattern = "trace"\ntrace_path = "{TRACES / "azure-sample.csv"}"\n'
            'trace_format = "azure"\n')
    assert len(list(open_loop_arrivals(load_workload(write(tmp_path, "a.toml", base + "num_requests = 7\n"))))) == 7
    within = list(open_loop_arrivals(load_workload(write(tmp_path, "b.toml", base + "duration_secs = 10\n"))))
    trace = load_trace(TRACES / "azure-sample.csv", "azure")
    assert len(within) == sum(1 for t in trace.times if t <= 10) and within[-1][0] <= 10


@pytest.mark.parametrize("extra, key, message", [
    ('input_len_dist = { type = "fixed", value = 5 }\n', "workload.input_len_dist", "does not apply to a trace"),
    ("arrival_rate = 3.0\n", "workload.arrival_rate", "does not apply to a trace"),
    ("trace_window = [10, 5]\n", "workload.trace_window", "expected [start, end]"),
    ("trace_speed = 0\n", "workload.trace_speed", "expected a number > 0"),
])
def test_a_trace_workload_refuses_keys_that_do_not_apply(tmp_path, extra, key, message):
    text = (f'[workload]\narrival_pattern = "trace"\ntrace_path = "{TRACES / "azure-sample.csv"}"\n'
            f'trace_format = "azure"\n{extra}')
    with pytest.raises(ConfigError) as err:
        load_workload(write(tmp_path, "w.toml", text))
    assert err.value.path == key and message in err.value.message


def test_trace_keys_without_the_trace_pattern_and_a_bad_trace_file_are_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_workload(write(tmp_path, "w.toml", '[workload]\narrival_pattern = "poisson"\nnum_requests = 5\n'
                            'trace_path = "x.csv"\ninput_len_dist = { type = "fixed", value = 5 }\n'
                            'output_len_dist = { type = "fixed", value = 5 }\n'))
    assert err.value.path == "workload.trace_path" and "only with arrival_pattern" in err.value.message
    bad = write(tmp_path, "bad.jsonl", mooncake_row(0, 5, 1, [1]) + "\n{oops\n")
    with pytest.raises(ConfigError) as err:
        load_workload(write(tmp_path, "w.toml", '[workload]\narrival_pattern = "trace"\n'
                            'trace_path = "bad.jsonl"\ntrace_format = "mooncake"\n'))
    assert err.value.path == "trace_path" and f"{bad}: line 2: not JSON" in err.value.message


def test_the_offline_driver_replays_a_trace_and_its_prefix_sharing():
    dep = deployment()
    shared = run_offline(dep, load_workload(WORKLOADS / "trace-mooncake-sample.toml"))
    assert shared["requests"]["completed"] == shared["requests"]["total"] == 300
    assert shared["prefix_cache"]["hit_rate"] > 0.5  # system prompts and earlier turns
    trace = load_trace(TRACES / "mooncake-sample.jsonl", "mooncake")
    assert shared["throughput_metrics"]["output_tokens_per_sec"] * shared["simulation"]["simulated_seconds"] \
        == pytest.approx(sum(trace.outputs))

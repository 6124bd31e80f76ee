"""Every file the command line reads, given something that is not what it expects
(deep nesting, a huge field, a string for a number, an endless device, a concurrency no
simulation can run, a corrupt Parquet table): one error line naming the file, exit
status 2, no traceback, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSV_HEADER = "concurrency,input_len,output_len,ttft_ms,tpot_ms\n"
DEEP = "[" * 200_000 + "]" * 200_000
HUGE_INT = "1" * 5000  # more digits than Python converts (4,300)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "inference_lab", "--log-level", "WARNING",
                           *args], capture_output=True, text=True, timeout=120)


def calibrate(tmp: Path, name: str, text: str | None) -> tuple[list[str], str]:
    path = Path("/dev/zero") if text is None else tmp / name
    if text is not None:
        path.write_text(text)
    return ["calibrate", str(path), "--model", "llama-3.1-8b", "--hardware", "h100",
            "--name", "x", "-o", str(tmp / "out")], str(path)


def trace_sim(tmp: Path, line: str) -> tuple[list[str], str]:
    trace = tmp / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5}\n' + line + "\n")
    workload = tmp / "workload.toml"
    workload.write_text(f'[workload]\narrival_pattern = "trace"\ntrace_path = "{trace}"\n'
                        'trace_format = "mooncake"\n')
    return (["sim", "-c", str(ROOT / "configs" / "llama-3.1-8b.toml"), "--hardware", "h100",
             "-w", str(workload), "-q"], f"{trace}: line 2")


def dataset_sim(tmp: Path, line: str) -> tuple[list[str], str]:
    data = tmp / "batch.jsonl"
    data.write_text(line + "\n")
    workload = tmp / "workload.toml"
    workload.write_text('[workload]\narrival_pattern = "poisson"\narrival_rate = 5.0\n'
                        f'num_requests = 4\ndataset_path = "{data}"\n'
                        'input_len_dist = { type = "fixed", value = 8 }\n'
                        'output_len_dist = { type = "fixed", value = 8 }\n')
    return (["sim", "-c", str(ROOT / "configs" / "llama-3.1-8b.toml"), "--hardware", "h100",
             "-w", str(workload), "-q"], f"{data}: line 1")


def compare(tmp: Path, summary: str, requests: bytes) -> tuple[list[str], str]:
    run = tmp / "run"
    run.mkdir()
    (run / "summary.json").write_text(summary)
    (run / "requests.parquet").write_bytes(requests)
    named = run / ("summary.json" if summary != "{}" else "requests.parquet")
    return ["experiment", "compare", str(run), "--out", str(tmp / "cmp")], str(named)


INFERENCE_PERF = {"load_summary": {"concurrency": 4},
                  "successes": {"count": 10, "prompt_tokens": {"mean": 100},
                                "output_tokens": {"mean": 50},
                                "latency": {"time_to_first_token": {"mean": "soon"},
                                            "time_per_output_token": {"mean": 0.01}}}}
AIPERF = {"input_config": {"concurrency": 4}, "time_to_first_token": {"unit": "ms", "avg": "x"},
          "inter_token_latency": {"unit": "ms", "avg": 5}, "input_sequence_length": {"avg": 100},
          "output_sequence_length": {"avg": 50}}

CASES = {
    "calibrate: deeply nested JSON": lambda t: calibrate(t, "deep.json", DEEP),
    "calibrate: a CSV field over csv's limit": lambda t: calibrate(
        t, "wide.csv", CSV_HEADER + "1," + "9" * 200_000 + ",50,10,5\n"),
    "calibrate: a string for a number (inference-perf)": lambda t: calibrate(
        t, "ip.json", json.dumps(INFERENCE_PERF)),
    "calibrate: a string for a number (aiperf)": lambda t: calibrate(
        t, "aiperf.json", json.dumps(AIPERF)),
    "calibrate: an endless device": lambda t: calibrate(t, "", None),
    "calibrate: a concurrency of 1e9": lambda t: calibrate(
        t, "many.csv", CSV_HEADER + "1000000000,100,50,10,5\n"),
    "calibrate: an integer of 5,000 digits": lambda t: calibrate(
        t, "digits.json", '{"mean_ttft_ms": ' + HUGE_INT + "}"),
    "sim: a trace line nested deeply": lambda t: trace_sim(t, DEEP),
    "sim: a trace line with an integer of 5,000 digits": lambda t: trace_sim(
        t, '{"timestamp": 1, "input_length": ' + HUGE_INT + ', "output_length": 5}'),
    "sim: a dataset line with an integer of 5,000 digits": lambda t: dataset_sim(
        t, '{"body": {"prompt": "hi", "max_tokens": ' + HUGE_INT + "}}"),
    "sim: a dataset line nested deeply": lambda t: dataset_sim(t, DEEP),
    "experiment compare: a corrupt requests.parquet": lambda t: compare(
        t, "{}", b"PAR1 not really parquet PAR1"),
    "experiment compare: a corrupt summary.json": lambda t: compare(t, '{"window_s": ', b""),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_file_is_one_line_naming_it_and_exit_status_2(tmp_path, case):
    args, named = CASES[case](tmp_path)
    out = cli(*args)
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-2000:]
    assert named in lines[0] and len(lines[0]) < 400, lines[0]

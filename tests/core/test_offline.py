"""The offline driver and `inference-lab sim`: the reference page's numbers, the JSON
summary's shape, and clear errors for bad input."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from inference_lab.engine.sim.config import load_deployment
from inference_lab.engine.drivers.offline import run_offline
from inference_lab.common.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "gpt-oss-20b.toml"
CLOSED_24 = ROOT / "configs" / "workloads" / "chat-closed-loop-24.toml"


def simulate(max_num_seqs=None, max_waiting=None):
    deployment = load_deployment(CONFIG, "b200", max_waiting)
    if max_num_seqs is not None:
        deployment.scheduler = dataclasses.replace(deployment.scheduler, max_num_seqs=max_num_seqs)
    return run_offline(deployment, load_workload(CLOSED_24))


def test_24_closed_loop_users_see_about_293_ms_per_200_token_reply():
    summary = simulate()
    assert summary["requests"] == {"completed": 500, "total": 500,
                                   "rejected": 0, "rejected_queue_saturated": 0,
                                   "rejected_invalid": 0}
    assert summary["latency_metrics"]["e2e_ms"]["mean"] == pytest.approx(293, rel=0.01)


def test_with_max_num_seqs_8_the_same_load_sees_about_646_ms_and_lower_throughput():
    wide, narrow = simulate(), simulate(max_num_seqs=8)
    assert narrow["latency_metrics"]["e2e_ms"]["mean"] == pytest.approx(646, rel=0.01)
    ratio = (wide["throughput_metrics"]["output_tokens_per_sec"]
             / narrow["throughput_metrics"]["output_tokens_per_sec"])
    assert ratio == pytest.approx(2.2, abs=0.15)


def test_max_waiting_refuses_closed_loop_users_beyond_the_bound():
    summary = simulate(max_num_seqs=8, max_waiting=4)
    requests = summary["requests"]
    assert requests["rejected_queue_saturated"] > 0
    assert requests["completed"] + requests["rejected_queue_saturated"] == requests["total"]


def test_sim_command_writes_the_summary_json(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "inference_lab", "sim", "--config", str(CONFIG),
         "--hardware", "b200", "--workload", str(CLOSED_24), "-o", str(out)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "end to end" in proc.stdout and "TTFT" in proc.stdout
    summary = json.loads(out.read_text())
    for metric in ("ttft_ms", "e2e_ms", "per_token_ms"):
        assert set(summary["latency_metrics"][metric]) == {"min", "mean", "p50", "p90", "p99"}
    assert set(summary["throughput_metrics"]) == {
        "input_tokens_per_sec", "output_tokens_per_sec", "requests_per_sec"}
    assert summary["requests"]["completed"] == summary["requests"]["total"] == 500
    assert summary["preemptions"]["total"] == 0


@pytest.mark.parametrize("args, message", [
    (["--config", "missing.toml"], "no such file"),
    (["--hardware", "tpu9"], "unknown hardware"),
    (["--max-num-seqs", "0"], "max_num_seqs must be an integer >= 1"),
])
def test_sim_command_reports_bad_input_in_one_line_without_a_traceback(args, message):
    base = {"--config": str(CONFIG), "--hardware": "b200", "--workload": str(CLOSED_24)}
    argv = list(args)
    for flag, value in base.items():
        if flag not in argv:
            argv += [flag, value]
    proc = subprocess.run([sys.executable, "-P", "-m", "inference_lab", "sim", *argv],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr.lower()
    assert "Traceback" not in proc.stderr
